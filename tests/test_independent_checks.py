"""Assertions whose expected values are computed here, not by the code under test.

Each one kills a single-line mutation that once passed every test meant for it (issue 26; the mutation run
of docs/testing.md): the Holm family size, the evaluation-noise aggregate, the mean over tuning seeds, the
tuning choice keyed on configs, the fixed-vs-tuned table, the checkpoint unpickler's allow-list, the report
page's escaping, MFU in TensorBoard and the fused head's default chunk.
"""

from __future__ import annotations

import io
import json
import math
import pickle

import numpy as np
import pytest
from scipy import stats as sps

from basecap.report.stats import RunCurves, apply_holm, build_comparisons
from tests.test_report import fake_run
from tests.test_sweep import TUNE, fake_record, write_exp


# ---- apply_holm: a comparison without a test is not one of the m -----------------------------------------
def test_the_simultaneous_interval_counts_only_comparisons_with_a_p_value():
    def comp(p, n=4, mean=0.1, sd=0.05):
        return {"p": p, "n_seeds": n, "mean_gap": mean, "sd": sd, "unmatched_seeds": 0}

    comps = [comp(0.001), comp(0.02, mean=-0.2, sd=0.1), comp(0.3), comp(None, n=1, sd=None), comp(None, n=0, mean=None)]
    apply_holm(comps)
    m = 3  # three tests; the two without a p value are not comparisons the correction pays for
    assert [c["p_holm"] for c in comps[:3]] == pytest.approx([3 * 0.001, 2 * 0.02, 0.3])
    assert comps[3]["p_holm"] is None and comps[4]["p_holm"] is None
    for c in comps[:3]:
        half = sps.t.ppf(1 - 0.05 / (2 * m), c["n_seeds"] - 1) * c["sd"] / math.sqrt(c["n_seeds"])
        assert c["ci_simultaneous"] == pytest.approx([c["mean_gap"] - half, c["mean_gap"] + half], rel=1e-12)
    assert comps[3]["ci_simultaneous"] is None and comps[4]["ci_simultaneous"] is None


# ---- build_comparisons: the evaluation noise is the root mean square of the per-seed standard errors ----------
def test_eval_se_is_the_root_mean_square_over_seeds():
    x = np.linspace(5.0, 3.0, 8)
    rng = np.random.default_rng(0)
    n = 400  # windows: the bootstrap SE of a mean is then close to sd / sqrt(n)
    runs, want = [], []
    for seed, spread in ((0, 0.1), (1, 0.3), (2, 0.6)):
        noise = rng.normal(0, spread, n)
        noise -= noise.mean()
        ref_w, run_w = np.full(n, 4.0), 4.2 + noise
        want.append(noise.std(ddof=0) / math.sqrt(n))  # the bootstrap's SE of the mean difference, in closed form
        runs.append(RunCurves("ref", seed, x, {"code": x + 1.0}, {"code": ref_w}))
        runs.append(RunCurves("run", seed, x, {"code": x + 1.2 + 0.01 * seed}, {"code": run_w}))
    pairs = [(r, f) for r in runs if r.name == "run" for f in runs if f.name == "ref" and f.seed == r.seed]
    [c] = build_comparisons(pairs, ["code"])
    rms = math.sqrt(sum(s * s for s in want) / len(want))
    assert c["eval_se"] == pytest.approx(rms, rel=0.06)
    assert abs(c["eval_se"] - max(want)) > 0.1 * max(want)  # the largest alone is another number


# ---- tune: the mean over tuning seeds, and a choice recomputed when a config changes under the same run ids ----
TWO_SEEDS = TUNE.replace("seeds = [100]", "seeds = [100, 101]")


