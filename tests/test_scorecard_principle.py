"""The principle as a claim (scorecard/principle.py) and its predictions (scorecard/predictions.py): Spearman's rho and
the bootstrap against plain references and known answers, the verdict's thresholds, the points read from made-up
MQAR records, and `basecap principle mqar` (resumable, one point and seed at a time) on a shortened protocol."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from basecap.config_base import ConfigError
from basecap.scorecard import load_claims
from basecap.scorecard import principle as pr
from basecap.scorecard.mqar_points import measure
from basecap.scorecard.principle import protocol
from basecap.scorecard.render_principle import plot_principle
from basecap.scorecard.verdicts import FAILS, HOLDS, UNDECIDED, decide

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def claims():
    return load_claims(ROOT / "experiments/paper/claims.toml", ROOT)


@pytest.fixture(scope="module")
def spec(claims):
    return pr.load_principle(ROOT / "experiments/paper/principle.toml", claims, ROOT)


def test_the_committed_principle_file_loads_as_declared(spec):
    p = spec.principle
    assert (p.statistic, p.expect, p.margin) == ("spearman", "negative", -0.5)
    assert (p.bootstrap.resamples, p.bootstrap.seed) == (10_000, 0)
    assert (p.mqar.d_model, p.mqar.n_layers, p.mqar.seq_len, p.mqar.steps, p.mqar.score_kv_pairs, p.mqar.seeds) == (64, 2, 64, 1000, 8, [0, 1, 2])
    assert len(p.points) == 17 and p.points[0].label == "Transformer++"
    assert [x.architecture for x in spec.predictions] == ["forgetting_attn", "kda", "log_linear_mamba2"]


def test_a_point_naming_an_unknown_study_or_run_is_an_error(tmp_path, claims):
    text = (ROOT / "experiments/paper/principle.toml").read_text()
    bad = tmp_path / "principle.toml"
    bad.write_text(text.replace('run = "mamba1"', 'run = "mamba9"', 1))
    with pytest.raises(ConfigError, match="'mamba9' is not a run of architectures_annealed.toml"):
        pr.load_principle(bad, claims, ROOT)
    bad.write_text(text.replace('study = "architectures_more", run = "deltanet"', 'study = "nope", run = "deltanet"', 1))
    with pytest.raises(ConfigError, match="unknown study 'nope'"):
        pr.load_principle(bad, claims, ROOT)


def test_spearman_known_answers_and_scipy():
    assert pr.spearman([0.1, 0.5, 0.9, 0.95, 1.0], [0.3, 0.2, 0.1, 0.05, 0.0]) == pytest.approx(-1.0)  # perfectly monotone
    assert pr.spearman([1, 2, 3, 4], [1, 2, 3, 4]) == pytest.approx(1.0)
    assert pr.spearman([1, 1, 1], [1, 2, 3]) is None  # a coordinate with one value: undefined
    assert pr.average_ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    rng = np.random.default_rng(4)
    for _ in range(5):
        x, y = rng.integers(0, 4, 9).astype(float), rng.normal(size=9)  # ties in x
        assert pr.spearman(list(x), list(y)) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    rows = rng.integers(0, 3, (6, 5)).astype(float), rng.normal(size=(6, 5))
    fast = pr.spearman_rows(*rows)
    for i in range(6):
        want = pr.spearman(list(rows[0][i]), list(rows[1][i]))
        assert (math.isnan(fast[i]) and want is None) or fast[i] == pytest.approx(want, abs=1e-12)


POINTS = [  # (gaps over LM seeds, MQAR accuracies over MQAR seeds): more selection, smaller gap, with noise
    ([0.0], [0.98, 0.99, 0.97]),
    ([0.16, 0.14, 0.18, 0.15, 0.17], [0.10, 0.12, 0.08]),
    ([0.05, 0.07, 0.06], [0.55, 0.60, 0.50]),
    ([0.10, 0.11], [0.30, 0.25, 0.35]),
    ([0.01, 0.03, 0.02, 0.0], [0.90, 0.85, 0.93]),
    ([0.20, 0.22, 0.19], [0.02, 0.01, 0.03]),
]


def test_the_vectorised_bootstrap_is_the_plain_one_and_reproducible():
    plain = pr.bootstrap_plain(POINTS, 300, seed=7)
    fast = pr.bootstrap(POINTS, 300, seed=7)
    assert len(plain) == len(fast) == 300
    for a, b in zip(plain, fast):
        assert (a is None and math.isnan(b)) or b == pytest.approx(a, abs=1e-12)
    assert np.array_equal(pr.bootstrap(POINTS, 300, seed=7), fast, equal_nan=True)  # the same generator seed, the same draws
    assert not np.array_equal(pr.bootstrap(POINTS, 300, seed=8), fast, equal_nan=True)


def test_the_reading_of_a_monotone_set(spec):
    """A perfect monotone set: rho = -1; its bootstrap lies at or below 0 except where a resample ties (rho counted 0)."""
    r = pr.reading(POINTS, spec.principle)
    assert r["mean"] == pytest.approx(-1.0) and r["n"] == 6 and r["resamples"] == 10_000
    assert r["p_holds"] == pytest.approx(r["undefined"] / 10_000 + float((r["_resampled"] > 0).mean()))
    assert r["ci95"][1] < 0 and r["p_holds"] < 0.01 and r["p_fails"] == 1.0  # nothing rules out a strong correlation
    assert pr.reading(POINTS[:4], spec.principle) is None  # fewer than 5 points: not run


def _principle_row(p_holds: float, p_fails: float, resampled: np.ndarray) -> dict:
    t = {"n": 6, "mean": -0.6, "ci95": [-0.9, -0.2], "margin": -0.5, "p_holds": p_holds, "p_fails": p_fails, "_resampled": resampled}
    t.update(p_holds_claim=p_holds, p_fails_claim=p_fails)
    return {"family": True, "test": t, "verdict": "not run", "detail": "", "decider": pr.decide_principle}


@pytest.mark.parametrize("kind", ["holds", "fails"])
def test_the_principle_decides_in_the_family_one_step_either_side(kind):
    """m = 4: the bootstrap's p values decide exactly at alpha / 4, one step above they do not; the interval it prints
    is the percentile interval at the deciding test's level."""
    res = np.linspace(-1, 1, 2001)
    for p, want in ((0.05 / 4, HOLDS if kind == "holds" else FAILS), (0.05 / 4 * (1 + 1e-9), UNDECIDED)):
        row = _principle_row(p, 1.0, res) if kind == "holds" else _principle_row(1.0, p, res)
        rows = [row] + [{"family": True, "test": None, "verdict": "not run", "detail": ""} for _ in range(3)]
        assert decide(rows, 0.05, 0.8) == 4
        assert row["verdict"] == want
    row = _principle_row(0.001, 1.0, res)
    decide([row], 0.05, 0.8)
    assert row["test"]["ci_corrected_level"] == pytest.approx(0.9) and row["test"]["ci_corrected"] == pytest.approx([-0.9, 0.9])


