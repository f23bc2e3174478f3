"""Scores that are not losses (scorecard/metrics.py): a speed ratio tested on the log scale (Welch over the benchmark's
repeats) and an accuracy in points (a paired t-test over seeds, or a difference of proportions over one seed's
examples), each with its own margin; made-up records in a temporary directory, each threshold one step either side,
and the claims file's validation of a margin that does not fit its metric."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from scipy import stats

from basecap.config_base import ConfigError
from basecap.report.runs import Run
from basecap.scorecard import build_scorecard
from basecap.scorecard.claims import ClaimsFile
from basecap.scorecard.compute import Study
from basecap.scorecard.metrics import SPEED_SCHEMA, metric_row, proportion_tests, read_speed, summary_tests, welch_tests
from basecap.scorecard.verdicts import FAILS, HOLDS, UNDECIDED, claim_margin, claim_tests, decide

ROOT = Path(__file__).resolve().parents[1]
ALPHA, M = 0.05, 4  # a family of the claim under test and three claims not run: the first step divides by 4


def _file(claims: list[dict], studies: dict | None = None) -> ClaimsFile:
    return ClaimsFile.model_validate(
        {
            "margin": 0.05,
            "margin_reason": "r",
            "domains": ["docs", "code"],
            "studies": studies or {"s": {"experiment": "longctx_cpu.toml", "size": "small"}},
            "claims": claims,
        }
    )


def _speed_claim(**kw) -> dict:
    return {
        "id": "speed",
        "section": "7",
        "paper": "p",
        "study": "s",
        "expect": "better",
        "run": "top1_chunk",
        "reference": "transformer_pp",
        "metric": "speed_ratio",
        "margin": 2.0,
        "at": {"kind": "train", "T": 65536, "threads": 1},
        "bench_names": {"top1_chunk": "top1_chunk_approx"},
        **kw,
    }


def _acc_claim(**kw) -> dict:
    return {
        "id": "acc",
        "section": "7",
        "paper": "p",
        "study": "s",
        "expect": "no_effect",
        "run": "top1_chunk",
        "reference": "transformer_pp",
        "metric": "accuracy",
        "margin": 10.0,
        "score": [{"suite": "niah", "key": "accuracy_by_length.16384"}],
        **kw,
    }


def test_a_margin_that_does_not_fit_the_metric_is_an_error():
    for bad, match in [
        (_speed_claim(margin=0.5), "a ratio above 1"),
        (_speed_claim(margin=None), "states its own margin"),
        (_speed_claim(at={}), "at: a speed_ratio claim names its benchmark record"),
        (_speed_claim(bench_names={"mamba2": "x"}), "bench_names"),
        (_speed_claim(records="../speed.json"), "records"),
        (_acc_claim(margin=0.0), "in points, in \\(0, 100\\)"),
        (_acc_claim(margin=150.0), "in points"),
        (_acc_claim(score=[]), "score: an accuracy claim"),
        (_acc_claim(expect="small"), "worse, better or no_effect"),
        (_acc_claim(arms=[{"label": "A", "study": "s", "run": "a", "reference": "b"}]), "no arms"),
        ({"id": "loss", "section": "4", "paper": "p", "study": "s", "expect": "worse", "run": "a", "reference": "b", "margin": 0.1}, "margin"),
    ]:
        with pytest.raises(Exception, match=match):
            _file([bad])
    with pytest.raises(Exception, match="analogue_of"):
        _file([_acc_claim(analogue_of="acc")])
    f = _file([_speed_claim(), _acc_claim()])
    speed, acc = f.claims
    assert claim_margin(speed, 0.05) == pytest.approx(math.log(2)) and claim_margin(acc, 0.05) == 10.0
    # higher is better: 'better' expects a positive statistic (the loss gap's 'better' is negative)
    assert speed.sign == 1 and acc.sign == 0 and _file([_acc_claim(expect="worse")]).claims[0].sign == -1


def test_welch_and_summary_tests_agree_with_scipy():
    c = _file([_speed_claim()]).claims[0]
    run_s, ref_s = [0.50, 0.55, 0.52, 0.49], [2.1, 2.4, 2.2]
    t = welch_tests(c, run_s, ref_s, math.log(2))
    x, y = [-math.log(v) for v in run_s], [-math.log(v) for v in ref_s]
    assert t["mean"] == pytest.approx(sum(x) / 4 - sum(y) / 3)
    assert t["p"] == pytest.approx(stats.ttest_ind(x, y, equal_var=False).pvalue, rel=1e-9)
    # holds: the two-sided test in the claim's direction (faster); fails: a speed-up of the margin's size ruled out
    assert t["p_holds"] == pytest.approx(2 * stats.ttest_ind(x, y, equal_var=False, alternative="greater").pvalue, rel=1e-9)
    shifted = [v - math.log(2) for v in x]
    assert t["p_fails"] == pytest.approx(min(1, 2 * stats.ttest_ind(shifted, y, equal_var=False, alternative="less").pvalue), rel=1e-9)
    ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    assert t["ci95"] == pytest.approx([ci.low, ci.high], rel=1e-9)
    assert welch_tests(c, [0.5], ref_s, math.log(2))["n"] == 1  # one repeat: no test
    # with per-seed values, the t summary gives claim_tests' numbers (the one-sample test is the same test)
    acc = _file([_acc_claim()]).claims[0]
    vals = [3.0, -2.0, 4.5, 1.0]
    one = claim_tests(acc, vals, 10.0)
    sd = stats.tstd(vals)
    two = summary_tests(acc, sum(vals) / 4, sd / 2, 3, 10.0)
    for k in ("p", "p_holds", "p_fails", "p_equivalence"):
        assert two[k] == pytest.approx(one[k], rel=1e-9), k


def test_proportions_are_agresti_caffo():
    c = _file([_acc_claim(expect="better", margin=5.0)]).claims[0]
    t = proportion_tests(c, (0.75, 20), (0.40, 20), 5.0)
    p1, p2 = 16 / 22, 9 / 22  # 15 + 1 of 20 + 2, 8 + 1 of 20 + 2
    se = 100 * math.sqrt(p1 * (1 - p1) / 22 + p2 * (1 - p2) / 22)
    assert t["mean"] == pytest.approx(100 * (p1 - p2)) and t["se"] == pytest.approx(se)
    assert t["p_holds"] == pytest.approx(2 * stats.norm.sf(100 * (p1 - p2) / se))
    assert t["p_fails"] == pytest.approx(min(1, 2 * stats.norm.cdf((100 * (p1 - p2) - 5) / se)))
    assert t["units"] == "examples" and t["n"] == 40


def _row(claims: ClaimsFile, tmp: Path, studies: dict | None = None) -> dict:
    c = claims.claims[0]
    row = {"id": c.id, "family": True, "claim_obj": c, "test": None, "verdict": "not run", "detail": "", "seeds": [], "results": None}
    from basecap.scorecard.robust import plan_of

    metric_row(row, c, claims, studies or {}, tmp, plan_of(claims, c.study))
    return row


def _decide(row: dict) -> str:
    rows = [row] + [{"family": True, "test": None, "verdict": "not run", "detail": ""} for _ in range(M - 1)]
    assert decide(rows, ALPHA, 0.8) == M
    return row["verdict"]


def _speed_json(tmp: Path, run_s: list[float], ref_s: list[float], status: str = "ok") -> None:
    d = tmp / "results" / "s"
    d.mkdir(parents=True, exist_ok=True)
    at = {"kind": "train", "T": 65536, "threads": 1}
    rows = [
        {"variant": "top1_chunk_approx", **at, "status": status, "reason": "r", "step_s_all": run_s},
        {"variant": "transformer_pp", **at, "status": "ok", "reason": None, "step_s_all": ref_s},
        {"variant": "transformer_pp", "kind": "train", "T": 16384, "threads": 1, "status": "ok", "step_s_all": [1.0, 1.1]},
    ]
    (d / "speed.json").write_text(json.dumps({"schema": SPEED_SCHEMA, "rows": rows}))


def test_speed_ratio_thresholds_one_step_either_side(tmp_path):
    """A speed claim ('better', at least 2x) decides exactly where its Welch test crosses alpha / m: the run's times
    scaled so that the log ratio sits at each threshold, then one relative step of 1e-6 to either side. Below the
    'fails' threshold the speed-up is still shown (holds), but an effect of the margin's size is ruled out."""
    claims = _file([_speed_claim()])
    ref = [4.0, 4.2, 3.9, 4.1]
    base = [1.0, 1.05, 0.97, 1.02]
    t0 = welch_tests(claims.claims[0], base, ref, math.log(2))
    se, df, est0 = t0["se"], t0["df"], t0["mean"]
    q = stats.t.isf(ALPHA / M / 2, df)  # both tests are doubled one-sided tests: each decides at its 1 - a/2 quantile

    def at(est: float) -> dict:
        scale = math.exp(est0 - est)  # run times x scale shift the log ratio by -log(scale)
        _speed_json(tmp_path, [v * scale for v in base], ref)
        row = _row(claims, tmp_path)
        assert row["test"]["mean"] == pytest.approx(est, rel=1e-9)
        _decide(row)
        return row

    shown, not_shown = at(q * se * (1 + 1e-6)), at(q * se * (1 - 1e-6))
    assert shown["test"]["p_holds_holm"] <= ALPHA < not_shown["test"]["p_holds_holm"]
    assert shown["verdict"] == HOLDS and not_shown["verdict"] == FAILS  # this close to 1x, 2x is ruled out either way
    below, above = at((math.log(2) - q * se) * (1 - 1e-6)), at((math.log(2) - q * se) * (1 + 1e-6))
    assert below["test"]["p_fails_holm"] <= ALPHA < above["test"]["p_fails_holm"]
    assert below["verdict"] == above["verdict"] == HOLDS and "within the margin" in below["detail"] and not above["detail"]
    slower = at(-(math.log(2) - q * se) * (1 + 1e-6))  # the run slower: the speed-up ruled out, nothing shown
    assert slower["verdict"] == FAILS
    # nothing to test: a row that was not measured, or no file
    _speed_json(tmp_path, base, ref, status="out_of_memory")
    row = _row(claims, tmp_path)
    assert row["test"] is None and "top1_chunk_approx out of memory" in row["detail"]
    (tmp_path / "results" / "s" / "speed.json").unlink()
    assert "speed.json not published yet" in _row(claims, tmp_path)["detail"]