def test_a_value_is_chosen_on_its_mean_over_the_tuning_seeds(tmp_path):
    from basecap.config import load_experiment
    from basecap.sweep import TUNING_FILE, tune

    exp = load_experiment(write_exp(tmp_path, extra=TWO_SEEDS))
    # per (lr, seed): lr=1e-3 has mean 3.5 but a bad seed (4.0); lr=2e-3 has mean 3.6 and no bad seed; 4e-3 worst
    losses = {(0.001, 100): 3.0, (0.001, 101): 4.0, (0.002, 100): 3.6, (0.002, 101): 3.6, (0.004, 100): 5.0, (0.004, 101): 5.0}
    chosen = tune(exp, exp.resolve(), tmp_path / "out", lambda rc, d: fake_record(losses[(rc.train.lr, rc.seed)], 0.0),
                  log=lambda *_: None)
    assert chosen["tpp"] == {"train.lr": 0.001}  # the mean; the worst seed would pick 0.002, the best seed 0.001 too
    tried = json.loads((tmp_path / "out" / TUNING_FILE).read_text())["runs"]["tpp"]["tried"]
    assert [t["mean"] for t in tried] == pytest.approx([3.5, 3.6, 5.0])
    assert tried[0]["losses"] == {"100": 3.0, "101": 4.0}


def test_a_stored_choice_is_recomputed_when_a_config_changes_under_the_same_run_ids(tmp_path):
    from basecap.config import load_experiment
    from basecap.sweep import tune

    p = write_exp(tmp_path, extra=TUNE)
    calls = []

    def train_fn(rc, run_dir):
        calls.append(rc.run_id)
        return fake_record(rc.train.lr * 100, 0.0)

    exp = load_experiment(p)
    tune(exp, exp.resolve(), tmp_path / "out", train_fn, log=lambda *_: None)
    assert len(calls) == 6
    longer = load_experiment(p, ["train.steps=9"])  # the same names and run ids, another training
    assert [rc.run_id for rc in longer.resolve()] == [rc.run_id for rc in exp.resolve()]
    tune(longer, longer.resolve(), tmp_path / "out", train_fn, log=lambda *_: None)
    assert len(calls) == 12  # every tuning run trained again: the stored choice was made on other configs


def test_reuse_needs_an_equal_config_not_an_equal_run_id(tmp_path):
    from basecap.reuse import find_reusable

    src = tmp_path / "study"
    d = src / "tpp-s0"
    d.mkdir(parents=True)
    config = {"name": "other", "seed": 0, "train": {"steps": 6, "lr": 1e-3}}
    (d / "run.json").write_text(json.dumps({"run_id": "tpp-s0", "config": config}))
    (d / "done.json").write_text(json.dumps({"steps": 6, "final": {}}))
    assert find_reusable(dict(config, name="tpp"), [src]) == d  # equal but for the name: reusable
    assert find_reusable(dict(config, name="tpp", train={"steps": 6, "lr": 2e-3}), [src]) is None  # same run id, other config


# ---- fixed_vs_tuned: the sign, and the fixed column paired with the reference at the same value --------------------
def test_fixed_vs_tuned_against_gaps_known_by_construction(tmp_path):
    from basecap.report.sweep import fixed_vs_tuned

    # code loss = in-domain loss + offset on every evaluation, so the matched gap of a pair is the offsets' difference
    offsets = {"ref@lr=1": 0.0, "ref@lr=2": 0.5, "ssm@lr=1": 0.3, "ssm@lr=2": 0.9}
    for name, off in offsets.items():
        fake_run(tmp_path, name, 100, off, done=True)  # a finished tuning run (only those count)
    tried = lambda n: [{"name": f"{n}@lr={v}", "values": {"train.lr": v}} for v in (1, 2)]  # noqa: E731
    tuning = {"seeds": [100], "runs": {"ref": {"tried": tried("ref"), "chosen": {"train.lr": 1}, "chosen_name": "ref@lr=1"},
                                       "ssm": {"tried": tried("ssm"), "chosen": {"train.lr": 2}, "chosen_name": "ssm@lr=2"}}}
    [row] = fixed_vs_tuned(tuning, tmp_path, "ref")
    assert row["run"] == "ssm" and row["domain"] == "code"
    assert row["fixed"] == {"train.lr=1": pytest.approx(0.3 - 0.0), "train.lr=2": pytest.approx(0.9 - 0.5)}
    assert row["tuned"] == pytest.approx(0.9 - 0.0)  # each at its own chosen value


