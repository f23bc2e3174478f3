"""The decision rule pinned by known answers: the family over both kinds of verdict (Shaffer), each threshold one step
either side, the interval claim 'small', rate arms as an intersection-union test, seeds planned in advance (alpha
spending, repeated p values), Bonferroni over undeclared looks, and the simulated error control."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from basecap.scorecard.claims import Claim
from basecap.scorecard.robust import combine
from basecap.scorecard.sequential import Plan, boundaries, repeated_p, spent
from basecap.scorecard.simulate import simulate
from basecap.scorecard.verdicts import FAILS, HOLDS, UNDECIDED, claim_tests, decide, family_adjust

ALPHA = 0.05


def _claim(expect="worse", **kw):
    return Claim.model_validate({"id": "c", "section": "4", "paper": "p", "study": "s", "reference": "r", "run": "a", "expect": expect, **kw})


def _row(p_holds: float, p_fails: float, n: int = 5, claim=None, plan=None):
    """A tested row whose tests give exactly these p values (the estimate is a placeholder of the right sign)."""
    claim = claim or _claim()
    t = {"n": n, "mean": 0.1, "sd": 0.05, "ci95": [0.0, 0.2], "p": p_holds, "margin": 0.05, "p_holds": p_holds, "p_fails": p_fails}
    plan = plan or Plan()
    t["p_holds_plan"], t["plan"] = plan.adjust(p_holds, n)
    t["p_fails_plan"], _ = plan.adjust(p_fails, n)
    row = {"claim_obj": claim, "family": True, "test": t, "verdict": None, "detail": "", "plan": plan, "arms": []}
    combine(row)
    return row


def _not_run():
    return {"family": True, "test": None, "verdict": "not run", "detail": ""}


def test_family_adjust_known_answers():
    # each claim has one small and one large p: the divisor stays m (at most one null per claim is true)
    adj = family_adjust([(0.001, 1.0), (0.01, 0.9), (0.02, 0.8)])
    assert [a[0] for a in adj] == pytest.approx([0.003, 0.03, 0.06])
    assert [a[2] for a in adj] == [3, 3, 3]
    # a claim with both of its hypotheses rejected leaves the count: the next step divides by m - 1
    adj = family_adjust([(0.001, 0.002), (0.01, 1.0), (1.0, 1.0)])
    assert adj[0][0] == pytest.approx(0.003) and adj[0][1] == pytest.approx(0.006)
    assert adj[1][2] == 2 and adj[1][0] == pytest.approx(0.02)
    # adjusted p values never fall along the order (running maximum)
    adj = family_adjust([(0.02, 1.0), (0.0001, 1.0)])
    assert adj[0][0] >= adj[1][0]


@pytest.mark.parametrize("kind", ["holds", "fails"])
def test_each_threshold_one_step_either_side(kind):
    """m = 4: a hypothesis decides exactly at p = alpha / 4 and not one step above it."""
    eps = 1e-9
    for p, want in ((ALPHA / 4, HOLDS if kind == "holds" else FAILS), (ALPHA / 4 * (1 + eps), UNDECIDED)):
        rows = [_row(p, 1.0) if kind == "holds" else _row(1.0, p), _not_run(), _not_run(), _not_run()]
        assert decide(rows, ALPHA, 0.8) == 4
        assert rows[0]["verdict"] == want, (p, want)
    # the old two-alpha rule would pass this; the threshold is alpha, not 2 alpha
    rows = [_row(ALPHA / 2, 1.0), _not_run(), _not_run(), _not_run()]
    decide(rows, ALPHA, 0.8)
    assert rows[0]["verdict"] == UNDECIDED


def test_both_kinds_share_one_alpha():
    """Holm within 'holds' alone would step down to alpha / 1 once the first claim holds; in one family with the
    other kind, the first claim's 'fails' null may still be true, so the second claim is still tested at alpha / 2."""
    rows = [_row(0.001, 1.0), _row(0.04, 1.0)]
    decide(rows, ALPHA, 0.8)
    assert [r["verdict"] for r in rows] == [HOLDS, UNDECIDED]
    assert rows[1]["test"]["p_holds_holm"] == pytest.approx(0.08)
    rows = [_row(0.001, 1.0), _row(0.024, 1.0)]
    decide(rows, ALPHA, 0.8)
    assert [r["verdict"] for r in rows] == [HOLDS, HOLDS]


