"""Sweeps in experiment files and tune-then-compare: expansion and naming, validation before compute,
the choice (lowest in-domain validation loss; OOD never read), tuning.json, and a tiny study end to end."""

import json
import math

import pytest

from basecap.config import load_experiment
from basecap.config_base import key_labels, value_label
from basecap.config_base import ConfigError
from basecap.sweep import TUNING_FILE, check_trained_at_choice, choose, tune


def write_exp(tmp_path, recipe="default", extra="", runs=None, name="exp.toml"):
    runs = runs or """
[[runs]]
name = "tpp"
model.mixer = {name = "attention", head_dim = 8}
[[runs]]
name = "abs"
model.mixer = {name = "attention", head_dim = 8, position = "absolute"}
"""
    p = tmp_path / name
    p.write_text(f"""
name = "sw"
out_dir = "{tmp_path / 'runs'}"
reference = "tpp"
seeds = [0]
[data]
recipe = "{recipe}"
train_weights = {{prose = 1.0}}
seq_len = 32
[model]
d_model = 32
n_layers = 1
max_seq_len = 32
[train]
steps = 6
batch_size = 4
warmup_steps = 1
checkpoint_every = 6
progress = false
[eval]
every = 3
max_tokens = 1024
batch_size = 4
{runs}
{extra}""")
    return p


SWEEP = """
[sweep]
train.lr = [1e-3, 2e-3]
model.mixer.window = [0, 8]
"""
TUNE = """
[sweep]
train.lr = [1e-3, 2e-3, 4e-3]
[tune]
keys = ["train.lr"]
seeds = [100]
metric = "in_domain_loss"
"""


def test_expansion_names_runs_after_their_values(tmp_path):
    exp = load_experiment(write_exp(tmp_path, extra=SWEEP, name="a.toml"), ["seeds=[0, 1]"])
    ids = [rc.run_id for rc in exp.run_configs()]
    assert len(ids) == 2 * 4 * 2 and len(set(ids)) == len(ids)
    assert ids[:4] == ["tpp@lr=0.001,window=0-s0", "tpp@lr=0.001,window=8-s0", "tpp@lr=0.002,window=0-s0", "tpp@lr=0.002,window=8-s0"]
    assert ids[8].endswith("-s1")  # seed-major, as without a sweep
    rc = {r.run_id: r for r in exp.run_configs()}["abs@lr=0.002,window=8-s1"]
    assert rc.train.lr == 0.002 and rc.model.mixer.window == 8 and rc.model.mixer.position == "absolute"
    # quoted keys, dotted keys and --set spell the same sweep
    quoted = load_experiment(write_exp(tmp_path, extra='[sweep]\n"train.lr" = [1e-3, 2e-3]\n"model.mixer.window" = [0, 8]\n', name="b.toml"))
    assert quoted.sweep == exp.sweep
    over = load_experiment(write_exp(tmp_path, extra=SWEEP, name="c.toml"), ["sweep.train.lr=[1e-6]"])
    assert [rc.name for rc in over.run_configs()][:2] == ["tpp@lr=1e-06,window=0", "tpp@lr=1e-06,window=8"]
    assert key_labels(["train.lr", "model.mixer.window", "a.b.lr"]) == {"train.lr": "train.lr", "model.mixer.window": "window", "a.b.lr": "b.lr"}
    assert [value_label("k", v) for v in (True, 3, 0.003, 1e-6, "swiglu")] == ["true", "3", "0.003", "1e-06", "swiglu"]