def test_a_speed_file_read_after_an_earlier_one_counts_that_look(tmp_path):
    """A benchmark measured again after a first file was read (looks_taken, the first file's repeats) is read by
    Bonferroni over both looks: its p values doubled, and the row says so in repeats, not seeds."""
    ref, base = [4.0, 4.2, 3.9, 4.1], [1.0, 1.05, 0.97, 1.02]
    _speed_json(tmp_path, base, ref)
    once = _row(_file([_speed_claim()]), tmp_path)["test"]
    again = _row(_file([_speed_claim(looks_taken=[4], looks_reason="a first file")]), tmp_path)["test"]
    assert again["p_holds_plan"] == pytest.approx(min(1.0, 2 * once["p_holds"]))
    assert again["p_fails_plan"] == pytest.approx(min(1.0, 2 * once["p_fails"]))
    assert once["p_holds_plan"] == once["p_holds"] and not once["plan"]
    assert again["plan"] == "read after undeclared looks at 4 repeats: Bonferroni over 2 looks"
    for bad, match in [(_speed_claim(looks_taken=[4]), "looks_reason"), (_speed_claim(looks_taken=[1], looks_reason="r"), "at least 2")]:
        with pytest.raises(Exception, match=match):
            _file([bad])
    with pytest.raises(Exception, match="looks_taken"):
        _file([_acc_claim(looks_taken=[4], looks_reason="r")])