def _mqar_json(path: Path, spec, accs: dict[str, list[float]]) -> None:
    pts = {label: {"seeds": {str(s): {"acc_at_score": a} for s, a in zip(spec.principle.mqar.seeds, v)}} for label, v in accs.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"protocol": protocol(spec.principle), "points": pts}))


def test_the_principle_row_from_made_up_points(tmp_path, monkeypatch, spec, claims):
    """Gaps and MQAR accuracies of made-up points: the row enters the family with its rho; points without a gap or
    with MQAR at fewer seeds than declared are listed as missing; with fewer than 5 points it is not run."""
    labels = [p.label for p in spec.principle.points]
    made_up = dict(zip(labels, POINTS))

    def gaps_of(study, run, reference, claims_, studies):
        point = next((p for p in spec.principle.points if (p.study, p.run, p.reference) == (study, run, reference)), None)
        if point is not None and point.label in made_up:
            return made_up[point.label][0], list(range(len(made_up[point.label][0]))), ""
        return None, [], f"results/{study}/ not published yet"

    monkeypatch.setattr(pr, "gaps_of", gaps_of)
    root = tmp_path
    _mqar_json(root / pr.MQAR_FILE, spec, {lab: v[1] for lab, v in made_up.items()} | {labels[7]: [0.5, 0.6, 0.7]})
    row, section = pr.principle_row(spec, claims, {}, root)
    assert row["test"]["n"] == 6 and row["test"]["mean"] == pytest.approx(-1.0) and row["decider"] is pr.decide_principle
    assert section["measured"] == 6 and len(section["missing"]) == 11
    assert any(m.startswith(labels[7] + " (results/") for m in section["missing"])
    assert "MQAR measured at 0 of 3 seeds" in section["missing"][-1]
    # Mamba-2's arm A is declared (mamba2_worse) and not published here: the arm A reading leaves it out
    m2 = next(p for p in section["points"] if p["label"] == "Mamba-2")
    assert m2["arm_a"]["label"] == "A: both at 2e-3" and "missing" in m2["arm_a"]
    _mqar_json(root / pr.MQAR_FILE, spec, {lab: v[1] for lab, v in list(made_up.items())[:4]})
    row, section = pr.principle_row(spec, claims, {}, root)
    assert row["test"] is None and row["verdict"] == "not run" and "4 of 17 points have their gap and MQAR" in row["detail"]
    bad = json.loads((root / pr.MQAR_FILE).read_text())
    bad["protocol"]["steps"] = 10
    (root / pr.MQAR_FILE).write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="protocol: measured with"):
        pr.principle_row(spec, claims, {}, root)


