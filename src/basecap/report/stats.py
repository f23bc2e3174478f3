"""Statistics of a report: the OOD gap at matched in-domain loss as an endpoint per seed, the paired
comparison over seeds (Student t interval, t-test, Holm correction across the report), the evaluation
noise of one run (a bootstrap over evaluation windows), and the ``comparisons`` list of summary.json.

Plain inputs only (arrays, :class:`RunCurves`), so this module depends on nothing else in the package.
The definitions are explained in docs/metrics.md.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

ALPHA = 0.05
TRAINED_FRACTION = 0.3
SMOOTH = 3
GRID_POINTS = 50

WORSE, BETTER, TOO_FEW = "worse OOD", "better OOD", "too few seeds"
NO_RANGE = "no common in-domain range"  # no seed's curves overlap in in-domain loss: nothing to match at


Curve = Sequence[float] | np.ndarray  # losses at each evaluation, in training order


def moving_average(x: Curve, k: int) -> np.ndarray:
    """Mean of each k consecutive values ('valid' positions only: len(x) - k + 1 values)."""
    return np.convolve(np.asarray(x, dtype=float), np.ones(k) / k, "valid")


@dataclass
class MatchedGap:
    """OOD gap of a run against its reference (same seed) at matched in-domain loss.

    ``primary``: mean gap over the lowest ``trained_fraction`` of the common in-domain-loss range;
    ``mean_gap``: mean over the whole common range (secondary); ``end_gap``: the gap at the lowest
    in-domain loss both reached. All three are None when ``reason`` says why there is no gap."""

    primary: float | None = None
    mean_gap: float | None = None
    end_gap: float | None = None
    matched_range: tuple[float, float] | None = None
    primary_range: tuple[float, float] | None = None
    smoothing: int = 1
    notes: list[str] = field(default_factory=list)
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


def matched_endpoints(
    run_in: Curve,
    run_ood: Curve,
    ref_in: Curve,
    ref_ood: Curve,
    smooth: int = SMOOTH,
    trained_fraction: float = TRAINED_FRACTION,
    *,
    points: int = GRID_POINTS,
    band: tuple[float, float] | None = None,
) -> MatchedGap:
    """Gap (run OOD loss - reference OOD loss) at matched in-domain loss, from the two runs' evaluation
    curves (in-domain loss and OOD loss at each evaluation, in training order).

    Each curve is first smoothed by a moving average over ``smooth`` consecutive evaluations (both
    coordinates; when either curve has no more than ``smooth`` evaluations neither is smoothed and a note
    says so). The curves are then interpolated, on their points sorted by in-domain loss, on a grid over
    the range both reached.

    With ``band`` (a study's fixed in-domain band), the primary endpoint is the mean gap over the band instead of
    the lowest ``trained_fraction`` of the common range; a pair whose common range does not hold the whole band
    has no gap (no extrapolation)."""
    if smooth < 1:
        raise ValueError(f"smooth must be >= 1, got {smooth}")
    if not 0 < trained_fraction <= 1:
        raise ValueError(f"trained_fraction must be in (0, 1], got {trained_fraction}")
    xr, yr, xf, yf = (np.asarray(a, dtype=float) for a in (run_in, run_ood, ref_in, ref_ood))
    if len(xr) != len(yr) or len(xf) != len(yf):
        raise ValueError("each curve needs one OOD loss per in-domain loss")
    notes: list[str] = []
    if len(xr) < 2 or len(xf) < 2:
        return MatchedGap(smoothing=smooth, reason=f"too few evaluations (run {len(xr)}, reference {len(xf)}; need 2 each)")
    if smooth > 1 and min(len(xr), len(xf)) > smooth:
        xr, yr, xf, yf = (moving_average(a, smooth) for a in (xr, yr, xf, yf))
    elif smooth > 1:  # both curves are treated alike: smoothing one only would shift it against the other
        notes.append(
            f"not smoothed: run has {len(xr)} evaluations, reference {len(xf)}; a moving average over {smooth} needs more than {smooth} on both"
        )
        smooth = 1
    lo, hi = max(xr.min(), xf.min()), min(xr.max(), xf.max())
    if not lo < hi:
        return MatchedGap(
            smoothing=smooth,
            notes=notes,
            reason=(f"in-domain loss ranges do not overlap (run {xr.min():.4g}-{xr.max():.4g}, reference {xf.min():.4g}-{xf.max():.4g})"),
        )

    def interp(grid: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        o = np.argsort(x, kind="stable")  # in-domain loss falls over training, not always monotonically
        return np.interp(grid, x[o], y[o])

    def gap(grid: np.ndarray) -> np.ndarray:
        return interp(grid, xr, yr) - interp(grid, xf, yf)

    if band is not None:
        b_lo, b_hi = float(band[0]), float(band[1])
        if not (lo <= b_lo < b_hi <= hi):
            return MatchedGap(
                smoothing=smooth,
                notes=notes,
                matched_range=(float(lo), float(hi)),
                reason=(f"the band {b_lo:.4g}-{b_hi:.4g} is not inside the common in-domain range {lo:.4g}-{hi:.4g}"),
            )
        bottom, top = b_lo, b_hi
    else:
        bottom, top = lo, lo + trained_fraction * (hi - lo)
    whole = gap(np.linspace(lo, hi, points))
    trained = gap(np.linspace(bottom, top, points))
    return MatchedGap(
        primary=float(trained.mean()),
        mean_gap=float(whole.mean()),
        end_gap=float(whole[0]),
        matched_range=(float(lo), float(hi)),
        primary_range=(float(bottom), float(top)),
        smoothing=smooth,
        notes=notes,
    )


@dataclass
class PairedTest:
    """Paired comparison over seeds of per-seed gaps against 0 (a one-sample t-test on the differences,
    the same as a paired t-test of the two runs' values)."""

    n: int
    mean: float | None
    sd: float | None
    ci95: tuple[float, float] | None
    p: float | None
    note: str | None = None


def paired_test(gaps: Sequence[float], confidence: float = 0.95) -> PairedTest:
    """Mean, standard deviation, Student-t confidence interval (n - 1 degrees of freedom) and two-sided
    p value (``scipy.stats.ttest_1samp`` against 0) of per-seed gaps."""
    g = np.asarray(gaps, dtype=float)
    n = len(g)
    if n == 0:
        return PairedTest(0, None, None, None, None, TOO_FEW)
    mean = float(g.mean())
    if n < 2:
        return PairedTest(1, mean, None, None, None, f"{TOO_FEW}: 1 seed has no spread")
    sd = float(g.std(ddof=1))
    tcrit = float(stats.t.ppf(0.5 + confidence / 2, n - 1))
    note = f"2 seeds: the interval is valid but very wide (t critical value {tcrit:.1f})" if n == 2 else None
    if np.ptp(g) == 0:  # identical gaps: the t statistic is 0/0 or x/0
        return PairedTest(n, mean, 0.0, (mean, mean), 1.0 if mean == 0 else 0.0, "identical gaps on every seed" + (f"; {note}" if note else ""))
    half = tcrit * sd / math.sqrt(n)
    with warnings.catch_warnings():  # nearly identical gaps: scipy warns about precision, the value stands
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_1samp(g, 0.0).pvalue)
    return PairedTest(n, mean, sd, (mean - half, mean + half), p, note)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm step-down adjusted p values (Holm 1979). None entries (no test) stay None and do not count
    in the number of comparisons. Reject a hypothesis at level alpha when its adjusted p < alpha."""
    present = {i: p for i, p in enumerate(pvalues) if p is not None}
    m = len(present)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(present, key=lambda i: present[i])):
        running = max(running, min(1.0, (m - rank) * present[i]))
        out[i] = running
    return out


def simultaneous_ci(n: int, mean: float | None, sd: float | None, m: int, alpha: float = ALPHA) -> tuple[float, float] | None:
    """Bonferroni-adjusted Student-t interval of a mean gap over ``n`` seeds, one of ``m`` comparisons:
    level 1 - alpha/m each, so all m intervals hold together with probability >= 1 - alpha. Holm rejects
    everything Bonferroni rejects, so a comparison Holm does not reject has an interval that contains 0."""
    if n < 2 or mean is None or sd is None or m < 1:
        return None
    half = float(stats.t.ppf(1 - alpha / (2 * m), n - 1)) * sd / math.sqrt(n)
    return (mean - half, mean + half)


def verdict(n: int, mean: float | None, ci: tuple[float, float] | None, p_holm: float | None, alpha: float = ALPHA) -> str:
    """Verdict words from the Holm-corrected test only. Positive gap = worse out of distribution. ``ci``
    is the comparison's simultaneous (Bonferroni) interval: the gaps the data still allow, corrected for
    the same family as the test, so it agrees with the words."""
    if n < 2 or p_holm is None or mean is None:
        return TOO_FEW
    if p_holm < alpha:
        return WORSE if mean > 0 else BETTER
    lo, hi = ci if ci is not None else (float("nan"), float("nan"))
    return f"no detectable difference (simultaneous CI [{lo:.3f}, {hi:.3f}])"


def eval_noise(window_losses: Sequence[float], confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> dict:
    """Loss of one evaluation as the mean over its windows, with the bootstrap standard error and
    bias-corrected and accelerated (BCa) interval over windows: the noise that comes from the choice of
    evaluation text alone."""
    w = np.asarray(window_losses, dtype=float)
    return _bootstrap_mean((w,), lambda a, axis=-1: a.mean(axis=axis), confidence, n_resamples, seed)


def eval_noise_of_difference(
    run_windows: Sequence[float], ref_windows: Sequence[float], confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> dict:
    """Bootstrap over evaluation windows of (run loss - reference loss), the two runs evaluated on the
    same windows: windows are resampled together (paired), so text that is hard for both cancels."""
    a, b = np.asarray(run_windows, dtype=float), np.asarray(ref_windows, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"run and reference need the same windows (got {a.shape} and {b.shape})")
    return _bootstrap_mean((a, b), lambda x, y, axis=-1: x.mean(axis=axis) - y.mean(axis=axis), confidence, n_resamples, seed, paired=True)


def _bootstrap_mean(data: tuple, statistic: Callable[..., Any], confidence: float, n_resamples: int, seed: int, paired: bool = False) -> dict:
    n = len(data[0])
    value = float(statistic(*data))
    if n < 2:
        return {"value": value, "se": None, "ci95": None, "windows": n}
    spread = data[0] - data[1] if paired else data[0]
    if np.ptp(spread) <= 1e-12 * (1 + np.abs(spread).max()):  # no spread: the bootstrap distribution is a point
        return {"value": value, "se": 0.0, "ci95": [value, value], "windows": n}
    res = stats.bootstrap(
        data,
        statistic,
        n_resamples=n_resamples,
        paired=paired,
        vectorized=True,
        confidence_level=confidence,
        random_state=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return {"value": value, "se": float(res.standard_error), "ci95": [float(ci.low), float(ci.high)], "windows": n}


def dominant_noise(seed_sd: float | None, eval_se: float | None) -> str | None:
    """Which spread is larger for a per-seed gap: "seeds" (training randomness) or "evaluation" (the
    finite evaluation text). None when either is unknown."""
    if seed_sd is None or eval_se is None:
        return None
    return "seeds" if seed_sd >= eval_se else "evaluation"


@dataclass
class RunCurves:
    """One run's evaluation curve: the in-domain loss at each evaluation (training order), each domain's
    loss at the same evaluations, and optionally each domain's per-window losses of the final evaluation."""

    name: str
    seed: int
    in_domain: Sequence[float]
    domains: Mapping[str, Sequence[float]]
    final_windows: Mapping[str, Sequence[float]] = field(default_factory=dict)


def pair_by_seed(runs: Iterable[RunCurves], reference: str) -> list[tuple[RunCurves, RunCurves]]:
    """(run, reference run with the same seed) for every run not named ``reference``."""
    runs = list(runs)
    refs = {r.seed: r for r in runs if r.name == reference}
    return [(r, refs[r.seed]) for r in runs if r.name != reference and r.seed in refs]


def build_comparisons(
    pairs: Iterable[tuple[RunCurves, RunCurves]],
    domains: Sequence[str],
    smooth: int = SMOOTH,
    trained_fraction: float = TRAINED_FRACTION,
    alpha: float = ALPHA,
    band: tuple[float, float] | None = None,
) -> list[dict]:
    """The ``comparisons`` list of summary.json: one entry per (run name, reference name, domain), the
    per-seed gaps paired by seed, the paired test on the primary endpoint, and the Holm correction across
    every comparison in the list (pass all comparisons of a report in one call)."""
    groups: dict[tuple[str, str, str], list[tuple[RunCurves, RunCurves]]] = defaultdict(list)
    for run, ref in pairs:
        if run.seed != ref.seed:
            raise ValueError(f"{run.name} seed {run.seed} is paired with {ref.name} seed {ref.seed}: pairs share a seed")
        for d in domains:
            if d in run.domains and d in ref.domains:
                groups[(run.name, ref.name, d)].append((run, ref))
    out = []
    for (name, ref_name, d), members in groups.items():
        seeds, primary, secondary, end, notes, eval_se = [], [], [], [], [], []
        for run, ref in sorted(members, key=lambda p: p[0].seed):
            g = matched_endpoints(run.in_domain, run.domains[d], ref.in_domain, ref.domains[d], smooth, trained_fraction, band=band)
            notes += [f"seed {run.seed}: {n}" for n in g.notes]
            if not g.ok:
                notes.append(f"seed {run.seed}: {g.reason}")
                continue
            assert g.primary is not None and g.mean_gap is not None and g.end_gap is not None  # all set when ok
            seeds.append(run.seed)
            primary.append(g.primary)
            secondary.append(g.mean_gap)
            end.append(g.end_gap)
            if d in run.final_windows and d in ref.final_windows:
                eval_se.append(eval_noise_of_difference(run.final_windows[d], ref.final_windows[d])["se"])
        t = paired_test(primary)
        if t.note:
            notes.append(t.note)
        se = float(np.sqrt(np.mean(np.square(eval_se)))) if eval_se and None not in eval_se else None
        out.append(
            {
                "run": name,
                "reference": ref_name,
                "domain": d,
                "n_seeds": t.n,
                "seeds": seeds,
                "per_seed": primary,
                "mean_gap": t.mean,
                "sd": t.sd,
                "ci95": list(t.ci95) if t.ci95 else None,
                "p": t.p,
                "p_holm": None,
                "verdict": TOO_FEW,
                "secondary_mean_gap": float(np.mean(secondary)) if secondary else None,
                "end_gap": float(np.mean(end)) if end else None,
                "eval_se": se,
                "dominant_noise": dominant_noise(t.sd, se),
                "notes": notes,
                "unmatched_seeds": len(members) - len(seeds),
            }
        )
    return apply_holm(out, alpha)


def apply_holm(comparisons: list[dict], alpha: float = ALPHA) -> list[dict]:
    """Set ``p_holm``, the simultaneous interval ``ci_simultaneous`` and ``verdict`` of every comparison
    from the correction across all of them (the m comparisons that have a test)."""
    m = sum(c["p"] is not None for c in comparisons)
    for c, ph in zip(comparisons, holm([c["p"] for c in comparisons])):
        c["p_holm"] = ph
        ci = simultaneous_ci(c["n_seeds"], c["mean_gap"], c.get("sd"), m, alpha) if ph is not None else None
        c["ci_simultaneous"] = list(ci) if ci else None
        c["verdict"] = verdict(c["n_seeds"], c["mean_gap"], ci, ph, alpha)
        if c["n_seeds"] == 0 and c.get("unmatched_seeds"):  # seeds there were, but none could be matched
            c["verdict"] = f"{NO_RANGE} ({c['unmatched_seeds']} seed{'s' if c['unmatched_seeds'] > 1 else ''}; notes in summary.json)"
    return comparisons