def test_a_speed_file_of_another_schema_is_an_error(tmp_path):
    p = tmp_path / "speed.json"
    p.write_text(json.dumps({"meta": {}, "results": {}}))
    with pytest.raises(ConfigError, match="schema"):
        read_speed(p)


def _study(tmp: Path, scores: dict[tuple[str, int], float | None], samples: int = 4) -> dict:
    """A published study of made-up run records holding only their niah suite result at 16384 tokens."""
    runs = {}
    for (name, seed), acc in scores.items():
        d = tmp / "results" / "s" / "runs" / f"{name}-s{seed}"
        d.mkdir(parents=True, exist_ok=True)
        if acc is not None:
            cells = [{"length": 16384, "depth": x, "accuracy": acc} for x in (0.0, 0.5, 1.0, 0.25, 0.75)]
            (d / "eval_niah.json").write_text(json.dumps({"accuracy_by_length": {"16384": acc}, "cells": cells, "samples": samples}))
        runs[(name, seed)] = Run(d, f"{name}-s{seed}", name, seed, {})
    return {"s": Study("s", tmp / "results" / "s", runs, {}, {})}


def test_accuracy_over_seeds_thresholds_one_step_either_side(tmp_path):
    """No effect within 10 points, paired by seed: TOST decides exactly at alpha / m; a difference beyond the margin
    fails at its own threshold."""
    claims = _file([_acc_claim()])
    ref = {0: 0.50, 1: 0.60, 2: 0.55, 3: 0.45}
    spread = [0.02, -0.03, 0.0, 0.01]  # run - ref before the shift
    diffs = [100 * s for s in spread]
    sd, n = stats.tstd(diffs), len(diffs)
    se, q = sd / math.sqrt(n), stats.t.isf(ALPHA / M, n - 1)  # TOST: each one-sided test at a
    q2 = stats.t.isf(ALPHA / M / 2, n - 1)  # 'fails': the doubled one-sided test
    mean0 = sum(diffs) / n
    for target, inside, outside in [(10.0 - q * se, HOLDS, UNDECIDED), (10.0 + q2 * se, FAILS, UNDECIDED)]:
        for step, want in ((1 - 1e-6, inside), (1 + 1e-6, outside)) if inside == HOLDS else ((1 + 1e-6, inside), (1 - 1e-6, outside)):
            shift = (target * step - mean0) / 100
            scores = {("transformer_pp", s): v for s, v in ref.items()}
            scores |= {("top1_chunk", s): ref[s] + spread[s] + shift for s in ref}
            row = _row(claims, tmp_path, _study(tmp_path, scores))
            assert row["test"]["units"] == "seeds" and row["test"]["mean"] == pytest.approx(target * step, rel=1e-9)
            assert _decide(row) == want, (target, step)
    # a seed without its suite result is left out; none at all: not run, saying which results are missing
    row = _row(claims, tmp_path, _study(tmp_path / "none", {("transformer_pp", 0): None, ("top1_chunk", 0): 0.5}))
    assert row["test"] is None and "no suite results niah" in row["detail"]