# ---- the checkpoint metadata unpickler: torch's own globals are not all safe -----------------------------------
def _global_pickle(module: str, name: str) -> bytes:
    """A pickle that only loads the global ``module.name`` (protocol 2 GLOBAL opcode)."""
    return b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\nq\x00."


@pytest.mark.parametrize("module,name", [("torch.hub", "_load_local"), ("torch", "load"), ("torch.serialization", "load"),
                                         ("torch._C", "_set_grad_enabled"), ("os", "system")])
def test_the_unpickler_refuses_globals_outside_its_list(module, name):
    from basecap.checkpoint import _MetadataUnpickler

    with pytest.raises(pickle.UnpicklingError, match=f"refusing to load {module}.{name}"):
        _MetadataUnpickler(io.BytesIO(_global_pickle(module, name))).load()


def test_the_unpickler_still_takes_what_a_checkpoint_holds():
    import torch

    from basecap.checkpoint import _MetadataUnpickler

    assert _MetadataUnpickler(io.BytesIO(_global_pickle("torch", "float32"))).load() is torch.float32
    assert _MetadataUnpickler(io.BytesIO(_global_pickle("torch", "Size"))).load() is torch.Size


# ---- the report page escapes code spans, warnings and every other span --------------------------------------------
def test_code_spans_warnings_and_headings_are_escaped_on_the_page():
    from basecap.report.page import render_html

    md = ("# Report <i>h</i>\n\n> **warning** near the unigram: <script>alert(1)</script> `<b>w</b>`\n\n"
          "reference `<img src=x onerror=alert(2)>` and **<u>bold</u>**\n\n| run | gap |\n|---|---|\n| `<s>r</s>` | <em>1</em> |\n")
    html = render_html(md, [])
    for raw in ("<i>h</i>", "<script>", "<b>w</b>", "<img src=x", "<u>bold</u>", "<s>r</s>", "<em>1</em>"):
        assert raw not in html, raw
    for escaped in ("&lt;i&gt;h&lt;/i&gt;", "&lt;script&gt;alert(1)&lt;/script&gt;", "<code>&lt;b&gt;w&lt;/b&gt;</code>",
                    "<code>&lt;img src=x onerror=alert(2)&gt;</code>", "<strong>&lt;u&gt;bold&lt;/u&gt;</strong>",
                    "<code>&lt;s&gt;r&lt;/s&gt;</code>", "&lt;em&gt;1&lt;/em&gt;"):
        assert escaped in html, escaped
    assert "<p class='warn'>" in html


# ---- TensorBoard gets the step's MFU -----------------------------------------------------------------------
def test_tensorboard_holds_train_mfu(tmp_path):
    from tests.test_tracking import need, read_tensorboard

    need("tensorboard")
    from basecap.tracking import open_loggers

    recs = [{"kind": "train", "step": s, "loss": 5.0 - s / 10, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1000.0 + s,
             "mfu": 0.25 + s / 100} for s in range(1, 4)]
    with open_loggers(["tensorboard"], tmp_path, project="p", name="r") as tracker:
        for r in recs:
            tracker.log(r)
    got = read_tensorboard(tmp_path)
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/mfu"} <= set(got)
    assert [s for s, _ in got["train/mfu"]] == [1, 2, 3]
    np.testing.assert_allclose([v for _, v in got["train/mfu"]], [0.26, 0.27, 0.28], rtol=1e-6)


