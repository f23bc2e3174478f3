"""Seeds planned in advance: a group-sequential reading of a claim's p values (docs/metrics.md, "Seeds planned in
advance").

A study may declare, before its first look, the seed counts at which it is read (``looks``, e.g. [3, 5]) and an
alpha-spending function (Lan & DeMets 1983): ``obrien_fleming`` spends alpha(t) = 2 (1 - Phi(z_{1 - a/2} / sqrt t)),
``pocock`` spends a log(1 + (e - 1) t), t being the information fraction (seeds so far / seeds at the last look).
A claim's p value at look k is then its *repeated p value* (Jennison & Turnbull 2000, ch. 9): the smallest level
whose boundary the look's statistic crosses, so that "repeated p <= a at any look" is a level-a sequential test
whatever looks are taken and wherever the analysis stops. The statistic is the look's nominal p value mapped to the
z scale (z = Phi^-1(1 - p)); the looks' statistics are taken as jointly normal with corr sqrt(t_i / t_j), the
canonical joint distribution of cumulative means.

A study whose seeds were extended after an *undeclared* look has no plan to read it by; its most conservative valid
reading is Bonferroni over the looks that were taken (``looks_taken`` earlier looks plus the final one): p x K. This
is valid for any rule by which the looks led to more seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

SPENDING = ("obrien_fleming", "pocock")


def spent(t: float, alpha: float, kind: str) -> float:
    """The alpha spent by information fraction ``t`` (one-sided)."""
    if not 0 < t <= 1:
        raise ValueError(f"information fraction must be in (0, 1], got {t}")
    if kind == "obrien_fleming":
        return float(2 * (1 - stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(t))))
    if kind == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"spending: one of {', '.join(SPENDING)}, got {kind!r}")


_GRID = 2001  # points of the grid the continuation density is integrated on (deterministic: scorecard.json
# reproduces byte for byte, which scipy's randomised multivariate normal cdf would not)


def _cross_prob(c_prev: tuple[float, ...], c: float, fracs: tuple[float, ...]) -> float:
    """P(Z_1 < c_1, ..., Z_{k-1} < c_{k-1}, Z_k >= c) for the canonical joint normal at ``fracs``, by the recursive
    numerical integration of Armitage, McPherson and Rowe (1969) on the score scale S_k = Z_k sqrt(t_k), whose
    increments are independent N(0, t_k - t_{k-1}); trapezoid rule on a fixed grid."""
    if len(fracs) == 1:
        return float(stats.norm.sf(c))
    grid: np.ndarray | None = None
    density: np.ndarray | None = None
    for k, t in enumerate(fracs[:-1]):
        hi = min(c_prev[k], 12.0) * math.sqrt(t)  # a boundary beyond 12 sd is never crossed
        lo = min(hi, -8.0 * math.sqrt(fracs[-1]))
        new_grid = np.linspace(lo, hi, _GRID)
        if grid is None or density is None:
            new_density = np.asarray(stats.norm.pdf(new_grid, scale=math.sqrt(t)))
        else:
            sd = math.sqrt(t - fracs[k - 1])
            kernel = stats.norm.pdf((new_grid[:, None] - grid[None, :]) / sd) / sd
            new_density = np.asarray(np.trapezoid(kernel * density[None, :], grid, axis=1))
        grid, density = new_grid, new_density
    assert grid is not None and density is not None
    sd = math.sqrt(fracs[-1] - fracs[-2])
    tail = stats.norm.sf((c * math.sqrt(fracs[-1]) - grid) / sd)
    return float(np.trapezoid(density * tail, grid))


def _solve(prev: tuple[float, ...], fracs: tuple[float, ...], target: float) -> float:
    """The boundary of the last look of ``fracs`` that spends ``target`` given the earlier boundaries ``prev``."""
    return float(optimize.brentq(lambda c: _cross_prob(prev, c, fracs) - target, -10.0, 40.0, xtol=1e-10))


@lru_cache(maxsize=4096)
def boundaries(fracs: tuple[float, ...], alpha: float, kind: str) -> tuple[float, ...]:
    """The z boundaries c_1..c_K of the one-sided level-``alpha`` design with looks at information ``fracs``."""
    out: list[float] = []
    prev_spent = 0.0
    for k, t in enumerate(fracs):
        target = spent(t, alpha, kind) - prev_spent
        prev_spent += target
        if target <= 1e-15:
            out.append(math.inf)
            continue
        out.append(_solve(tuple(out), fracs[: k + 1], target))
    return tuple(out)


def repeated_p(p: float, look: int, fracs: tuple[float, ...], kind: str) -> float:
    """The repeated p value at look ``look`` (0-based) of a nominal one-sided p value ``p``."""
    if p >= 1.0:
        return 1.0
    if p <= 0.0:
        return 0.0
    z = float(stats.norm.isf(p))

    def gap(a: float) -> float:
        return boundaries(fracs, a, kind)[look] - z

    lo, hi = 1e-12, 0.999999
    if gap(hi) > 0:  # even at a level near 1 the boundary is not crossed
        return 1.0
    if gap(lo) <= 0:
        return lo
    return float(optimize.brentq(gap, lo, hi, xtol=1e-12, rtol=1e-10))


@dataclass(frozen=True)
class Plan:
    """How a study's seeds were (or will be) looked at."""

    looks: tuple[int, ...] = ()  # declared before the first look: the seed counts at which it is read
    spending: str = "obrien_fleming"
    looks_taken: tuple[int, ...] = ()  # undeclared earlier looks (seed counts), recorded after the fact
    unit: str = "seeds"  # what the counts count (a benchmark's looks count repeats)

    def adjust(self, p: float, n: int) -> tuple[float, str]:
        """The claim's p value at ``n`` seeds under the plan, and how it was read (one line)."""
        if self.looks:
            done = [k for k, size in enumerate(self.looks) if size <= n]
            if not done:
                return 1.0, f"before the first planned look ({self.looks[0]} seeds): not read"
            k = done[-1]
            fracs = tuple(size / self.looks[-1] for size in self.looks)
            name = self.spending.replace("_", "-")
            return repeated_p(p, k, fracs, self.spending), f"planned look {k + 1} of {len(self.looks)} ({self.looks[k]} seeds), {name} spending"
        earlier = [s for s in self.looks_taken if s < n]
        if earlier:
            looks = len(earlier) + 1
            return min(1.0, looks * p), f"read after undeclared looks at {', '.join(map(str, earlier))} {self.unit}: Bonferroni over {looks} looks"
        return p, ""

    def nominal_level(self, a: float, n: int) -> float:
        """The nominal level of a test at ``n`` seeds that the plan's level-``a`` test amounts to (the boundary of
        the current look as a nominal p value; a / K after K undeclared looks): the level of the interval that agrees
        with the verdict."""
        if self.looks:
            done = [k for k, size in enumerate(self.looks) if size <= n] or [0]  # before the first look: its level
            fracs = tuple(size / self.looks[-1] for size in self.looks)
            return float(stats.norm.sf(boundaries(fracs, a, self.spending)[done[-1]]))
        earlier = [s for s in self.looks_taken if s < n]
        return a / (len(earlier) + 1)
