"""``basecap compare``: a new architecture (a mixer defined in a file of its own) joins a published study at a tiny
size: only its runs train, the reference's are the study's records, and its row reads as the scorecard reads a claim;
a study whose records do not fit its design or this machine's corpus is refused before anything trains."""

import json
import shutil

import pytest

from basecap.compare import CompareRequest, compare, load_mixer_files
from basecap.compare.measure import curve_kv_pairs
from basecap.compare.study import find_design, look_seeds, rate_label
from basecap.config_base import ConfigError
from basecap.mixers import register_mixer

MIXER_FILE = '''
"""A causal running mean (a test architecture): y_t = o(mean of v(x_1..t)); its state is the sum and the count."""
from typing import Literal

import torch
from torch import nn

from basecap.mixers import Mixer, MixerConfig, register_mixer


class RunningMeanConfig(MixerConfig):
    name: Literal["running_mean"] = "running_mean"
    impl: Literal["ref"] = "ref"


class RunningMean(Mixer):
    config_class = RunningMeanConfig
    out_projections = ("o_proj",)
    match_field = None
    compiles = True

    def __init__(self, d_model, cfg, layer_idx=0, max_seq_len=2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, state=None):
        v = self.v_proj(x)
        s0 = torch.zeros_like(v[:, :1]) if state is None else state["sum"][:, None]
        n0 = 0 if state is None else state["n"]
        c = s0 + v.cumsum(1)
        n = n0 + torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]
        return self.o_proj(c / n), (None if state is None else {"sum": c[:, -1], "n": n0 + x.shape[1]})

    def init_state(self, batch, device="cpu", dtype=torch.float32):
        return {"sum": torch.zeros(batch, self.d_model, device=device), "n": 0}

    def state_size(self, seq_len):
        return self.d_model * 4


register_mixer(RunningMean)
'''


def _write_root(root, recipe):
    """A project root with a two-rate reference study, its claims entry (looks at 2 and 3 seeds) and an MQAR protocol."""
    paper = root / "experiments" / "paper"
    paper.mkdir(parents=True)
    (paper / "study.toml").write_text(f"""
name = "tinystudy"
seeds = [0, 1, 2]
reference = "tpp"
size = "tiny"
[data]
recipe = "{recipe}"
train_weights = {{ prose = 1.0 }}
[[runs]]
name = "tpp"
model.mixer = {{ name = "attention", head_dim = 8 }}
train.lr = 2e-3
[[runs]]
name = "tpp_lr4e-3"
model.mixer = {{ name = "attention", head_dim = 8 }}
train.lr = 4e-3
[sizes.tiny]
data = {{ seq_len = 32 }}
model = {{ d_model = 32, n_layers = 2, max_seq_len = 32 }}
train = {{ steps = 8, batch_size = 4, warmup_steps = 1, checkpoint_every = 4, progress = false }}
eval = {{ every = 2, max_tokens = 1024, batch_size = 4 }}
""")
    (paper / "claims.toml").write_text("""
margin = 0.05
margin_reason = "a test"
domains = ["code"]
claims = []
[studies.tinystudy]
experiment = "study.toml"
size = "tiny"
looks = [2, 3]
""")
    (paper / "principle.toml").write_text("""
[principle]
mqar = { d_model = 16, n_layers = 1, seq_len = 16, train_kv_pairs = [1, 2], score_kv_pairs = 2, steps = 3, lr = 1e-3, seeds = [0] }
""")
    (root / "running_mean.py").write_text(MIXER_FILE)


@pytest.fixture(scope="module")
def published(tmp_path_factory, tiny_recipe_path):
    """The study trained (8 steps, 3 seeds, Transformer++ at two rates) and published as results/tinystudy."""
    from basecap.eval.final import evaluate_run
    from basecap.experiment import train_experiment
    from basecap.report import report

    root = tmp_path_factory.mktemp("project")
    _write_root(root, tiny_recipe_path)
    train_experiment(root / "experiments/paper/study.toml", [f"out_dir={root / 'runs' / 'tinystudy'}"], log=lambda *_: None)
    dirs = sorted(p for p in (root / "runs" / "tinystudy").iterdir() if (p / "done.json").exists())
    for d in dirs:
        evaluate_run(d, log=lambda *_: None)
    report(dirs, root / "results" / "tinystudy", reference="tpp", archive=True)
    return root


def _compare(root, mixer_file=None, **kw):
    request = CompareRequest(
        study=root / "results" / "tinystudy",
        mixer_files=[mixer_file or root / "running_mean.py"],
        root=root,
        work=root / "runs" / "cmp",
        speed_lengths=[32],
        speed_reps=1,
        **kw,
    )
    return compare(request, log=lambda *_: None)


