"""Verdicts of the claims file as one family: holds, fails, undecided (with what would decide it), not run.

Every claim that can be tested at the CPU scale is a member of the family, run or not (a claim not run yet has
p = 1), so a verdict given now stands when the other studies land. Each claim has two tests:

- holds: a direction (worse / better, a trend's sign, an interaction's sign) shown by the two-sided test in the
  paper's direction; no_effect shown by TOST against the margin; small (0 < gap < margin) shown by both one-sided
  tests (an intersection-union test);
- fails: for a direction, an effect of the paper's size ruled out: the statistic shown below the margin in the
  paper's direction (this covers a difference shown the other way and an equivalence to 0); for no_effect, a
  difference shown beyond the margin; for small, the gap shown outside (0, margin).

A claim with arms (``arms`` in claims.toml: the learning rate held equal) holds only if it holds in its own
comparison and in every arm, and fails only if it fails in all of them: its p values are the largest of its
specifications' (an intersection-union test needs no correction across its parts). A study's seeds are read by its
plan (``sequential``). Then one family over both kinds of verdict: Holm over the 2m 'holds' and 'fails' hypotheses
with Shaffer's logical constraint. A claim's 'holds' null and its 'fails' null exclude each other (the gap cannot
be both at most 0 and at least the margin, nor both inside and outside it), so at most m of the 2m nulls are true,
and at step j the divisor is the number of claims that still have an untested hypothesis (never more than m): the
chance of any false verdict, 'holds' or 'fails', is at most alpha (Shaffer 1986). Definitions: docs/metrics.md,
"The scorecard".
"""

from __future__ import annotations

import math
from typing import Any

from scipy import stats

from ..report import equivalence as eq
from ..report.stats import paired_test, simultaneous_ci
from .rows import ClaimRow

HOLDS, FAILS, UNDECIDED, NOT_RUN, UNTESTABLE = "holds", "fails", "undecided", "not run", "no study"
LEAN = {"pair": ("worse", "better"), "trend": ("rises", "falls"), "interaction": ("larger", "smaller")}


def claim_margin(claim: Any, margin: float) -> float:
    """The margin of a claim's statistic: the gap margin, or for a trend the slope that changes the gap by the
    margin over the whole range of x (per doubling of x); a claim with another metric states its own (a speed
    ratio's is tested as its log)."""
    if claim.metric == "speed_ratio":
        return math.log(claim.margin)
    if claim.metric != "ood_gap":
        return claim.margin
    if claim.expect == "trend":
        xs = list(claim.x.values())
        return margin / math.log2(max(xs) / min(xs))
    return margin


def _design(claim: Any) -> str:
    return claim.expect if claim.expect in ("trend", "interaction") else "pair"


def _lean_words(claim: Any) -> tuple[str, str]:
    """The words for a positive and a negative estimate (a higher accuracy or speed is better)."""
    up, down = LEAN[_design(claim)]
    return (down, up) if claim.higher_is_better else (up, down)


def corrected_interval(t: dict, level: float) -> tuple[float, float] | None:
    """The two-sided interval at ``level`` of a claim's estimate: Student t over its units (seeds, repeats), or the
    normal interval of a difference of proportions (``se``, when the units are examples)."""
    if t.get("method") in ("proportions", "welch"):  # an estimate with its standard error (Welch: its degrees of freedom)
        dist = stats.t(t["df"]) if t.get("df") else stats.norm
        half = float(dist.ppf(0.5 + level / 2)) * t["se"]
        return (t["mean"] - half, t["mean"] + half)
    return simultaneous_ci(t["n"], t["mean"], t["sd"], 1, 1 - level)


def claim_tests(claim: Any, values: list[float], margin: float) -> dict:
    """Estimate, 95% interval and the two uncorrected tests of one claim's per-seed values (nominal p values: the
    study's plan and the family are applied later)."""
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
    if claim.expect == "small":  # 0 < gap < margin: both bounds shown (IUT); fails: shown outside either one
        out["p_holds"] = max(eq.one_sided_p(values, 0.0, "greater"), eq.one_sided_p(values, margin, "less"))
        out["p_fails"] = min(1.0, 2 * min(eq.one_sided_p(values, 0.0, "less"), eq.one_sided_p(values, margin, "greater")))
    elif claim.sign == 0:
        out["p_holds"], out["p_fails"] = out["p_equivalence"], eq.beyond_margin_p(values, margin)
    else:
        s = claim.sign
        out["p_holds"] = min(1.0, 2 * eq.one_sided_p([s * v for v in values], 0.0, "greater"))
        out["p_fails"] = eq.below_margin_p(values, margin, s)
    return out


def family_adjust(tests: list[tuple[float, float]]) -> list[tuple[float, float, int, int]]:
    """Shaffer-constrained Holm over every claim's 'holds' and 'fails' p values (``tests``: one pair per claim).
    Returns per claim the adjusted p values and the divisor each hypothesis was tested with (its step's count of
    claims with an untested hypothesis). Reject at level alpha when the adjusted p <= alpha."""
    hyps = sorted(((p, i, k) for i, pair in enumerate(tests) for k, p in enumerate(pair)), key=lambda h: (h[0], h[1], h[2]))
    left = [2] * len(tests)
    adj = [[1.0, 1.0] for _ in tests]
    div = [[len(tests), len(tests)] for _ in tests]
    running = 0.0
    for p, i, k in hyps:
        t = sum(1 for n in left if n > 0)
        running = max(running, min(1.0, t * p))
        adj[i][k], div[i][k] = running, t
        left[i] -= 1
    return [(a[0], a[1], d[0], d[1]) for a, d in zip(adj, div)]