def test_the_figure_draws_the_points_that_have_both(tmp_path):
    pts = [
        {"label": "a", "gap": {"mean": 0.1, "ci95": [0.05, 0.15]}, "mqar": {"mean": 0.2, "ci95": [0.1, 0.3]}, "missing": ""},
        {"label": "b", "gap": {"mean": 0.0, "ci95": None}, "mqar": {"mean": 0.9, "ci95": [0.8, 1.0]}, "missing": ""},
        {"label": "c", "gap": None, "mqar": {"mean": 0.5, "ci95": None}, "missing": "no gap"},
    ]
    section = {"points": pts, "protocol": {"score_kv_pairs": 8}}
    path = tmp_path / "principle.png"
    assert plot_principle(section, path) and path.stat().st_size > 0
    assert not plot_principle({"points": pts[2:], "protocol": {"score_kv_pairs": 8}}, path.with_name("none.png"))


def test_each_point_has_the_arm_a_of_its_claim(spec, claims):
    arms = {p.label: pr.arm_a(p, claims) for p in spec.principle.points}
    assert arms["Mamba-2"].run == "mamba2_lr2e-3" and arms["Top-1 Element"].study == "top1_annealed"
    assert arms["DeltaNet"].run == "deltanet_lr2e-3" and arms["Top-1 Chunk Approx"].run == "top1_chunk_lr2e-3"
    assert arms["Based"] is None and arms["sliding window 256"] is None and arms["Transformer++"] is None