def test_small_is_an_interval_claim():
    small = _claim("small")
    assert small.sign == 1
    inside = claim_tests(small, [0.024, 0.026, 0.025, 0.0255, 0.0245, 0.025], 0.05)
    assert inside["p_holds"] < 1e-4  # 0 < gap < margin shown
    at_zero = claim_tests(small, [-0.001, 0.001, 0.0, 0.0005, -0.0005, 0.0], 0.05)
    assert at_zero["p_holds"] > 0.3  # 0 is not excluded
    beyond = claim_tests(small, [0.2, 0.21, 0.19, 0.2, 0.2, 0.21], 0.05)
    assert beyond["p_fails"] < 1e-4 and beyond["p_holds"] > 0.99  # a harm beyond the margin: not "a little"
    below = claim_tests(small, [-0.2, -0.21, -0.19, -0.2, -0.2, -0.21], 0.05)
    assert below["p_fails"] < 1e-4  # the other way: fails
    # under 'worse', a harm below the margin would have been scored "fails"; under 'small' it holds
    worse = claim_tests(_claim("worse"), [0.024, 0.026, 0.025, 0.0255, 0.0245, 0.025], 0.05)
    assert worse["p_fails"] < 1e-3


def test_arms_are_an_intersection_union_test():
    row = _row(0.001, 1.0)
    row["arms"] = [
        {"label": "A: both at 2e-3", "status": "measured", "test": {"n": 5, "p_holds_plan": 0.004, "p_fails_plan": 1.0}},
        {"label": "B: both at 8e-3", "status": "measured", "test": {"n": 5, "p_holds_plan": 0.3, "p_fails_plan": 0.02}},
    ]
    combine(row)
    assert row["test"]["p_holds_claim"] == 0.3 and row["test"]["p_fails_claim"] == 1.0
    row["arms"][1] = {"label": "B", "status": "waiting", "test": None}
    combine(row)
    assert row["test"]["p_holds_claim"] == 1.0 and "arms still to come: B" in row["arm_note"]


def test_spending_and_boundaries_known_answers():
    # Lan-DeMets O'Brien-Fleming type, one-sided 0.025, looks at t = 0.5 and 1: boundaries 2.963 and 1.969
    # (Jennison & Turnbull 2000, table 7.6 / the usual gsDesign output)
    c = boundaries((0.5, 1.0), 0.025, "obrien_fleming")
    assert c[0] == pytest.approx(2.963, abs=2e-3) and c[1] == pytest.approx(1.969, abs=2e-3)
    assert spent(1.0, 0.05, "obrien_fleming") == pytest.approx(0.05) and spent(1.0, 0.05, "pocock") == pytest.approx(0.05)
    # one look: the fixed-sample test
    assert boundaries((1.0,), 0.05, "pocock")[0] == pytest.approx(stats.norm.isf(0.05))
    assert repeated_p(0.013, 0, (1.0,), "obrien_fleming") == pytest.approx(0.013, rel=1e-6)
    # the design's size is alpha (simulated on the canonical joint distribution)
    rng = np.random.default_rng(1)
    fr = (0.6, 1.0)
    cc = np.array(boundaries(fr, 0.05, "obrien_fleming"))
    inc = rng.normal(size=(200_000, 2)) * np.sqrt(np.diff((0.0, *fr)))
    z = inc.cumsum(1) / np.sqrt(fr)
    assert (z >= cc).any(1).mean() == pytest.approx(0.05, abs=0.003)


def test_plans_read_p_values():
    planned = Plan(looks=(3, 5))
    p_final, how = planned.adjust(0.02, 5)
    assert 0.02 < p_final < 0.025 and "look 2 of 2" in how  # the final look pays a little for the first
    p_first, how = planned.adjust(0.001, 3)
    assert p_first > 0.001 and "look 1 of 2" in how  # the first look is strict
    assert planned.adjust(0.001, 2)[0] == 1.0  # before the first look: not read
    undeclared = Plan(looks_taken=(3,))
    assert undeclared.adjust(0.01, 5) == (0.02, "read after undeclared looks at 3 seeds: Bonferroni over 2 looks")
    assert undeclared.adjust(0.01, 3)[0] == 0.01  # the look itself
    assert undeclared.nominal_level(0.05, 5) == 0.025
    assert Plan().adjust(0.3, 5) == (0.3, "")


def test_undeclared_looks_make_a_verdict_more_conservative():
    rows = [_row(0.015, 1.0, plan=Plan(looks_taken=(3,))), _not_run()]
    decide(rows, ALPHA, 0.8)
    assert rows[0]["verdict"] == UNDECIDED  # m 2 x looks 2 x 0.015 > 0.05
    rows = [_row(0.015, 1.0), _not_run()]
    decide(rows, ALPHA, 0.8)
    assert rows[0]["verdict"] == HOLDS


