"""The comparison design of a study (its ``[compare]`` table): what the primary OOD gap is, and the other
measures beside it so a reader sees what each choice does (docs/metrics.md, "The comparison design").

A *measure* is (curve points, OOD targets, level):
- points: ``evals`` (every evaluation of the run, smoothed as before) or ``annealed`` (the cooldown branches'
  points and the run's own end, which its schedule anneals; not smoothed: each is an endpoint);
- targets: ``all`` or ``seen`` (the loss on targets seen at least ``eval.seen_min_count`` times in training);
- level: ``band`` (the mean gap over the study's fixed in-domain band) or ``lowest30`` (the lowest 30% of each
  pair's common range: the design before this one).
The matching coordinate is the in-domain loss, or the token-weighted loss of ``match_domains`` (the mixed-domain
control is matched on the limited setting's training domain). The primary measure is the design's own
(``<points>_<targets>`` in the band); ``legacy`` is the old one (evaluations, every target, lowest 30%).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence, cast

import numpy as np
from scipy import stats as sps

from ..records import DomainEval, PointRecord
from ..rundir import matched_loss
from .runs import Run
from .stats import ALPHA, SMOOTH, RunCurves, build_comparisons, holm, paired_test
from .summary import EXPERIMENT_FILE

GRID = 50
Points = Literal["evals", "annealed"]  # every evaluation of the main run, or the annealed points and the run's end
Targets = Literal["all", "seen"]  # every target token, or those seen at least seen_min_count times in training


@dataclass(frozen=True)
class Measure:
    name: str
    points: Points
    targets: Targets
    band: bool  # the study's band, else the lowest 30% of the common range


def measures(design: dict) -> tuple[list[Measure], str]:
    """Every measure a study with ``design`` reports, and the name of its primary one."""
    out = [Measure("legacy", "evals", "all", False)]
    if design.get("band"):
        out += [Measure(f"{p}_{t}", p, t, True) for p in ("evals", "annealed") for t in ("all", "seen")]
        return out, f"{design.get('points', 'annealed')}_{design.get('targets', 'seen')}"
    return out, "legacy"


def design_of(run_dirs: list[Path]) -> dict | None:
    """The ``compare`` table of the experiment files beside the run directories (None: the old design). Runs may
    come from several folders (a study's archived records and its newly trained runs): the folders that hold an
    experiment file must agree on the table, or it is an error that asks for ``--compare``; a folder without one
    (runs trained one by one) does not vote."""
    from ..config_base import ConfigError

    tables: dict[Path, dict | None] = {}
    for parent in sorted({Path(d).resolve().parent for d in run_dirs}):
        try:
            exp = json.loads((parent / EXPERIMENT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        tables[parent] = exp.get("compare") or None
    distinct = {json.dumps(t, sort_keys=True) for t in tables.values()}
    if len(distinct) > 1:
        listed = "; ".join(f"{p.name}: {t}" for p, t in tables.items())
        raise ConfigError(f"the runs come from folders whose studies compare differently ({listed}); give the design with --compare FILE")
    return next(iter(tables.values()), None)


def load_design(path: Path) -> dict:
    """The validated ``[compare]`` table of a TOML file (``basecap report --compare``): its top-level table, or in an
    experiment file that sets it per size, the table of the file's own ``size``."""
    import tomllib

    from ..config_base import ConfigError
    from ..config import CompareConfig

    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--compare {path}: {e}") from None
    table = data.get("compare")
    if not table and isinstance(data.get("size"), str):
        table = ((data.get("sizes") or {}).get(data["size"]) or {}).get("compare")
    if not table:
        raise ConfigError(f"--compare {path}: no [compare] table")
    try:
        design = json.loads(CompareConfig.model_validate(table).model_dump_json())
    except ValueError as e:
        raise ConfigError(f"--compare {path}: {e}") from None
    if isinstance(data.get("name"), str):  # an experiment file: the study's own design as the file now states it
        design["study_file"] = Path(path).name
    return design


def _y(res: DomainEval, targets: Targets) -> float | None:
    if targets == "all":
        return res["loss"]
    seen = (res.get("strata") or {}).get("seen")
    return None if seen is None else seen["loss"]


def annealed_records(run: Run) -> list[PointRecord]:
    """The run's annealed points: every cooldown branch's point and the run's final evaluation (its schedule
    ends at the floor rate), in order of tokens."""
    end: list[PointRecord] = [run.evals[-1]] if run.evals else []
    return [*sorted(run.annealed, key=lambda r: r["end_step"]), *end]


def curves(run: Run, m: Measure, domains: list[str], match_domains: list[str] | None) -> RunCurves | None:
    """The run's curve for measure ``m`` (None when its records lack what the measure needs)."""
    recs: Sequence[PointRecord] = annealed_records(run) if m.points == "annealed" else run.evals
    xs = [matched_loss(r, match_domains) for r in recs]
    ys = {d: [_y(r["domains"][d], m.targets) if d in r["domains"] else None for r in recs] for d in domains}
    ys = {d: v for d, v in ys.items() if v and None not in v}
    if not recs or None in xs or not ys:
        return None
    return RunCurves(run.name, run.seed, cast(list[float], xs), cast(dict[str, list[float]], ys))  # no None: checked above


def points_in_band(xs: Sequence[float], band: tuple[float, ...]) -> int:
    return int(sum(band[0] <= x <= band[1] for x in xs))


def measure_comparisons(pairs: list[tuple[Run, Run]], m: Measure, design: dict, domains: list[str], smooth: int = SMOOTH) -> list[dict]:
    """``build_comparisons`` for one measure over (run, reference) pairs; entries note the points in the band."""
    match = design.get("match_domains")
    band = tuple(design["band"]) if m.band else None
    cs = [(curves(r, m, domains, match), curves(f, m, domains, match)) for r, f in pairs]
    ok = [(a, b) for a, b in cs if a is not None and b is not None]
    comps = build_comparisons(ok, domains, smooth=1 if m.points == "annealed" else smooth, band=band)
    if band is not None:  # per run, the fewest points of any seed's curve in the band: its own, and its reference's
        own: dict[str, int] = {}
        ref: dict[str, int] = {}
        for a, b in ok:
            own[a.name] = min(own.get(a.name, 10**9), points_in_band(a.in_domain, band))
            ref[a.name] = min(ref.get(a.name, 10**9), points_in_band(b.in_domain, band))
        for c in comps:
            if c["run"] in own:
                c["points_in_band"] = {"run": own[c["run"]], "reference": ref[c["run"]]}
                c["fewest_points_in_band"] = min(own[c["run"]], ref[c["run"]])
    for c in comps:
        c["measure"] = m.name
    return comps


@dataclass(frozen=True)
class GapCurve:
    """A comparison's gap on a grid of ``x`` (matched in-domain level, or fraction of training): the mean over the
    seeds whose pair reaches each x, its 95% t interval where at least 2 do (NaN elsewhere), and that count."""

    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n: np.ndarray


def _seed_band(x: np.ndarray, rows: list[np.ndarray]) -> GapCurve | None:
    if not rows:
        return None
    stack = np.vstack(rows)
    n = (~np.isnan(stack)).sum(axis=0)  # seeds that reach each x; an x none reaches stays NaN (not drawn)
    mean = np.where(n > 0, np.nansum(stack, axis=0) / np.maximum(n, 1), np.nan)
    lo, hi = np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    for k in np.flatnonzero(n >= 2):
        v = stack[:, k][~np.isnan(stack[:, k])]
        half = float(sps.t.ppf(0.975, len(v) - 1)) * float(np.std(v, ddof=1)) / np.sqrt(len(v))
        lo[k], hi[k] = mean[k] - half, mean[k] + half
    return GapCurve(x, mean, lo, hi, n)


def _pair_curves(
    pairs: list[tuple[Run, Run]], m: Measure, design: dict, domain: str
) -> list[tuple[Run, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per seed pair: (reference run, then the run's and the reference's level and loss on ``domain``, each sorted by
    level) for the pairs whose records hold the measure."""
    match = design.get("match_domains")
    out = []
    for r, f in pairs:
        a, b = curves(r, m, [domain], match), curves(f, m, [domain], match)
        if a is None or b is None or domain not in a.domains or domain not in b.domains:
            continue
        xa, ya, xb, yb = (np.asarray(v, float) for v in (a.in_domain, a.domains[domain], b.in_domain, b.domains[domain]))
        oa, ob = np.argsort(xa, kind="stable"), np.argsort(xb, kind="stable")
        out.append((f, xa[oa], ya[oa], xb[ob], yb[ob]))
    return out


def _gap_at(level: np.ndarray, xa: np.ndarray, ya: np.ndarray, xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
    """The run's loss minus the reference's at each matched level, NaN outside the pair's common range (no
    extrapolation)."""
    g = np.interp(level, xa, ya) - np.interp(level, xb, yb)
    lo, hi = max(xa.min(), xb.min()), min(xa.max(), xb.max())
    return np.where((level < lo) | (level > hi) | np.isnan(level), np.nan, g)


def gap_curve(pairs: list[tuple[Run, Run]], m: Measure, design: dict, domain: str) -> GapCurve | None:
    """The gap against the matched in-domain level, on a grid over the levels any pair shares, with its band over
    seeds: for the report's figure and the scorecard's gap along training."""
    per = [p for p in _pair_curves(pairs, m, design, domain) if max(p[1].min(), p[3].min()) < min(p[1].max(), p[3].max())]
    if not per:
        return None
    lo = min(max(xa.min(), xb.min()) for _, xa, _, xb, _ in per)
    hi = max(min(xa.max(), xb.max()) for _, xa, _, xb, _ in per)
    grid = np.linspace(lo, hi, GRID)
    return _seed_band(grid, [_gap_at(grid, xa, ya, xb, yb) for _, xa, ya, xb, yb in per])


def fork_fractions(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(fraction of training, in-domain loss) of the run's annealed points, by fork step: a branch forked at step s
    of a T-step run is at s / T (its cooldown is extra), the run's own end at 1."""
    recs = annealed_records(run)
    steps = float(((run.info.get("config") or {}).get("train") or {}).get("steps") or recs[-1]["step"])
    fr = np.asarray([min(r["step"], steps) / steps for r in recs], float)
    x = np.asarray([r["in_domain_loss"] for r in recs], float)
    o = np.argsort(fr, kind="stable")
    return fr[o], x[o]


def gap_fraction_curve(pairs: list[tuple[Run, Run]], m: Measure, design: dict, domain: str) -> GapCurve | None:
    """The gap against the fraction of training: at fraction f, the matched-level gap at the level the reference's
    annealed point reaches at f of its training (interpolated between its forks), with its band over seeds. Two
    sizes or two training lengths line up on this axis by position in training rather than by level. Annealed
    points only (an evaluation curve has no annealed level to read)."""
    if m.points != "annealed" or design.get("match_domains"):
        return None
    per = _pair_curves(pairs, m, design, domain)
    if not per:
        return None
    fracs = [fork_fractions(f) for f, *_ in per]
    grid = np.linspace(min(fr.min() for fr, _ in fracs), 1.0, GRID)
    rows = []
    for (_, xa, ya, xb, yb), (fr, lvl) in zip(per, fracs):
        level = np.where((grid < fr.min()) | (grid > fr.max()), np.nan, np.interp(grid, fr, lvl))
        rows.append(_gap_at(level, xa, ya, xb, yb))
    return _seed_band(grid, rows)


RULE_STEP = 0.05  # a band moved by the rule starts on a multiple of this


def reach(runs: list[Run], design: dict) -> dict | None:
    """How far every curve of the primary measure reaches in the matching coordinate, and whether the study's band
    lies inside: per run, the lowest loss all its seeds reach (the largest of their minima) and the highest (the
    smallest of their maxima); ``common`` is the same over every run. When the band is not inside, ``rule_band`` is
    the band of the same width whose bottom is the common lowest loss rounded up to a multiple of RULE_STEP (None if
    that band is not inside either): a choice made from in-domain losses only (docs/metrics.md, "When a curve
    cannot reach the band")."""
    band = design.get("band")
    if not band:
        return None
    points = design.get("points", "annealed")
    match = design.get("match_domains")
    per: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in runs:
        recs = annealed_records(r) if points == "annealed" else r.evals
        xs = [x for x in (matched_loss(rec, match) for rec in recs) if x is not None]
        if xs:
            per[r.name].append((min(xs), max(xs)))
    if not per:
        return None
    by_run = {n: {"lowest": max(lo for lo, _ in v), "highest": min(hi for _, hi in v), "seeds": len(v)} for n, v in per.items()}
    lo = max(v["lowest"] for v in by_run.values())
    hi = min(v["highest"] for v in by_run.values())
    held = lo <= band[0] and band[1] <= hi
    out: dict = {"points": points, "runs": by_run, "common": [lo, hi], "band_held": held, "rule_band": None}
    if not held:
        bottom = round(float(np.ceil(lo / RULE_STEP - 1e-9)) * RULE_STEP, 6)
        top = round(bottom + (band[1] - band[0]), 6)
        out["rule_band"] = [bottom, top] if top <= hi else None
    return out


def interactions(by_measure: dict[str, list[dict]], primary: str, runs: list[Run], alpha: float = ALPHA) -> list[dict]:
    """Limited-domain gap minus mixed-domain gap of the same architecture, paired by seed, per held-out domain of
    the limited setting (the paper's claim: the limited setting separates what the mixed one hides). A run's
    mixed-domain twin is the run of the other training setting with the same model config."""
    comps = by_measure.get(primary, [])
    setting = {r.name: tuple(sorted(r.in_domains)) for r in runs}
    model = {r.name: json.dumps(r.info["config"]["model"], sort_keys=True) for r in runs}
    settings = sorted(set(setting.values()), key=len)
    if len(settings) < 2:
        return []
    limited = settings[0]
    per: dict[tuple[str, str], dict] = {}
    for c in comps:
        per[(c["run"], c["domain"])] = c
    out: list[dict] = []
    for (name, dom), c in per.items():
        if setting[name] != limited or dom in limited:
            continue
        twin = next((n for n in setting if setting[n] != limited and model[n] == model[name]), None)
        m = per.get((twin, dom)) if twin else None
        if m is None:
            continue
        lim = dict(zip(c["seeds"], c["per_seed"]))
        mix = dict(zip(m["seeds"], m["per_seed"]))
        seeds = sorted(set(lim) & set(mix))
        diffs = [lim[s] - mix[s] for s in seeds]
        t = paired_test(diffs)
        out.append(
            {
                "run": name,
                "mixed_run": twin,
                "domain": dom,
                "measure": primary,
                "seeds": seeds,
                "per_seed": diffs,
                "limited_gap": float(np.mean([lim[s] for s in seeds])) if seeds else None,
                "mixed_gap": float(np.mean([mix[s] for s in seeds])) if seeds else None,
                "mean": t.mean,
                "sd": t.sd,
                "ci95": list(t.ci95) if t.ci95 else None,
                "p": t.p,
                "n_seeds": t.n,
            }
        )
    for c, ph in zip(out, holm([c["p"] for c in out])):
        c["p_holm"] = ph
        c["verdict"] = (
            ("limited gap larger" if c["mean"] > 0 else "limited gap smaller") if ph is not None and ph < alpha else "no detectable interaction"
        )
    return out


def strata_shares(runs: list[Run]) -> dict[str, dict[str, dict[str, float]]]:
    """Training setting -> domain -> share of the evaluation targets in each stratum (from the final evaluation)."""
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for r in runs:
        if not r.evals:
            continue
        key = ", ".join(r.in_domains)
        for d, res in r.evals[-1]["domains"].items():
            st = res.get("strata")
            if st and d not in out[key]:
                out[key][d] = {k: v["tokens"] / res["tokens"] for k, v in st.items()}
    return dict(out)