def test_a_file_mixer_joins_a_published_study(published):
    root = published
    row = _compare(root)
    out = root / "results" / "compare-running_mean-tinystudy"
    assert json.loads((out / "compare.json").read_text()) == json.loads(json.dumps(row))
    # only the new architecture trained: the reference's runs are the study's records, copied
    assert json.loads((out / "runs" / "tpp-s0" / "run.json").read_text())["reused_from"]["run_dir"].endswith("tinystudy/runs/tpp-s0")
    assert (root / "runs" / "cmp" / "running_mean@lr=0.002-s100").is_dir()  # tuned over the reference's two rates, seed 100
    assert row["grid"] == [0.002, 0.004] and row["lr"] in (0.002, 0.004)
    assert row["seeds"] == [0, 1, 2] and row["looks"] == [2, 1]
    arms = {a["arm"]: a for a in row["arms"]}
    assert arms["A"]["run"] == "running_mean_lr2e-3" and arms["A"]["reference"] == "tpp"  # the scorecard's predictions read this name
    # what it trained: 2 tuning runs and the seeds (3, or 6 with arm A at another rate), never the copies
    assert row["trained"]["runs"] == 2 + (6 if row["lr"] == 0.004 else 3) and row["trained"]["seconds"] > 0
    if row["lr"] == 0.004:
        assert arms["B"]["reference"] == "tpp_lr4e-3" and arms["B"]["run"] == "running_mean"
    else:
        assert "B" not in arms and "arms A and B are the tuned comparison" in row["arm_b_note"]
    # arm A's per-seed gaps are the report's own (summary.json, built by report.stats)
    summary = json.loads((out / "summary.json").read_text())
    comp = next(c for c in summary["comparisons"] if c["run"] == "running_mean_lr2e-3" and c["domain"] == "code")
    assert arms["A"]["values"] == pytest.approx(comp["per_seed"]) and arms["A"]["seeds"] == comp["seeds"]
    assert arms["A"]["reading"].startswith("planned look 2 of 2 (3 seeds)")
    assert row["overall"]["verdict"] in ("keeps", "degrades", "undecided")
    # the tiny study has no band (the old design): no specification can be read, and the row says so
    assert all(s["verdict"] == "n/a" for a in row["arms"] if a["n"] >= 2 for s in a["specs"])
    assert row["robustness"]["robust"] is False and row["robustness"]["missing"]
    assert row["mqar"]["values"] and row["mqar"]["shortened"] is False and row["mqar"]["score_kv_pairs"] == 2
    assert row["state_bytes"] == 2 * 32 * 4 and row["state_grows"] is False  # two layers of d_model floats
    assert row["cost"] == "O(T) train, O(1) per decoded token" and set(row["speed"]) == {"32"}
    assert row["mixer_files"][0]["sha256"]
    # the same command again resumes: everything is there, nothing trains, the same row
    again = _compare(root)
    assert again["arms"] == row["arms"] and again["mqar"] == row["mqar"]


def test_a_study_with_other_records_is_refused(published, tmp_path):
    mixer_file = published / "running_mean.py"  # the same file: a mixer is registered once per process
    load_mixer_files([mixer_file])
    root = tmp_path / "p"
    shutil.copytree(published / "experiments", root / "experiments")
    runs = root / "results" / "tinystudy" / "runs"
    shutil.copytree(published / "results" / "tinystudy", runs.parent)
    info = json.loads((runs / "tpp-s0" / "run.json").read_text())
    info["config"]["train"]["progress"] = True  # a display switch: the same training, still found (s1 is the first refused)
    (runs / "tpp-s0" / "run.json").write_text(json.dumps(info))
    info = json.loads((runs / "tpp-s1" / "run.json").read_text())
    info["corpus"]["dir"] = "tiny-0000000000000000"
    (runs / "tpp-s1" / "run.json").write_text(json.dumps(info))
    with pytest.raises(ConfigError, match=r"trained on corpus tiny-0000000000000000, and recipe .* builds corpus tiny-"):
        _compare(root, mixer_file)
    shutil.rmtree(runs / "tpp-s1")
    info = json.loads((runs / "tpp-s2" / "run.json").read_text())
    info["config"]["train"]["warmup_steps"] = 2
    (runs / "tpp-s2" / "run.json").write_text(json.dumps(info))
    with pytest.raises(ConfigError, match=r"tpp-s2 does not match the study's design .*train.warmup_steps: 2 in the record, 1 in the design"):
        _compare(root, mixer_file)
    assert not (root / "runs").exists()  # refused before anything trained


