"""Tests that can say a difference is *small*, and what a study could have detected.

- ``tost``: two one-sided t-tests (Schuirmann 1987) of per-seed differences against an equivalence margin:
  equivalence (|delta| < margin) is shown when both one-sided tests reject; the equivalence p is the larger of
  the two.
- ``below_margin_p`` / ``beyond_margin_p``: a difference shown to be smaller than the margin in one direction
  (the paper's effect is excluded), or shown to lie beyond the margin (a real difference).
- ``power_two_sided``, ``power_one_sided``, ``power_tost``: the power of those tests for a true difference,
  seed sd and seed count, from the noncentral t distribution (``scipy.stats.nct``); TOST's power is integrated
  exactly over the sample sd.
- ``mde``: the smallest true difference the two-sided test detects with the given power; ``equivalence_bound``:
  the smallest margin TOST shows with that power when the true difference is 0; ``seeds_needed``: the seed count
  at which a test reaches the power.

Plain arrays in, numbers out; definitions in docs/metrics.md ("The scorecard").
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import integrate, optimize, stats

POWER = 0.8
MAX_SEEDS = 1000


def _summary(values: Sequence[float]) -> tuple[int, float, float]:
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        raise ValueError(f"need at least 2 values, got {len(x)}")
    return len(x), float(x.mean()), (0.0 if np.ptp(x) == 0 else float(x.std(ddof=1)))  # identical values: no spread


def one_sided_p(values: Sequence[float], bound: float, alternative: str) -> float:
    """p of the one-sample t-test of H0: mean <= bound ("greater") or H0: mean >= bound ("less"). With no
    spread the data decide exactly: 0 when the mean is strictly on the alternative's side, else 1."""
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    n, mean, sd = _summary(values)
    if sd == 0:
        side = mean > bound if alternative == "greater" else mean < bound
        return 0.0 if side else 1.0
    t = (mean - bound) / (sd / math.sqrt(n))
    return float(stats.t.sf(t, n - 1) if alternative == "greater" else stats.t.cdf(t, n - 1))


def tost(values: Sequence[float], margin: float) -> dict:
    """Two one-sided tests against -margin and +margin. ``p`` = max of the two: equivalence at level a when
    p < a, the same as the (1 - 2a) interval lying inside (-margin, margin)."""
    if margin <= 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    lower = one_sided_p(values, -margin, "greater")
    upper = one_sided_p(values, margin, "less")
    return {"p": max(lower, upper), "p_lower": lower, "p_upper": upper}


def below_margin_p(values: Sequence[float], margin: float, sign: int) -> float:
    """p of the test that ``sign`` x difference is below ``margin`` (H0: sign x delta >= margin), doubled so that
    rejecting at level a is the (1 - a) two-sided interval excluding the margin: the effect a claim expects is
    ruled out. It covers a difference shown the other way and an equivalence to 0."""
    s = _sign(sign)
    return min(1.0, 2 * one_sided_p([s * v for v in values], margin, "less"))


def beyond_margin_p(values: Sequence[float], margin: float) -> float:
    """p of the test that the difference lies beyond the margin on one side (H0: |delta| <= margin): twice the
    smaller of the one-sided p values against +margin (above) and -margin (below), so its size is at most the
    level; rejecting at level a is the (1 - a) two-sided interval lying outside [-margin, margin]."""
    above = one_sided_p(values, margin, "greater")
    below = one_sided_p(values, -margin, "less")
    return min(1.0, 2 * min(above, below))


def _sign(sign: int) -> int:
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {sign}")
    return sign