def test_the_interval_is_the_one_the_verdict_used():
    """A 'holds' decided at divisor d prints the two-sided 1 - alpha/d interval (not Bonferroni at the first step)."""
    claim = _claim()
    values = [0.10, 0.12, 0.09, 0.11, 0.10]
    t = claim_tests(claim, values, 0.05)
    row = _row(t["p_holds"], t["p_fails"], claim=claim)
    row["test"].update(mean=t["mean"], sd=t["sd"])
    rows = [row, _not_run(), _not_run()]
    decide(rows, ALPHA, 0.8)
    assert row["verdict"] == HOLDS and row["test"]["ci_corrected_level"] == pytest.approx(1 - ALPHA / 3)
    half = stats.t.ppf(1 - ALPHA / 6, 4) * t["sd"] / math.sqrt(5)
    assert row["test"]["ci_corrected"] == pytest.approx([t["mean"] - half, t["mean"] + half])


def test_simulated_error_control_is_at_most_alpha():
    """A small family on its nulls' boundaries: the chance of any false verdict stays at or under alpha (3 standard
    errors of a 300-family simulation), both kinds together."""
    claims = []
    for i, (expect, direction) in enumerate([("worse", None), ("worse", None), ("no_effect", None), ("small", None), ("trend", "rises")]):
        claims.append(
            {
                "id": f"c{i}",
                "family": True,
                "expect": expect,
                "direction": direction,
                "test": {"n": 5, "sd": 0.04, "margin": 0.05},
            }
        )
    card = {"alpha": ALPHA, "margin": 0.05, "claims": claims}
    sim = simulate(card, n_sim=300, seed=3)
    assert {c["configuration"] for c in sim["configurations"]} == {"holds_boundary", "fails_boundary", "mixed", "undeclared_look"}
    for c in sim["configurations"]:
        assert c["any_false"] <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 300), c


def test_an_arm_that_cannot_reach_the_band_is_read_at_its_pairs_rule_band():
    """DeltaNet at 2e-3 never anneals to 4.0 on every seed (published records), so arm A of `deltanet_worse` is read at
    the band of the study's width from the lowest level both runs reach, rounded up to 0.05; a pair that reaches the
    study's band keeps it."""
    from pathlib import Path

    from basecap.scorecard.compute import load_study
    from basecap.scorecard.robust import pair_band

    study = load_study(Path(__file__).resolve().parents[1] / "results" / "architectures_rate_arms")
    moved = pair_band(_claim(run="deltanet_lr2e-3", reference="transformer_pp", study="architectures_rate_arms"), study)
    assert moved is not None and moved["band"] == [4.1, 4.3]
    assert 4.05 < moved["common"][0] <= 4.1
    assert pair_band(_claim(run="mamba2_lr2e-3", reference="transformer_pp", study="architectures_rate_arms"), study) is None


def test_an_unreadable_arm_keeps_the_claim_undecided_and_says_so():
    row = _row(0.001, 1.0)
    row["arms"] = [{"label": "A: both at 2e-3", "status": "unreadable", "test": None}]
    combine(row)
    assert row["test"]["p_holds_claim"] == 1.0 and "no band to read: A" in row["arm_note"]


def test_a_claims_own_comparison_that_cannot_reach_the_band_is_read_at_its_rule_band_and_says_so():
    """Top-1 Element at its tuned rate (4e-3) anneals no lower than about 4.15 in-domain (published records), so its
    tuned comparison with Transformer++ is read at the pair's rule band, as an arm is, and the verdict's detail says
    where; a pair that holds the study's band keeps it."""
    from pathlib import Path

    from basecap.scorecard import _own_band

    study_dir = Path(__file__).resolve().parents[1] / "results" / "top1_annealed"
    from basecap.scorecard.compute import load_study

    study = load_study(study_dir)
    row: dict = {}
    band = _own_band(row, _claim(run="top1_element", reference="transformer_pp", study="top1_annealed"), study)
    assert band == (4.15, 4.35) and row["band"] == [4.15, 4.35] and "read at 4.15-4.35" in row["band_note"]
    held: dict = {}
    assert _own_band(held, _claim(run="top1_chunk_exact", reference="transformer_pp", study="top1_annealed"), study) is None
    assert held == {}
    r = _row(0.5, 0.5)
    r["band_note"] = row["band_note"]
    decide([r], ALPHA, 0.8)
    assert r["verdict"] == UNDECIDED and "read at 4.15-4.35" in r["detail"]