# ---- the fused head chunks by default -----------------------------------------------------------------------------
def test_the_fused_head_is_chunked_by_default(monkeypatch):
    import torch

    import basecap.ops.linear_ce as L
    from basecap.ops.linear_ce import default_chunk_tokens, linear_cross_entropy

    assert default_chunk_tokens(8192) == 256 and default_chunk_tokens(2048) == 1024 and default_chunk_tokens(32000) == 65
    seen = []
    forward = L._forward

    def spy(h, w, t, chunk, *a, **k):
        seen.append(chunk)
        return forward(h, w, t, chunk, *a, **k)

    monkeypatch.setattr(L, "_forward", spy)
    h, w = torch.randn(3000, 16, requires_grad=True), torch.randn(8192, 16, requires_grad=True)
    t = torch.randint(0, 8192, (3000,))
    with torch.no_grad():
        loss = linear_cross_entropy(h, w, t)
    assert seen == [256]  # 3000 tokens in chunks of 256 (8 MiB of fp32 logits), not one chunk of all of them
    want = torch.nn.functional.cross_entropy(h.detach() @ w.detach().T, t)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)


# ---- survivors of the mutation run (docs/testing.md) that changed behaviour --------------------------------------
def test_reuse_without_a_source_copies_nothing(tmp_path):
    from basecap.reuse import reuse_run

    assert reuse_run({"name": "a", "train": {"steps": 1}}, "a-s0", tmp_path / "a-s0", []) is False
    assert not (tmp_path / "a-s0").exists()


def test_a_missing_run_folder_does_not_end_the_check_of_the_others(tmp_path):
    from basecap.config import load_experiment
    from basecap.sweep import check_trained_at_choice

    exp = load_experiment(write_exp(tmp_path, extra=TUNE))
    compared = exp.resolve(exp.comparison_configs({"tpp": {"train.lr": 0.002}, "abs": {"train.lr": 0.002}}))
    abs_rc = next(rc for rc in compared if rc.name == "abs")
    old = json.loads(abs_rc.model_copy(update={"train": abs_rc.train.model_copy(update={"lr": 0.001})}).model_dump_json())
    (tmp_path / "out" / abs_rc.run_id).mkdir(parents=True)
    (tmp_path / "out" / abs_rc.run_id / "run.json").write_text(json.dumps({"config": old}))
    from basecap.config_base import ConfigError

    tpp_first = sorted(compared, key=lambda rc: rc.name != "tpp")  # tpp (not trained) before abs
    with pytest.raises(ConfigError, match="abs-s0: trained with train.lr=0.001"):
        check_trained_at_choice(tmp_path / "out", tpp_first, ["train.lr"])


def test_fixed_values_pair_whatever_the_key_order_and_a_missing_point_gives_none(tmp_path):
    from basecap.report.sweep import fixed_vs_tuned

    offsets = {"ref@a": 0.0, "ref@b": 0.5, "ssm@a": 0.3}  # ssm@b was never kept
    for name, off in offsets.items():
        fake_run(tmp_path, name, 100, off, done=True)  # a finished tuning run (only those count)
    a, b = {"train.lr": 1, "train.weight_decay": 0}, {"train.lr": 2, "train.weight_decay": 0}
    swapped = lambda v: dict(reversed(list(v.items())))  # noqa: E731 - keys out of sorted order, as a TOML file may give them
    tuning = {"seeds": [100], "runs": {
        "ref": {"tried": [{"name": "ref@a", "values": swapped(a)}, {"name": "ref@b", "values": swapped(b)}], "chosen": swapped(a),
                "chosen_name": "ref@a"},
        "ssm": {"tried": [{"name": "ssm@a", "values": swapped(a)}, {"name": "ssm@b", "values": swapped(b)}], "chosen": swapped(b),
                "chosen_name": "ssm@b"}}}
    [row] = fixed_vs_tuned(tuning, tmp_path, "ref")
    assert row["fixed"] == {"train.weight_decay=0, train.lr=1": pytest.approx(0.3), "train.weight_decay=0, train.lr=2": None}
    assert row["tuned"] is None


def test_a_diverged_tuning_run_is_stored_as_none(tmp_path):
    from basecap.config import load_experiment
    from basecap.sweep import TUNING_FILE, tune

    exp = load_experiment(write_exp(tmp_path, extra=TUNE))
    tune(exp, exp.resolve(), tmp_path / "out", lambda rc, d: fake_record(math.nan if rc.train.lr == 0.004 else rc.train.lr * 100, 0.0),
         log=lambda *_: None)
    tried = json.loads((tmp_path / "out" / TUNING_FILE).read_text())["runs"]["tpp"]["tried"]
    assert tried[2]["losses"] == {"100": None} and tried[2]["mean"] is None