def test_the_study_is_read_in_the_order_of_its_plan(published, tmp_path):
    design = find_design(published / "results" / "tinystudy", root=published)
    assert (design.reference, design.rate, design.rate_runs, design.grid) == ("tpp", 0.002, {0.004: "tpp_lr4e-3"}, [0.002, 0.004])
    assert look_seeds(design) == [[0, 1], [2]] and look_seeds(design, 1) == [[0, 1]]
    with pytest.raises(ConfigError, match="--until-look: the study is read at 2 look"):
        look_seeds(design, 3)
    with pytest.raises(ConfigError, match="not a study of .*give its experiment file with --experiment"):
        other = tmp_path / "claims.toml"
        other.write_text('margin = 0.05\nmargin_reason = "a test"\ndomains = ["code"]\nclaims = []\n[studies]\n')
        find_design(published / "results" / "tinystudy", root=published, claims_path=other)


def test_names_and_grids():
    assert [rate_label(x) for x in (0.002, 0.004, 0.0025, 1e-3, 0.01)] == ["2e-3", "4e-3", "2.5e-3", "1e-3", "1e-2"]
    assert curve_kv_pairs(8) == (1, 2, 4, 8, 16) and curve_kv_pairs(2) == (1, 2, 4)


def test_register_mixer_refuses_builtin_names_and_non_mixers():
    from basecap.mixers.attention import Attention

    with pytest.raises(ConfigError, match="'attention' is a built-in mixer"):
        register_mixer(Attention)
    with pytest.raises(ConfigError, match="expected a subclass of basecap.mixers.Mixer"):
        register_mixer(dict)  # type: ignore[arg-type]


def test_a_claims_file_it_cannot_read_is_named_with_the_key(tmp_path):
    """A claims file with an unknown key: the project's one-line-per-key error, not pydantic's own text."""
    from basecap.compare.study import read_claims

    p = tmp_path / "claims.toml"
    p.write_text('margin = 0.05\nmargin_reason = "m"\ndomains = ["docs"]\nstudies = {}\nclaims = []\nscale_steps = [{claim = "x", study = "y", why = "z", bogus = 1}]\n')
    with pytest.raises(ConfigError, match=r"claims\.toml: invalid configuration:\n  scale_steps\.0\.bogus: unknown key") as e:
        read_claims(p)
    assert "errors.pydantic.dev" not in str(e.value)


def test_compile_reaches_the_new_architecture_only(published):
    from basecap.compare import _comparison, _prepare

    load_mixer_files([published / "running_mean.py"])
    request = CompareRequest(study=published / "results" / "tinystudy", mixer="running_mean", root=published, work=published / "runs" / "cmp-c", compile=True)
    setup = _prepare(request, lambda *_: None)
    exp = _comparison(setup, 0.004, "tpp_lr4e-3")
    compiled = {rc.name: rc.train.compile for rc in exp.resolve(exp.run_configs())}
    assert compiled == {"tpp": False, "tpp_lr4e-3": False, "running_mean": True, "running_mean_lr2e-3": True}
    assert setup.arch("running_mean", None) == {"name": "running_mean", "model": {"mixer": setup.table}, "train": {"compile": True}}
    assert not (published / "runs" / "cmp-c").exists()  # nothing trained


def test_the_row_says_which_specification_breaks_its_verdict():
    """The Forgetting Transformer's published comparison (results/compare-forgetting_attn-architectures_rate_arms):
    it degrades in the study's own reading and at the lowest and half-of-training levels, but with every target instead
    of the seen ones the interval reaches 0: not robust, and the row names that choice."""
    from pathlib import Path

    from basecap.compare.row import arm_reading, robustness, spec_readings
    from basecap.scorecard.compute import load_study

    root = Path(__file__).resolve().parents[1]
    design = find_design(root / "results" / "architectures_rate_arms", root=root)
    study = load_study(root / "results" / "compare-forgetting_attn-architectures_rate_arms")
    arm = arm_reading(design, study, "tuned", "forgetting_attn", design.reference, 2e-3)
    arm["specs"] = spec_readings(design, study, arm)
    assert arm["verdict"] == "degrades"
    by = {s["spec"]: s for s in arm["specs"]}
    assert [by[k]["verdict"] for k in ("targets: all", "level: lowest", "level: half")] == ["undecided", "degrades", "degrades"]
    assert by["targets: all"]["band"] == [4.0, 4.2] and by["targets: all"]["ci95"][0] < 0.001
    assert by["level: lowest"]["band"][0] < 4.0  # read lower than the study's band
    assert robustness([arm], "degrades") == {"robust": False, "breaks": ["arm tuned: targets: all (undecided)"], "missing": []}
