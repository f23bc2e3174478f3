"""The simplest model the data support for a scale step's gap against the matched level and the size.

Two-stage, because the levels of one run pair are points of one curve, not independent draws: each seed's gap curve
(``robust.seed_gaps``: the gap at every 0.05 of matched in-domain loss its pair reaches) is summarised by a straight
line over the levels both sizes reach, ``gap = a + b (level - L0)`` with L0 the middle of that overlap; the seeds of
a size are then independent replicates of (a, b). From them, with 95% t intervals:

- the gap at L0 and its slope per nat at each size;
- the **level** term: the slope pooled over both sizes' seeds (its one-sample interval);
- the **size** term: the larger size's a minus the smaller's (Welch), the gap's change at a fixed level;
- the **interaction**: the larger size's b minus the smaller's (Welch), whether the slope itself changes with size.

The model reported is the one with exactly the terms whose interval excludes 0 (``gap = a`` when none does and a's
pooled interval excludes 0; "no gap shown" when not even that). Outside the family, uncorrected, descriptive: with
3 to 5 seeds a size the intervals are wide, and a term not shown is not shown absent.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

MIN_LEVELS = 3  # grid levels a seed needs inside the overlap for its line


def _t(values: list[float]) -> dict[str, Any]:
    n = len(values)
    mean = math.fsum(values) / n if n else float("nan")
    if n < 2:
        return {"mean": mean, "ci95": None, "n": n}
    half = float(stats.t.ppf(0.975, n - 1)) * float(np.std(values, ddof=1)) / math.sqrt(n)
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": n}


def _welch(a: list[float], b: list[float]) -> dict[str, Any] | None:
    if len(a) < 2 or len(b) < 2:
        return None
    res = stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(0.95)
    return {"mean": math.fsum(a) / len(a) - math.fsum(b) / len(b), "ci95": [float(ci.low), float(ci.high)], "p": float(res.pvalue)}


def _excludes_zero(t: dict[str, Any] | None) -> bool:
    return bool(t and t.get("ci95") and (t["ci95"][0] > 0 or t["ci95"][1] < 0))


def _lines(per_seed: dict[int, dict[float, float]], lo: float, hi: float, center: float) -> dict[int, tuple[float, float]]:
    """Each seed's (a, b) of its line over its levels in [lo, hi] (seeds with fewer than MIN_LEVELS there left out)."""
    out = {}
    for seed, gaps in per_seed.items():
        pts = sorted((lv, g) for lv, g in gaps.items() if lo - 1e-9 <= lv <= hi + 1e-9)
        if len(pts) >= MIN_LEVELS:
            b, a = np.polyfit([lv - center for lv, _ in pts], [g for _, g in pts], 1)
            out[seed] = (float(a), float(b))
    return out


def _span(per_seed: dict[int, dict[float, float]]) -> tuple[float, float]:
    """The levels every seed of a size reaches: the highest of the seeds' lowest, the lowest of their highest."""
    return max(min(g) for g in per_seed.values()), min(max(g) for g in per_seed.values())


def gap_model(base: dict[int, dict[float, float]] | None, step: dict[int, dict[float, float]] | None) -> dict[str, Any] | None:
    """The model of the gap against level and size (module docstring) from the two sizes' per-seed gap curves; None
    when either size has no curve, their levels do not overlap, or a size has fewer than 2 seeds with a line."""
    if not base or not step:
        return None
    (blo, bhi), (slo, shi) = _span(base), _span(step)
    lo, hi = max(blo, slo), min(bhi, shi)
    if hi - lo < 0.05 * (MIN_LEVELS - 1) - 1e-9:
        return None
    center = round((lo + hi) / 2, 3)
    lb, ls = _lines(base, lo, hi, center), _lines(step, lo, hi, center)
    if len(lb) < 2 or len(ls) < 2:
        return None
    a_b, b_b = [v[0] for v in lb.values()], [v[1] for v in lb.values()]
    a_s, b_s = [v[0] for v in ls.values()], [v[1] for v in ls.values()]
    level, size, inter, gap = _t(b_b + b_s), _welch(a_s, a_b), _welch(b_s, b_b), _t(a_b + a_s)
    terms = [name for name, t in (("level", level), ("size", size), ("level x size", inter)) if _excludes_zero(t)]
    if terms:
        model = "gap = a + " + " + ".join(
            {"level": "b (level - L0)", "size": "c [larger size]", "level x size": "d (level - L0) [larger size]"}[t] for t in terms
        )
    else:
        model = "gap = a (no level or size term shown)" if _excludes_zero(gap) else "no gap shown (no term's interval excludes 0)"
    return {
        "overlap": [round(lo, 2), round(hi, 2)],
        "center": center,
        "base": {"seeds": sorted(lb), "gap_at_center": _t(a_b), "slope": _t(b_b)},
        "step": {"seeds": sorted(ls), "gap_at_center": _t(a_s), "slope": _t(b_s)},
        "level": level,
        "size": size,
        "level_x_size": inter,
        "terms": terms,
        "model": model,
    }
