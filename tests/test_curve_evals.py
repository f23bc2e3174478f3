"""eval.curve_max_tokens: the main run's evaluations before its last step on fewer tokens; annealed points and the
last evaluation on eval.max_tokens."""

from __future__ import annotations

from basecap.records import anneals, evals
from basecap.rundir import RunDir
from basecap.train import train
from test_train import run_cfg


def scored(rec) -> int:
    return sum(d["tokens"] for d in rec["domains"].values())


def test_curve_evaluations_are_smaller_and_the_compared_points_are_not(tiny_corpus, tiny_recipe_path, tmp_path):
    whole = run_cfg(tiny_recipe_path, steps=12, schedule="wsd", cooldowns=[4], cooldown_fraction=0.5)
    small = run_cfg(tiny_recipe_path, steps=12, schedule="wsd", cooldowns=[4], cooldown_fraction=0.5)
    small = small.model_copy(update={"eval": small.eval.model_copy(update={"curve_max_tokens": 64})})
    train(whole, tmp_path / "whole", corpus=tiny_corpus, log=lambda *_: None)
    train(small, tmp_path / "small", corpus=tiny_corpus, log=lambda *_: None)
    a, b = RunDir(tmp_path / "whole").read_metrics(), RunDir(tmp_path / "small").read_metrics()
    ea, eb = evals(a), evals(b)
    assert [r["step"] for r in eb] == [4, 8, 12]
    assert [scored(r) for r in eb[:-1]] == [2 * 64, 2 * 64] and scored(eb[-1]) == scored(ea[-1]) > 2 * 64  # 2 domains x 2 windows of 32
    assert [scored(r) for r in anneals(b)] == [scored(r) for r in anneals(a)]
    # the training itself is the same: the same losses step for step, the same compared points
    assert [r["loss"] for r in a if r["kind"] == "train"] == [r["loss"] for r in b if r["kind"] == "train"]
    assert eb[-1]["in_domain_loss"] == ea[-1]["in_domain_loss"] and anneals(b)[0]["domains"] == anneals(a)[0]["domains"]


def test_no_verdict_of_the_comparison_design_reads_a_main_run_evaluation(monkeypatch):
    """Why curve evaluations may be smaller: drop every main-run evaluation but each run's last from every published
    record, and every claim read in the comparison design keeps its estimate and verdict (the two that move read
    studies of the old design, whose legacy measure is the main run's evaluations)."""
    from pathlib import Path

    from basecap import rundir
    from basecap.scorecard import build_scorecard
    from basecap.scorecard.compute import load_study

    root = Path(__file__).resolve().parents[1]
    before = build_scorecard(root)
    read = rundir.RunDir.read_metrics

    def without_curves(self):
        recs = read(self)
        last = max((r["step"] for r in evals(recs)), default=None)
        return [r for r in recs if r["kind"] != "eval" or r["step"] == last]

    monkeypatch.setattr(rundir.RunDir, "read_metrics", without_curves)
    after = build_scorecard(root)
    studies = {s: load_study(root / "results" / s) for s in before["studies"]}
    old_design = {s for s, st in studies.items() if st is not None and not (st.summary.get("design") or {}).get("band")}
    moved = []
    for a, b in zip(before["claims"], after["claims"]):
        ta, tb = a.get("test") or {}, b.get("test") or {}
        if (ta.get("mean"), a["verdict"]) != (tb.get("mean"), b["verdict"]):
            moved.append(a["id"])
            assert a.get("kind") == "principle" or a["results"] in old_design, a["id"]
    assert len(moved) < len(before["claims"]) // 4