def test_sweep_errors_are_raised_before_any_compute(tmp_path, monkeypatch):
    import basecap.model

    def no_models(*a, **k):
        raise AssertionError("validation built a model")

    monkeypatch.setattr(basecap.model.LM, "__init__", no_models)
    p = write_exp(tmp_path, extra=TUNE)
    cases = {
        "sweep.train.lrr=[1, 2]": r"sweep: 'train.lrr' matches no config field of runs\[0\] \(tpp\)",
        "sweep.model.mixer.d_state=[4]": r"'model.mixer.d_state' matches no config field",
        'sweep.train.lr=["fast"]': r"runs\[0\] \(tpp@lr=fast\): train\.lr: Input should be a valid number",
        "sweep.train.steps=[0]": r"train\.steps: Input should be greater than 0",
        "sweep.seeds=[1]": r"sweep: 'seeds' is not a run's config key",
        "sweep.train.lr=[]": r"sweep.train.lr: expected a non-empty list",
        "sweep.train.lr=[1e-3, 1e-3]": r"sweep.train.lr: repeated values",
        "sweep.train.lr=[[1, 2]]": r"cannot name a run",
        'tune.keys=["train.warmup_steps"]': r"tune.keys: \['train.warmup_steps'\] not swept",
        "tune.seeds=[0]": r"tune.seeds and seeds share \[0\]",
        'tune.metric="code_loss"': r"only 'in_domain_loss'.*OOD domains are the study's test set",
        'eval.split="test"': r"chosen on the validation split only",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_experiment(p, [override])
    with pytest.raises(ConfigError, match="run names may use"):
        load_experiment(write_exp(tmp_path, runs='[[runs]]\nname = "a@lr=1"\n', name="bad.toml"))


def test_tune_experiment_phases(tmp_path):
    exp = load_experiment(write_exp(tmp_path, extra=TUNE + "\n[sweep.model.mixer]\nwindow = [0, 8]\n"), ["seeds=[0, 1]"])
    assert {rc.seed for rc in exp.run_configs()} == {100}  # what runs first: the tuning runs
    grid = exp.tuning_grid()
    assert list(grid) == ["tpp@window=0", "tpp@window=8", "abs@window=0", "abs@window=8"]  # compared: the swept keys it does not tune
    assert grid["tpp@window=8"][1] == ({"train.lr": 0.002}, "tpp@lr=0.002,window=8")
    chosen = {name: points[2][0] for name, points in grid.items()}
    compared = exp.comparison_configs(chosen)
    assert [rc.run_id for rc in compared[:2]] == ["tpp@window=0-s0", "tpp@window=8-s0"] and len(compared) == 8
    assert {rc.train.lr for rc in compared} == {0.004} and {rc.seed for rc in compared} == {0, 1}
    with pytest.raises(ConfigError, match="not runs of the tuning grid"):
        exp.comparison_configs({"tpp@window=0": {}})


def fake_record(in_domain: float, ood: float, split="validation") -> dict:
    return {"kind": "eval", "split": split, "in_domain_loss": in_domain,
            "domains": {"prose": {"loss": in_domain, "bpb": 1.0}, "code": {"loss": ood, "bpb": 2.0}}}


class SealedRecord(dict):
    """An evaluation record whose per-domain losses (the OOD domains among them) must not be read."""

    def __getitem__(self, key):
        if key == "domains":
            raise AssertionError("the chooser read the per-domain losses")
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key == "domains":
            raise AssertionError("the chooser read the per-domain losses")
        return super().get(key, default)


def test_choice_is_the_lowest_in_domain_validation_loss_and_never_reads_ood(tmp_path):
    exp = load_experiment(write_exp(tmp_path, extra=TUNE))
    # in-domain favours lr=0.002 for tpp and 0.004 for abs; OOD favours 0.001 for both, by far
    table = {("tpp", 0.001): (3.0, 1.0), ("tpp", 0.002): (2.5, 9.0), ("tpp", 0.004): (2.7, 9.0),
             ("abs", 0.001): (3.0, 1.0), ("abs", 0.002): (2.9, 9.0), ("abs", 0.004): (2.8, 9.0)}
    seen = []

    def train_fn(rc, run_dir):
        seen.append((rc.run_id, run_dir.name))
        return SealedRecord(fake_record(*table[(rc.name.split("@")[0], rc.train.lr)]))

    chosen = tune(exp, exp.resolve(), tmp_path / "out", train_fn, log=lambda *_: None)
    assert chosen == {"tpp": {"train.lr": 0.002}, "abs": {"train.lr": 0.004}}
    assert all(seed_id == folder and seed_id.endswith("-s100") for seed_id, folder in seen) and len(seen) == 6
    stored = json.loads((tmp_path / "out" / TUNING_FILE).read_text())
    assert stored["split"] == "validation" and stored["metric"] == "in_domain_loss" and stored["seeds"] == [100]
    tpp = stored["runs"]["tpp"]
    assert [t["values"]["train.lr"] for t in tpp["tried"]] == [0.001, 0.002, 0.004]
    assert [t["losses"] for t in tpp["tried"]] == [{"100": 3.0}, {"100": 2.5}, {"100": 2.7}]
    assert tpp["chosen"] == {"train.lr": 0.002} and tpp["chosen_name"] == "tpp@lr=0.002" and tpp["tried"][1]["mean"] == 2.5
    # a tuning run evaluated on the test split cannot choose
    with pytest.raises(ConfigError, match="chosen on validation only"):
        tune(exp, exp.resolve(), tmp_path / "out2", lambda rc, d: fake_record(1.0, 1.0, split="test"), log=lambda *_: None)


def test_ties_and_diverged_runs():
    assert choose([3.0, 2.0, 2.0]) == 1  # a tie goes to the value listed first
    assert choose([math.nan, 4.0, None]) == 1  # a diverged run never wins
    with pytest.raises(ConfigError, match="diverged"):
        choose([math.nan, math.inf])


def test_two_processes_tuning_at_once_keep_both_choices(tmp_path):
    """Two processes share a study (--run tpp, --run abs): each reads tuning.json before its long training and
    writes after it; the second writer keeps the first one's choice instead of overwriting it."""
    exp = load_experiment(write_exp(tmp_path, extra=TUNE))
    out = tmp_path / "out"

    def train_abs_while_tpp_trains(rc, run_dir):
        if rc.run_id.startswith("tpp@lr=0.001") and not (out / TUNING_FILE).exists():
            tune(exp, exp.resolve(), out, lambda r, d: fake_record(r.train.lr * 100, 0.0), only=["abs"], log=lambda *_: None)
        return fake_record(rc.train.lr * 100, 0.0)

    tune(exp, exp.resolve(), out, train_abs_while_tpp_trains, only=["tpp"], log=lambda *_: None)
    assert set(json.loads((out / TUNING_FILE).read_text())["runs"]) == {"tpp", "abs"}


def test_tuning_json_is_reused_recomputed_and_written_atomically(tmp_path, monkeypatch):
    p = write_exp(tmp_path, extra=TUNE)
    exp = load_experiment(p)
    calls = []

    def train_fn(rc, run_dir):
        calls.append(rc.run_id)
        return fake_record(rc.train.lr * 100, 0.0)  # the smallest lr wins

    out = tmp_path / "out"
    assert tune(exp, exp.resolve(), out, train_fn, log=lambda *_: None)["tpp"] == {"train.lr": 0.001}
    assert len(calls) == 6
    before = (out / TUNING_FILE).read_text()
    assert tune(exp, exp.resolve(), out, train_fn, log=lambda *_: None)["abs"] == {"train.lr": 0.001}
    assert len(calls) == 6  # same grid: the stored choice stands, nothing trains
    # a changed grid recomputes the choice, only for the runs it touches: a write that fails leaves the old file whole
    import basecap.atomic

    def failing_replace(src, dst):
        raise OSError("disk full")

    grown = load_experiment(p, ["sweep.train.lr=[1e-4, 1e-3, 2e-3, 4e-3]"])
    monkeypatch.setattr(basecap.atomic.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        tune(grown, grown.resolve(), out, train_fn, log=lambda *_: None)
    assert (out / TUNING_FILE).read_text() == before and sorted(f.name for f in out.iterdir()) == [TUNING_FILE]
    monkeypatch.undo()
    calls.clear()
    only = tune(grown, grown.resolve(), out, train_fn, only=["tpp"], log=lambda *_: None)
    assert only == {"tpp": {"train.lr": 0.0001}} and len(calls) == 4 and all(c.startswith("tpp@") for c in calls)
    stored = json.loads((out / TUNING_FILE).read_text())["runs"]
    assert len(stored["tpp"]["tried"]) == 4 and len(stored["abs"]["tried"]) == 3  # abs: its old entry, recomputed when it runs


def test_a_comparison_run_trained_at_another_value_is_refused(tmp_path):
    exp = load_experiment(write_exp(tmp_path, extra=TUNE))
    compared = exp.resolve(exp.comparison_configs({"tpp": {"train.lr": 0.002}, "abs": {"train.lr": 0.002}}))
    out = tmp_path / "out"
    (out / "tpp-s0").mkdir(parents=True)
    old = json.loads(compared[0].model_copy(update={"train": compared[0].train.model_copy(update={"lr": 0.001})}).model_dump_json())
    (out / "tpp-s0" / "run.json").write_text(json.dumps({"config": old}))
    with pytest.raises(ConfigError, match=r"tpp-s0: trained with train.lr=0.001 but the tuning now chooses train.lr=0.002"):
        check_trained_at_choice(out, compared, ["train.lr"])
    check_trained_at_choice(out, compared[1:], ["train.lr"])  # abs-s0: not trained yet


def test_tune_then_compare_end_to_end(tiny_recipe_path, tmp_path):
    """Tiny real runs: lr=1e-6 barely moves in 6 steps, lr=1e-2 clearly does; every run picks 1e-2 on the
    tuning seed, then the comparison seed runs at it under the plain run names, and the report shows the sweep."""
    from basecap.experiment import run_experiment, train_experiment

    extra = TUNE.replace("[1e-3, 2e-3, 4e-3]", "[1e-6, 1e-2]")
    path = write_exp(tmp_path, tiny_recipe_path, extra=extra)
    rep = run_experiment(path, log=lambda *_: None)
    runs = tmp_path / "runs"
    tuning = json.loads((runs / TUNING_FILE).read_text())["runs"]
    assert {n: e["chosen"] for n, e in tuning.items()} == {"tpp": {"train.lr": 0.01}, "abs": {"train.lr": 0.01}}
    for name in ("tpp", "abs"):
        losses = [t["mean"] for t in tuning[name]["tried"]]
        assert losses[1] < losses[0] - 0.1
        info = json.loads((runs / f"{name}-s0" / "run.json").read_text())
        assert info["config"]["train"]["lr"] == 0.01 and info["config"]["name"] == name
        assert (runs / f"{name}@lr=1e-06-s100" / "done.json").exists() and not (runs / f"{name}@lr=1e-06-s100" / "eval.json").exists()
    assert not list(runs.glob("*@*-s0")) and not list(runs.glob("tpp-s100"))  # the tuning seed is not compared
    text = rep.read_text()
    assert text.index("## Tuning: train.lr") < text.index("## Final evaluation")
    assert "| tpp |" in text and "**" in text and (rep.parent / "sweep.png").is_file()
    assert "tpp@" not in text.split("## Final evaluation")[1]  # the comparison: plain names only
    # the gap at each fixed value against the reference at the same value, and at the chosen values: both chose
    # 1e-2, so the "chosen" gap is the gap at the fixed 1e-2
    from basecap.report.sweep import fixed_vs_tuned

    assert "### Does a fixed value change the verdict? (tuning seeds only)" in text
    rows = fixed_vs_tuned(json.loads((runs / TUNING_FILE).read_text()), runs, "tpp")
    assert [(r["run"], r["domain"]) for r in rows] == [("abs", "code")]
    assert set(rows[0]["fixed"]) == {"train.lr=1e-06", "train.lr=0.01"} and rows[0]["tuned"] == rows[0]["fixed"]["train.lr=0.01"]
    cell = lambda v: "-" if v is None else f"{v:+.3f}"  # noqa: E731 - None: the two curves do not overlap
    assert rows[0]["tuned"] is not None
    assert f"| abs | code | {cell(rows[0]['fixed']['train.lr=1e-06'])} | {cell(rows[0]['tuned'])} | {cell(rows[0]['tuned'])} |" in text
    # basecap report --tuning: the same tuning section from the command line; a missing file is a clear error
    from basecap.cli import main

    rep2 = tmp_path / "rep2"
    assert main(["report", str(runs / "tpp-s0"), str(runs / "abs-s0"), "--out", str(rep2), "--tuning", str(runs / TUNING_FILE)]) == 0
    assert "### Does a fixed value change the verdict?" in (rep2 / "report.md").read_text() and (rep2 / "sweep.png").is_file()
    assert main(["report", str(runs / "tpp-s0"), "--tuning", str(tmp_path / "nope.json")]) == 2
    # basecap train: the same order; the stored choice stands, finished runs are not trained again
    trained = train_experiment(path, only=["abs"], log=lambda *_: None)
    assert [(rc.run_id, rc.train.lr) for rc, _ in trained] == [("abs-s0", 0.01)]
    with pytest.raises(ConfigError, match=r"unknown run\(s\) \['nope'\]"):
        train_experiment(path, only=["nope"], log=lambda *_: None)


def test_fixed_value_table_leaves_out_rows_without_numbers():
    """Tuning runs whose records were not kept give rows of dashes only: they are left out, and so is the table
    when no row has a number."""
    from basecap.report.sweep import fixed_vs_tuned_markdown

    empty = {"run": "m1", "domain": "code", "fixed": {"lr=1": None, "lr=2": None}, "tuned": None}
    some = {"run": "m2", "domain": "code", "fixed": {"lr=1": 0.25, "lr=2": None}, "tuned": None}
    assert fixed_vs_tuned_markdown([empty, dict(empty, domain="docs")]) == []
    lines = fixed_vs_tuned_markdown([empty, some])
    assert "| m2 | code | +0.250 | - | - |" in lines and not any(line.startswith("| m1 |") for line in lines)


def test_two_processes_share_a_study_with_run_only(tiny_recipe_path, tmp_path):
    """basecap run --run: each call tunes, trains and evaluates its runs and writes no report; the last call
    without --run trains nothing again and writes the report over all of them."""
    from basecap.experiment import run_experiment

    path = write_exp(tmp_path, tiny_recipe_path, extra=TUNE.replace("[1e-3, 2e-3, 4e-3]", "[1e-6, 1e-2]"))
    runs = tmp_path / "runs"
    assert run_experiment(path, log=lambda *_: None, only=["tpp"]) is None
    assert (runs / "tpp-s0" / "eval.json").is_file() and not (runs / "abs-s0").exists() and not (runs / "report").exists()
    assert run_experiment(path, log=lambda *_: None, only=["abs"]) is None
    stamp = (runs / "tpp-s0" / "eval.json").stat().st_mtime_ns
    lines = []
    rep = run_experiment(path, log=lines.append)
    assert rep.is_file() and (runs / "tpp-s0" / "eval.json").stat().st_mtime_ns == stamp
    assert not [m for m in lines if m.startswith("== tuning")]  # both choices stored, nothing tuned again
    assert set(json.loads((runs / TUNING_FILE).read_text())["runs"]) == {"tpp", "abs"}
    with pytest.raises(ConfigError, match=r"unknown run\(s\) \['nope'\]"):
        run_experiment(path, log=lambda *_: None, only=["nope"])


def test_a_size_table_brings_its_own_grid_and_set_wins(tmp_path):
    """sizes.<s>.sweep replaces the file's grid for the keys it names; --set sweep.* wins over both."""
    from basecap.config import load_experiment

    p = tmp_path / "grid.toml"
    p.write_text('name = "grid"\nsize = "cpu"\n[sweep]\ntrain.lr = [1e-3, 2e-3]\n'
                 '[[runs]]\nname = "a"\n[sizes.cpu]\ntrain = { steps = 10, warmup_steps = 1 }\n'
                 '[sizes.gpu]\ntrain = { steps = 10, warmup_steps = 1 }\nsweep = { "train.lr" = [3e-4, 6e-4] }\n')
    assert load_experiment(p).sweep == {"train.lr": [1e-3, 2e-3]}
    assert load_experiment(p, ["size=gpu"]).sweep == {"train.lr": [3e-4, 6e-4]}
    assert load_experiment(p, ["size=gpu", "sweep.train.lr=[1e-4]"]).sweep == {"train.lr": [1e-4]}
    assert [r.train.lr for r in load_experiment(p, ["size=gpu"]).run_configs()] == [3e-4, 6e-4]


def test_tune_false_and_an_empty_sweep_give_a_shared_value_control(tmp_path):
    """--set tune=false --set 'sweep={}' --set train.lr=X: the tune study's runs, every one at X, no tuning runs,
    names without values; the empty sweep wins over a size table's grid. Each run's config equals the tune
    study's comparison run at the chosen X (so --reuse can share them)."""
    p = write_exp(tmp_path, extra=TUNE + '\n[sizes.cpu]\nsweep = { "train.lr" = [3e-4, 6e-4] }\n')
    tuned = load_experiment(p, ["size=cpu"])
    assert tuned.tune is not None and len(tuned.run_configs()) == 4  # 2 runs x 2 values on seed 100
    control = load_experiment(p, ["size=cpu", "sweep={}", "tune=false", "train.lr=6e-4"])
    assert control.tune is None and control.sweep == {}
    runs = control.run_configs()
    assert [(r.name, r.seed, r.train.lr) for r in runs] == [("tpp", 0, 6e-4), ("abs", 0, 6e-4)]
    chosen = tuned.comparison_configs({"tpp": {"train.lr": 6e-4}, "abs": {"train.lr": 6e-4}})
    assert [r.model_dump() for r in chosen] == [r.model_dump() for r in runs]
    with pytest.raises(ConfigError, match="swept"):  # the grid is still there without sweep={}
        load_experiment(p, ["size=cpu", "tune=false", "train.lr=6e-4"])


def test_one_tuning_run_alone_then_the_choice(tiny_recipe_path, tmp_path):
    """--run NAME@KEY=VALUE trains that tuning run only and chooses nothing; the call that names the run finds
    every tuning run finished, chooses without training any again, and trains the comparison run."""
    from basecap.experiment import run_experiment

    path = write_exp(tmp_path, tiny_recipe_path, extra=TUNE.replace("[1e-3, 2e-3, 4e-3]", "[1e-6, 1e-2]"))
    runs = tmp_path / "runs"
    lines = []
    assert run_experiment(path, log=lines.append, only=["tpp@lr=1e-06"]) is None
    assert (runs / "tpp@lr=1e-06-s100" / "done.json").is_file() and not (runs / "tpp@lr=0.01-s100").exists()
    assert not (runs / TUNING_FILE).exists() and not (runs / "tpp-s0").exists()
    assert any("tuning run(s) tpp@lr=1e-06 done" in m for m in lines)
    assert run_experiment(path, log=lambda *_: None, only=["tpp@lr=0.01"]) is None
    stamp = (runs / "tpp@lr=1e-06-s100" / "done.json").stat().st_mtime_ns
    assert run_experiment(path, log=lambda *_: None, only=["tpp"]) is None
    assert (runs / "tpp@lr=1e-06-s100" / "done.json").stat().st_mtime_ns == stamp  # not trained again
    assert json.loads((runs / TUNING_FILE).read_text())["runs"]["tpp"]["chosen"] == {"train.lr": 0.01}
    assert (runs / "tpp-s0" / "eval.json").is_file() and not (runs / "abs-s0").exists()
    with pytest.raises(ConfigError, match=r"unknown run\(s\) \['tpp@lr=0.5'\]"):
        run_experiment(path, log=lambda *_: None, only=["tpp@lr=0.5"])