def test_accuracy_of_one_seed_is_a_difference_of_proportions_one_count_either_side(tmp_path):
    """One seed each: the examples are the units (5 cells x 8 prompts = 40 a side); 'better' by a 5-point margin holds
    from the count the Agresti-Caffo test, computed here, first passes alpha / m, and not one count below."""
    claims = _file([_acc_claim(expect="better", margin=5.0)])
    n, ref_hits = 40, 12

    def passes(hits: int) -> bool:  # the test by hand: two-sided normal test of the adjusted difference
        p1, p2 = (hits + 1) / (n + 2), (ref_hits + 1) / (n + 2)
        se = math.sqrt(p1 * (1 - p1) / (n + 2) + p2 * (1 - p2) / (n + 2))
        return 2 * stats.norm.sf((p1 - p2) / se) <= ALPHA / M

    first = next(h for h in range(n + 1) if passes(h))
    for hits, want in ((first, HOLDS), (first - 1, UNDECIDED)):
        study = _study(tmp_path / str(hits), {("transformer_pp", 0): ref_hits / n, ("top1_chunk", 0): hits / n}, samples=8)
        row = _row(claims, tmp_path, study)
        assert row["test"]["units"] == "examples" and row["test"]["examples"] == [n, n]
        assert _decide(row) == want, hits


