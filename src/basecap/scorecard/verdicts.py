"""Verdicts of the claims file as one family: holds, fails, undecided (with what would decide it), not run.

Every claim that can be tested at the CPU scale is a member of the family, run or not (a claim not run yet has
p = 1), so a verdict given now stands when the other studies land. Each claim has two tests:

- holds: a direction (worse / better, a trend's sign, an interaction's sign) shown by the two-sided test in the
  paper's direction; no_effect shown by TOST against the margin;
- fails: for a direction, the statistic shown below the margin in the paper's direction (this covers a difference
  shown the other way and an equivalence to 0); for no_effect, a difference shown beyond the margin.

Holm runs over the family's 'holds' p values, and separately over its 'fails' p values, so the chance of any false
'holds' and the chance of any false 'fails' are each at most alpha. Definitions: docs/metrics.md, "The scorecard".
"""

from __future__ import annotations

import math

from ..report import equivalence as eq
from ..report.stats import holm, paired_test, simultaneous_ci

HOLDS, FAILS, UNDECIDED, NOT_RUN, UNTESTABLE = "holds", "fails", "undecided", "not run", "no study"
LEAN = {"pair": ("worse", "better"), "trend": ("rises", "falls"), "interaction": ("larger", "smaller")}


def claim_margin(claim, margin: float) -> float:
    """The margin of a claim's statistic: the gap margin, or for a trend the slope that changes the gap by the
    margin over the whole range of x (per doubling of x)."""
    if claim.expect == "trend":
        xs = list(claim.x.values())
        return margin / math.log2(max(xs) / min(xs))
    return margin


def _design(claim) -> str:
    return claim.expect if claim.expect in ("trend", "interaction") else "pair"


def claim_tests(claim, values: list[float], margin: float) -> dict:
    """Estimate, 95% interval and the two uncorrected tests of one claim's per-seed values."""
    t = paired_test(values)
    out = {
        "n": t.n,
        "mean": t.mean,
        "sd": t.sd,
        "ci95": list(t.ci95) if t.ci95 else None,
        "p": t.p,
        "margin": margin,
        "p_holds": 1.0,
        "p_fails": 1.0,
        "p_equivalence": None,
    }
    if t.n < 2:
        return out
    out["p_equivalence"] = eq.tost(values, margin)["p"]
    if claim.sign == 0:
        out["p_holds"], out["p_fails"] = out["p_equivalence"], eq.beyond_margin_p(values, margin)
    else:
        s = claim.sign
        out["p_holds"] = min(1.0, 2 * eq.one_sided_p([s * v for v in values], 0.0, "greater"))
        out["p_fails"] = eq.below_margin_p(values, margin, s)
    return out


def decide(rows: list[dict], alpha: float, power: float) -> int:
    """Holm over the family (rows with ``family``) on 'holds' and on 'fails' p values; sets each tested row's
    verdict, corrected interval, and for an undecided one its lean, minimum detectable effect and the seeds that
    would decide it. Returns the family size m."""
    fam = [r for r in rows if r["family"]]
    m = len(fam)
    for key in ("p_holds", "p_fails"):
        for r, ph in zip(fam, holm([r["test"][key] if r.get("test") else 1.0 for r in fam])):
            if r.get("test"):  # a claim not run counts in m with p = 1
                r["test"][key + "_holm"] = ph
    for r in fam:
        t = r.get("test")
        if t is None:
            continue
        claim = r["claim_obj"]
        if t["n"] < 2:
            r["verdict"], r["detail"] = UNDECIDED, f"too few seeds ({t['n']})"
            continue
        # the corrected interval of the claim's 'holds' test (Bonferroni at the family's first Holm step):
        # two-sided 1 - alpha/m for a direction, 1 - 2 alpha/m (the interval TOST at alpha/m corresponds to) for no_effect
        level = 2 * alpha if claim.sign == 0 else alpha
        ci = simultaneous_ci(t["n"], t["mean"], t["sd"], m, level)
        t["ci_corrected"], t["ci_corrected_level"] = (list(ci) if ci else None), 1 - level / m
        if t["p_holds_holm"] < alpha:
            r["verdict"] = HOLDS
            r["detail"] = (
                f"but within the margin (+/-{t['margin']:.3g}): a difference too small to matter" if claim.sign and t["p_fails_holm"] < alpha else ""
            )
        elif t["p_fails_holm"] < alpha:
            r["verdict"], r["detail"] = FAILS, ""
        else:
            r["verdict"] = UNDECIDED
            _undecided(r, claim, t, alpha / m, power)
    return m


def _undecided(r: dict, claim, t: dict, a: float, power: float) -> None:
    """What an undecided claim could have detected and what would decide it, at the family's first Holm level a
    (alpha/m): the minimum detectable effect (a direction) or the smallest equivalence margin provable (no_effect)
    at 80% power with the observed seed sd, and the seeds at which the holds or the fails test reaches that power if
    the truth is the estimate."""
    up, down = LEAN[_design(claim)]
    mean, sd, n, margin, s = t["mean"], t["sd"], t["n"], t["margin"], claim.sign
    t["lean"] = up if mean > 0 else down if mean < 0 else None
    if not sd or sd <= 0 or not math.isfinite(sd):
        r["detail"] = f"leans {t['lean']}" if t["lean"] else ""
        return
    if s:
        t["mde"] = eq.mde(sd, n, a, power)
        tests = {
            HOLDS: (lambda k: eq.power_two_sided(mean, sd, k, a)) if s * mean > 0 else None,
            FAILS: (lambda k: eq.power_one_sided(margin - s * mean, sd, k, a / 2)) if margin - s * mean > 0 else None,
        }
    else:
        t["mde"] = eq.equivalence_bound(sd, n, a, power)
        tests = {
            HOLDS: (lambda k: eq.power_tost(mean, sd, k, margin, a)) if abs(mean) < margin else None,
            FAILS: (lambda k: eq.power_one_sided(abs(mean) - margin, sd, k, a / 2)) if abs(mean) > margin else None,
        }
    needed = {v: eq.seeds_needed(f, power) for v, f in tests.items() if f is not None}
    need = {v: k for v, k in needed.items() if k is not None}
    t["seeds_to_decide"], t["would_be"] = (min(need.values()), min(need, key=lambda v: need[v])) if need else (None, None)
    what = "MDE" if s else "provable margin"
    decide_txt = (
        f"{t['seeds_to_decide']} seeds would decide it ({t['would_be']}) if the truth is the estimate"
        if need
        else f"more than {eq.MAX_SEEDS} seeds to decide it at this estimate"
    )
    direction = "" if not s or not t["lean"] else (", the paper's direction" if (mean > 0) == (s > 0) else ", against the paper")
    r["detail"] = f"leans {t['lean']}{direction}; {what} {t['mde']:.3f} at {n} seeds; {decide_txt}"