def interval_level(claim: Any, a: float) -> float:
    """The two-sided confidence level whose interval agrees with a test at level ``a``: 1 - a for a direction's and
    for the 'fails' tests, 1 - 2a for TOST and the interval test of 'small' (both one-sided at a)."""
    return 1 - 2 * a if claim.sign == 0 or claim.expect == "small" else 1 - a


def decide(rows: list[ClaimRow], alpha: float, power: float, family: str = "family") -> int:
    """One family (rows whose ``family`` key is true) over 'holds' and 'fails' (``family_adjust``) on each row's p
    values after its study's plan and its arms (``p_holds_claim`` / ``p_fails_claim``, set by the caller); sets each
    tested row's verdict, the interval its verdict used, and for an undecided one its lean, minimum detectable effect
    and the seeds that would decide it. A row with its own ``decider`` (the principle: a bootstrap, not a test over
    seeds) gets its adjusted p values and decides itself. Returns the family size m."""
    fam = [r for r in rows if r.get(family)]
    m = len(fam)
    pairs = [(r["test"]["p_holds_claim"], r["test"]["p_fails_claim"]) if r.get("test") else (1.0, 1.0) for r in fam]
    for r, (ph, pf, dh, df) in zip(fam, family_adjust(pairs)):
        if r.get("test"):  # a claim not run counts in m with p = 1
            r["test"].update(p_holds_holm=ph, p_fails_holm=pf, divisor_holds=dh, divisor_fails=df)
    for r in fam:
        t = r.get("test")
        if t is None:
            continue
        if r.get("decider"):
            r["decider"](r, alpha, m)
            continue
        claim = r["claim_obj"]
        if t["n"] < 2:
            r["verdict"], r["detail"] = UNDECIDED, f"too few {t.get('units', 'seeds')} ({t['n']})"
            continue
        holds, fails = t["p_holds_holm"] <= alpha, t["p_fails_holm"] <= alpha
        used = "holds" if holds or not fails else "fails"
        # the interval the verdict used: the level of its deciding hypothesis' step (alpha / divisor), read through
        # the study's plan (a nominal level), at the confidence that test corresponds to; an undecided claim's at the
        # family's first step (alpha / m), the level it would have to pass first
        t["level_holds"], t["level_fails"] = (alpha / t["divisor_holds"], alpha / t["divisor_fails"]) if holds or fails else (alpha / m, alpha / m)
        a = r["plan"].nominal_level(t["level_" + used], t["n"])
        level = interval_level(claim, a) if used == "holds" else 1 - a
        ci = corrected_interval(t, level)
        t["ci_corrected"], t["ci_corrected_level"], t["ci_corrected_for"] = (list(ci) if ci else None), level, used
        if holds:
            r["verdict"] = HOLDS
            r["detail"] = f"but within the margin (+/-{t['margin']:.3g}): a difference too small to matter" if claim.sign and fails else ""
        elif fails:
            r["verdict"] = FAILS
            r["detail"] = "an effect of the paper's size is ruled out" if claim.sign and claim.expect != "small" else ""
        else:
            r["verdict"] = UNDECIDED
            _undecided(r, claim, t, r["plan"].nominal_level(alpha / m, t["n"]), power)
        notes = (r["detail"], r.get("band_note"), r.get("arm_note"))
        r["detail"] = "; ".join(x for x in notes if x)
    return m


def _undecided(r: ClaimRow, claim: Any, t: dict, a: float, power: float) -> None:
    """What an undecided claim could have detected and what would decide it, at the family's first Holm level a
    (alpha/m): the minimum detectable effect (a direction) or the smallest equivalence margin provable (no_effect)
    at 80% power with the observed seed sd, and the seeds at which the holds or the fails test reaches that power if
    the truth is the estimate."""
    up, down = _lean_words(claim)
    mean, sd, n, margin, s = t["mean"], t["sd"], t["n"], t["margin"], claim.sign
    t["lean"] = up if mean > 0 else down if mean < 0 else None
    if t.get("method") in ("proportions", "welch"):  # the detectable difference of the estimate's own test
        dist = stats.t(t["df"]) if t.get("df") else stats.norm
        t["mde"] = float(dist.ppf(1 - a / 2) + dist.ppf(power)) * t["se"]
        agree = "" if not s or not t["lean"] else (", the paper's direction" if (mean > 0) == (s > 0) else ", against the paper")
        more = "examples of one seed; more seeds would narrow it" if t["method"] == "proportions" else "repeats; more repeats would narrow it"
        r["detail"] = f"leans {t['lean']}{agree}; MDE {t['mde']:.3g} at {n} {more}"
        return
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
    unit = t.get("units", "seeds")  # a speed claim's units are the benchmark's repeats
    decide_txt = (
        f"{t['seeds_to_decide']} {unit} would decide it ({t['would_be']}) if the truth is the estimate"
        if need
        else f"more than {eq.MAX_SEEDS} {unit} to decide it at this estimate"
    )
    direction = "" if not s or not t["lean"] else (", the paper's direction" if (mean > 0) == (s > 0) else ", against the paper")
    r["detail"] = f"leans {t['lean']}{direction}; {what} {t['mde']:.3f} at {n} {unit}; {decide_txt}"