def test_metric_claims_enter_the_family_and_gpu_claims_a_family_of_their_own(tmp_path):
    """In build_scorecard: a CPU metric claim is one of the family's m (not run: p = 1); a claim at the paper's GPU
    scale is outside it, and once its records exist it is decided in the GPU claims' own family."""
    root = tmp_path / "repo"
    (root / "experiments" / "paper").mkdir(parents=True)
    for f in ("longctx_cpu.toml",):
        shutil.copy(ROOT / "experiments" / "paper" / f, root / "experiments" / "paper" / f)
    at = '{ kind = "train", T = 65536, threads = 1 }'
    speed = f'metric = "speed_ratio"\nmargin = 2.0\nat = {at}\nbench_names = {{ top1_chunk = "top1_chunk_approx" }}\n'
    pair = 'run = "top1_chunk"\nreference = "transformer_pp"\n'
    (root / "experiments" / "paper" / "claims.toml").write_text(
        'margin = 0.05\nmargin_reason = "r"\ndomains = ["docs", "code"]\n'
        '[studies.s]\nexperiment = "longctx_cpu.toml"\nsize = "small"\n[studies.g]\nexperiment = "longctx_cpu.toml"\nsize = "small"\n'
        f'[[claims]]\nid = "speed"\nsection = "7"\npaper = "p"\nstudy = "s"\nexpect = "better"\n{pair}{speed}'
        f'[[claims]]\nid = "acc"\nsection = "7"\npaper = "p"\nstudy = "s"\nexpect = "no_effect"\n{pair}analogue_of = "gpu_speed"\n'
        'metric = "accuracy"\nmargin = 10.0\nscore = [{ suite = "niah", key = "accuracy_by_length.16384" }]\n'
        f'[[claims]]\nid = "gpu_speed"\nsection = "7"\npaper = "p"\nstudy = "g"\ngpu = "a GPU"\nexpect = "better"\n{pair}{speed}'
    )
    card = build_scorecard(root)
    assert card["family_size"] == 2 and card["gpu_family_size"] == 1 and card["principle"] is None
    assert all(r["verdict"] == "not run" for r in card["claims"])
    _speed_json(root, [1.0, 1.02, 0.98], [4.0, 4.1, 3.95])  # results/s/speed.json
    shutil.copytree(root / "results" / "s", root / "results" / "g")
    rows = {r["id"]: r for r in build_scorecard(root)["claims"]}
    assert rows["speed"]["verdict"] == HOLDS and rows["gpu_speed"]["verdict"] == HOLDS
    assert rows["speed"]["test"]["divisor_holds"] == 2 and rows["gpu_speed"]["test"]["divisor_holds"] == 1
    assert rows["acc"]["analogue_of"] == "gpu_speed"
    from basecap.scorecard.render_claims import scorecard_markdown

    ratio = math.exp(sum(math.log(v) for v in (4.0, 4.1, 3.95)) / 3 - sum(math.log(v) for v in (1.0, 1.02, 0.98)) / 3)
    text = scorecard_markdown(build_scorecard(root))
    assert "(CPU analogue of `gpu_speed`)" in text and f"{ratio:.2f}x" in text