def power_two_sided(effect: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided one-sample t-test at level ``alpha`` when the true mean is ``effect``: P(|T'| >
    t(1 - alpha/2, n - 1)) with T' noncentral t of noncentrality effect x sqrt(n) / sd."""
    df, nc = n - 1, abs(effect) * math.sqrt(n) / sd
    tc = stats.t.ppf(1 - alpha / 2, df)
    return min(1.0, _nct_sf(tc, df, nc) + _finite_or_0(stats.nct.cdf(-tc, df, nc)))


def power_one_sided(effect: float, sd: float, n: int, alpha: float) -> float:
    """Power of a one-sided one-sample t-test at level ``alpha`` when the true mean is ``effect`` past the null
    bound, in the direction of the alternative (negative: the truth is on the null's side)."""
    df = n - 1
    return _nct_sf(stats.t.ppf(1 - alpha, df), df, effect * math.sqrt(n) / sd)


def _finite_or_0(p: float) -> float:
    """scipy's nct returns nan for some far-tail probabilities (e.g. cdf(-14.1, 2, 18)); they are ~0."""
    return float(p) if math.isfinite(p) else 0.0


def _nct_sf(x: float, df: int, nc: float) -> float:
    sf = stats.nct.sf(x, df, nc)
    if not math.isfinite(sf):
        sf = 1.0 - stats.nct.cdf(x, df, nc)
    return float(min(1.0, max(0.0, _finite_or_0(sf))))


def power_tost(delta: float, sd: float, n: int, margin: float, alpha: float) -> float:
    """Exact power of TOST at level ``alpha`` (each one-sided test) for a true difference ``delta``: TOST rejects
    when |mean| + t(1 - alpha, n - 1) x s / sqrt(n) < margin; given the sample sd s the mean is normal, and s^2
    is sd^2 chi2(n - 1) / (n - 1), over which the probability is integrated."""
    df = n - 1
    tc = stats.t.ppf(1 - alpha, df)
    se = sd / math.sqrt(n)

    def given(q: float) -> float:  # q = chi2 value; s = sd sqrt(q / df)
        half = margin - tc * sd * math.sqrt(q / df) / math.sqrt(n)
        if half <= 0:
            return 0.0
        return (stats.norm.cdf((half - delta) / se) - stats.norm.cdf((-half - delta) / se)) * stats.chi2.pdf(q, df)

    q_max = df * (margin * math.sqrt(n) / (tc * sd)) ** 2  # beyond it the interval is wider than the margin
    if q_max <= 0:
        return 0.0
    val, _ = integrate.quad(given, 0, q_max, limit=200)
    return float(min(1.0, max(0.0, val)))


def _smallest(power: Callable[[float], float], target: float, hi: float) -> float:
    """The smallest x in (0, hi] with power(x) >= target (power increasing in x); hi doubled until it is reached."""
    while power(hi) < target:
        hi *= 2
        if hi > 1e9:
            raise ValueError("power target not reachable")
    return float(optimize.brentq(lambda x: power(x) - target, 1e-12, hi, xtol=1e-10))


def mde(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """Minimum detectable effect: the true difference that the two-sided test at level ``alpha`` detects with
    probability ``power``, at ``n`` seeds with seed sd ``sd``."""
    if n < 2 or sd <= 0:
        raise ValueError("mde needs n >= 2 and sd > 0")
    return _smallest(lambda e: power_two_sided(e, sd, n, alpha), power, 10 * sd)


def equivalence_bound(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """The smallest margin that TOST at level ``alpha`` shows with probability ``power`` when the true difference
    is 0 (n seeds, seed sd ``sd``): how small a difference the study could have called 'no effect'."""
    if n < 2 or sd <= 0:
        raise ValueError("equivalence_bound needs n >= 2 and sd > 0")
    return _smallest(lambda m: power_tost(0.0, sd, n, m, alpha), power, 10 * sd)


def seeds_needed(power_at: Callable[[int], float], power: float = POWER, start: int = 2, max_seeds: int = MAX_SEEDS) -> int | None:
    """The smallest seed count n >= ``start`` with power_at(n) >= ``power``; None when not reached by
    ``max_seeds``. Power grows with n, so the search doubles, then bisects."""
    if power_at(start) >= power:
        return start
    lo, hi = start, start
    while power_at(hi) < power:
        lo, hi = hi, hi * 2
        if lo >= max_seeds:
            return None
    while hi - lo > 1:  # power_at(lo) < power <= power_at(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power_at(mid) >= power else (mid, hi)
    return hi if hi <= max_seeds else None