def test_principle_mqar_resumes_and_skips_what_it_has(tmp_path, spec, claims, monkeypatch):
    """One point, one seed at a time into one file: a second call skips it; a file of another protocol is refused.
    train_mqar is replaced by a stand-in here (its own tests cover it); the command gets the point's resolved config."""
    import basecap.eval.recall as recall

    seen = []

    def fake(mixer, task, training, **kw):
        seen.append((mixer["name"], kw["d_model"], kw["n_layers"], training.steps, training.batch_size, training.lr, task.seq_len,
                     task.train_kv_pairs, kw["seed"], kw["mlp"]["name"]))
        assert (task.vocab_size, task.num_test, task.power_a, training.weight_decay) == (128, 256, 0.01, 0.1)
        acc = {k: 1.0 / k for k in task.test_kv_pairs}
        return {
            "acc": acc,
            "mean_acc": 0.5,
            "final_loss": 1.0,
            "loss_curve": [(0, 4.0)],
            "params": {"total": 1},
            "state_bytes": 8,
            "train_seconds": 0.1,
        }

    monkeypatch.setattr(recall, "train_mqar", fake)
    out = tmp_path / "mqar.json"
    new = measure(spec, claims, ROOT, out, ["Transformer++"], [1], threads=1, log=lambda *_: None)
    assert [(n["label"], n["seed"], n["acc_at_score"]) for n in new] == [("Transformer++", 1, 0.125)]
    assert seen == [("attention", 64, 2, 1000, 32, 1e-3, 64, (1, 2, 4, 8), 1, "swiglu")]
    assert measure(spec, claims, ROOT, out, ["Transformer++"], [1], log=lambda *_: None) == []  # skipped
    data = json.loads(out.read_text())
    assert data["protocol"] == protocol(spec.principle) and data["points"]["Transformer++"]["run"] == "transformer_pp"
    assert data["points"]["Transformer++"]["seeds"]["1"]["acc"]["16"] == 1 / 16
    with pytest.raises(ConfigError, match="--seed"):
        measure(spec, claims, ROOT, out, ["Transformer++"], [5])
    with pytest.raises(ConfigError, match="no point 'Mamba-9'"):
        measure(spec, claims, ROOT, out, ["Mamba-9"], None)
    data["protocol"]["lr"] = 0.01
    out.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="protocol"):
        measure(spec, claims, ROOT, out, ["Transformer++"], [0])


def test_principle_mqar_trains_for_real_on_a_short_protocol(tmp_path, spec, claims):
    """The real train_mqar on a protocol shortened to 3 steps (the committed one is 1000): a record per seed with the
    accuracy at the scored pair count and the curve."""
    short = spec.model_copy(update={"principle": spec.principle.model_copy(update={"mqar": spec.principle.mqar.model_copy(update={"steps": 3})})})
    new = measure(short, claims, ROOT, tmp_path / "m.json", ["Transformer++"], [0], threads=1, log=lambda *_: None)
    (rec,) = new
    assert 0 <= rec["acc_at_score"] <= 1 and set(rec["acc"]) == {"1", "2", "4", "8", "16"} and rec["threads"] == 1


def test_a_prediction_is_read_through_the_plan_it_joined_and_under_each_specification(spec, claims):
    """The Forgetting Transformer's published comparison: its seeds came at the rate arms' looks (3, then 5), so its p
    values are read at look 2 of 2; it degrades there, and under every target instead of the seen ones the interval
    reaches 0 and the outcome is undecided: the miss is fragile."""
    from basecap.scorecard.compute import load_study
    from basecap.scorecard.predictions import predictions

    name = "compare-forgetting_attn-architectures_rate_arms"
    studies = {name: load_study(ROOT / "results" / name)}
    (fox, *others) = predictions(spec, claims, studies)
    assert fox["outcome"] == "degrades" and fox["called"] == "missed"
    assert fox["read"].startswith("planned look 2 of 2 (5 seeds)")
    raw = max(r["p_degrades"] for r in (fox["tuned"], fox["arm_a"]))
    assert fox["p_degrades"] > raw  # the plan's repeated p value is larger than the nominal one
    assert {s["spec"]: s["outcome"] for s in fox["specs"]} == {"targets: all": "undecided", "level: lowest": "degrades", "level: half": "degrades"}
    assert fox["robust"] is False
    assert [o["called"] for o in others] == ["not run", "not run"]