def test_a_choice_on_the_wrong_split_names_that_split():
    from basecap.config_base import ConfigError
    from basecap.sweep import validation_loss

    with pytest.raises(ConfigError, match="run-s1: its final evaluation is on the 'test' split"):
        validation_loss({"split": "test", "in_domain_loss": 1.0}, "run-s1")


def test_one_seed_has_no_simultaneous_interval_and_the_bootstrap_is_seeded():
    from basecap.report.stats import eval_noise, simultaneous_ci

    assert simultaneous_ci(1, 0.1, 0.05, 3) is None and simultaneous_ci(2, 0.1, 0.05, 3) is not None
    w = np.random.default_rng(3).normal(4.0, 0.5, 64)
    assert eval_noise(w) == eval_noise(w)  # the same windows, the same interval: a fixed seed, not fresh entropy


def test_a_run_trained_at_the_chosen_value_passes_the_check_and_missing_keys_read_as_none(tmp_path):
    from basecap.config import load_experiment
    from basecap.sweep import _get, check_trained_at_choice

    exp = load_experiment(write_exp(tmp_path, extra=TUNE))
    compared = exp.resolve(exp.comparison_configs({"tpp": {"train.lr": 0.002}, "abs": {"train.lr": 0.002}}))
    for rc in compared:
        (tmp_path / "out" / rc.run_id).mkdir(parents=True)
        (tmp_path / "out" / rc.run_id / "run.json").write_text(json.dumps({"config": json.loads(rc.model_dump_json())}))
    check_trained_at_choice(tmp_path / "out", compared, ["train.lr"])  # trained at the chosen value: nothing to refuse
    assert _get({"model": None}, "model.mixer.window") is None and _get({"a": {"b": 3}}, "a.b") == 3


def test_which_noise_dominates_and_a_domain_only_one_side_has():
    from basecap.report.stats import dominant_noise

    assert dominant_noise(0.2, 0.1) == "seeds" and dominant_noise(0.1, 0.2) == "evaluation" and dominant_noise(0.1, 0.1) == "seeds"
    assert dominant_noise(None, 0.1) is None and dominant_noise(0.1, None) is None
    x = np.linspace(5.0, 3.0, 8)
    pairs = [(RunCurves("run", s, x, {"code": x + 1.1}), RunCurves("ref", s, x, {"code": x + 1.0, "docs": x + 2.0})) for s in (0, 1)]
    assert [c["domain"] for c in build_comparisons(pairs, ["code", "docs"])] == ["code"]  # docs: the run has none


def test_a_reused_run_leaves_the_lock_and_temporaries_behind(tmp_path):
    from basecap.reuse import reuse_run

    src = tmp_path / "study" / "old-s0"
    src.mkdir(parents=True)
    config = {"name": "old", "seed": 0, "train": {"steps": 2}}
    (src / "run.json").write_text(json.dumps({"run_id": "old-s0", "config": config}))
    (src / "done.json").write_text(json.dumps({"steps": 2, "final": {}}))
    (src / "run.lock").write_text("123\n")
    (src / "metrics.jsonl.tmp").write_text("partial")
    assert reuse_run(dict(config, name="new"), "new-s0", tmp_path / "new-s0", [tmp_path / "study"], log=lambda *_: None) is True
    assert sorted(p.name for p in (tmp_path / "new-s0").iterdir()) == ["done.json", "run.json"]
    assert json.loads((tmp_path / "new-s0" / "run.json").read_text())["run_id"] == "new-s0"
    assert reuse_run(dict(config, name="new", seed=1), "new-s1", tmp_path / "new-s1", [tmp_path / "study"]) is False  # no match
    assert not (tmp_path / "new-s1").exists()
