"""What a verdict must survive: a claim's rate arms (part of its test), and the specification table (each
defensible analysis choice on its own, read at the levels the verdict used) that labels a verdict robust or names the
choice that breaks it (docs/metrics.md, "Robust verdicts").

Specifications of a claim (pre-declared here and in docs/metrics.md; a claim's study must have the comparison
design, the old design's studies have only their own reading):
- ``targets: all``: OOD loss on every target instead of the targets seen in training;
- ``level: lowest``: the band placed at the lowest level every curve of the claim reaches, instead of the study's;
- ``level: half``: the band centred on the level the slowest of the claim's runs reaches at half of training (its
  fork at 50%), a level every curve passes through;
- each arm (``arms`` in claims.toml): the comparison at a shared learning rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

from ..report.design import curves, measures, reach
from .claims import Arm, Claim, ClaimsFile
from .compute import Study, claim_values, lacking_runs, level_band
from .sequential import Plan
from .verdicts import FAILS, HOLDS, UNDECIDED, claim_margin, claim_tests
from .rows import ClaimRow

SPECS = (("targets: all", "annealed_all", "band"), ("level: lowest", "primary", "lowest"), ("level: half", "primary", "half"))


class Placed(NamedTuple):
    """One specification's reading of a claim (``under_specifications``): its label, the band it was read in (rounded,
    None where no level could be placed), what ``reading`` returned, or why there is no reading (``detail``)."""

    spec: str
    band: list[float] | None
    result: Any
    detail: str | None


def under_specifications(
    claim: Claim, study: Study, reading: Callable[[Claim, tuple[float, float] | None], Any], own_band: tuple[float, float] | None = None
) -> list[Placed]:
    """``claim`` read under each of ``SPECS`` on its own: the claim with the specification's measure, in the band its
    level places, through ``reading(claim, band)`` (the study's own band is ``own_band``: None, the study's, unless
    the claim is read in a pair's rule band). The one loop every reader of the specifications goes through (the
    scorecard's claims, ``basecap compare``'s arms, the principle's predictions)."""
    out = []
    for label, measure, level in SPECS:
        c = claim.model_copy(update={"measure": measure})
        band = level_band(c, study, level)
        if band is None:
            out.append(Placed(label, None, None, "no level to read"))
            continue
        rounded = [round(band[0], 4), round(band[1], 4)]
        try:
            out.append(Placed(label, rounded, reading(c, own_band if level == "band" else band), None))
        except (ValueError, KeyError) as e:  # a curve that does not reach the band: no reading there
            out.append(Placed(label, rounded, None, str(e)))
    return out


def plan_of(claims: ClaimsFile, study: str) -> Plan:
    st = claims.studies[study]
    return Plan(tuple(st.looks), st.spending, tuple(st.looks_taken))


def apply_plan(t: dict, plan: Plan) -> dict:
    """``t`` (a claim's tests) with its p values read by the study's plan (``p_holds_plan``, ``p_fails_plan``, ``plan``)."""
    t["p_holds_plan"], t["plan"] = plan.adjust(t["p_holds"], t["n"])
    t["p_fails_plan"], _ = plan.adjust(t["p_fails"], t["n"])
    return t


def read(claim: Claim, study: Study, plan: Plan, domains: list[str], margin: float, band: tuple[float, float] | None = None) -> dict:
    """One specification of a claim: its per-seed values, tests and the p values after the study's plan."""
    got = claim_values(claim, study, domains, band)
    t = apply_plan(claim_tests(claim, got["values"], claim_margin(claim, margin)), plan)
    return {"test": t, "seeds": got["seeds"], "values": got["values"], "parts": got["parts"], "used": got["used"]}


def arm_claim(claim: Claim, arm: Arm) -> Claim:
    return claim.model_copy(update={"study": arm.study, "run": arm.run, "reference": arm.reference, "arms": [], "controls": [], "measure": "primary"})


def pair_band(claim: Claim, study: Study) -> dict | None:
    """Where an arm's pair is read when the study's band is not inside the pair's common reach (a run at a rate far
    from its optimum may never anneal into it): the rule of docs/metrics.md, "When a curve cannot reach the band",
    applied to the pair's curves alone (the band of the same width whose bottom is the lowest in-domain loss every
    seed of both runs reaches, rounded up to 0.05). None when the band is held, or the study has no band."""
    design = study.summary.get("design") or {}
    if not design.get("band"):
        return None
    r = reach([run for (name, _), run in study.runs.items() if name in claim.runs], design)
    if r is None or r["band_held"]:
        return None
    return {"band": r["rule_band"], "common": r["common"]}


def arms_of(claim: Claim, claims: ClaimsFile, studies: dict[str, Study], domains: list[str], arms: list[Arm] | None = None) -> list[dict]:
    """Each arm of ``claim`` (or each of ``arms``: its controls): its reading, or what it waits for (then its p values
    count as 1: the claim cannot hold or fail before every arm is in)."""
    out = []
    for arm in claim.arms if arms is None else arms:
        c = arm_claim(claim, arm)
        folder = claims.results_dir(arm.study)
        st = studies.get(folder)
        entry: dict = {"label": arm.label, "study": arm.study, "results": folder, "run": arm.run, "reference": arm.reference}
        lacking = lacking_runs(c.runs, st) if st is not None else c.runs
        if st is None or lacking:
            entry.update(status="waiting", detail=f"results/{folder}/ {'has no records of ' + ', '.join(lacking) if st else 'is not published yet'}")
            entry["test"] = None
        else:
            moved = pair_band(c, st)
            plan = plan_of(claims, arm.study)
            if moved is None:
                entry.update(status="measured", **read(c, st, plan, domains, claims.margin))
            elif moved["band"] is None:
                lo, hi = moved["common"]
                entry.update(status="unreadable", detail=f"no band of the study's width fits the pair's common reach {lo:.3f}-{hi:.3f}")
                entry["test"] = None
            else:
                band = (float(moved["band"][0]), float(moved["band"][1]))
                entry.update(status="measured", **read(c, st, plan, domains, claims.margin, band))
                entry["band"] = list(band)
                entry["detail"] = (
                    f"read at {band[0]:.2f}-{band[1]:.2f}: the study's band is not inside the pair's common reach "
                    f"(the lowest level every seed of both runs reaches is {moved['common'][0]:.3f}; docs/metrics.md, rule band)"
                )
        out.append(entry)
    return out


def combine(row: ClaimRow) -> None:
    """The claim's p values for the family: the largest of its own and its arms' (after each study's plan); a note
    names the arms that wait or that break the verdict's direction."""
    t = row["test"]
    own_h, own_f = t["p_holds_plan"], t["p_fails_plan"]
    arms = row.get("arms") or []
    ph = [own_h] + [a["test"]["p_holds_plan"] if a.get("test") and a["test"]["n"] >= 2 else 1.0 for a in arms]
    pf = [own_f] + [a["test"]["p_fails_plan"] if a.get("test") and a["test"]["n"] >= 2 else 1.0 for a in arms]
    t["p_holds_claim"], t["p_fails_claim"] = max(ph), max(pf)
    waiting = [a["label"] for a in arms if a["status"] == "waiting"]
    unreadable = [a["label"] for a in arms if a["status"] == "unreadable"]
    notes = []
    if waiting:
        notes.append(f"arms still to come: {', '.join(waiting)}")
    if unreadable:
        notes.append(f"arms with no band to read: {', '.join(unreadable)}")
    if notes:
        row["arm_note"] = "; ".join(notes)


def verdict_at(t: dict | None, a_holds: float, a_fails: float) -> str:
    """A specification's verdict at the levels the claim's verdict used (its steps' alpha / divisor)."""
    if not t or t["n"] < 2:
        return UNDECIDED
    if t["p_holds_plan"] <= a_holds:
        return HOLDS
    if t["p_fails_plan"] <= a_fails:
        return FAILS
    return UNDECIDED


def specifications(row: ClaimRow, claim: Claim, study: Study, claims: ClaimsFile, domains: list[str], alpha: float) -> None:
    """The specification table of a tested claim (``row["specs"]``) and its robustness label."""
    t = row["test"]
    a_h, a_f = t["level_holds"], t["level_fails"]  # the levels the claim's verdict used (alpha / m if undecided)
    plan = plan_of(claims, claim.study) if claim.study else Plan()
    specs = [{"spec": "primary (the study's own)", "estimate": t["mean"], "ci95": t["ci95"], "n": t["n"], "verdict": verdict_at(t, a_h, a_f)}]
    if (study.summary.get("design") or {}).get("band"):
        own = row.get("band")  # the claim's own band: the study's (None), or the pair's rule band
        own_band = None if own is None else (float(own[0]), float(own[1]))
        for p in under_specifications(claim, study, lambda c, at: read(c, study, plan, domains, claims.margin, at)["test"], own_band):
            st = p.result
            if st is None or st["n"] < 2:
                specs.append(
                    {
                        "spec": p.spec,
                        **({"band": p.band} if p.band and st is not None else {}),
                        "estimate": st["mean"] if st is not None else None,
                        "ci95": None,
                        "n": st["n"] if st is not None else 0,
                        "verdict": "n/a",
                        "detail": p.detail or "fewer than 2 seeds reach the band",
                    }
                )
                continue
            specs.append(
                {"spec": p.spec, "band": p.band, "estimate": st["mean"], "ci95": st["ci95"], "n": st["n"], "verdict": verdict_at(st, a_h, a_f)}
            )
    arms = [(f"rate arm {a['label'].split(':')[0]}", {"label": a["label"]}, a) for a in row.get("arms") or []]
    controls: list[tuple[str, dict, dict]] = [(f"control: {a['label']}", {}, a) for a in row.get("controls") or []]
    for spec, extra, a in arms + controls:
        at = a.get("test")
        specs.append(
            {
                "spec": spec,
                **extra,
                "estimate": at["mean"] if at else None,
                "ci95": at["ci95"] if at else None,
                "n": at["n"] if at else 0,
                "verdict": verdict_at(at, a_h, a_f) if at else ("n/a" if a["status"] == "unreadable" else "waiting"),
                **({"band": a["band"]} if a.get("band") else {}),
            }
        )
    row["specs"] = specs
    readable = [s for s in specs[1:] if s["verdict"] not in ("n/a", "waiting")]
    breaks = [s["spec"] for s in readable if s["verdict"] != row["verdict"]]
    missing = [s["spec"] for s in specs[1:] if s["verdict"] in ("n/a", "waiting")]
    row["robust"] = not breaks and not missing
    row["breaks"] = breaks
    row["robust_missing"] = missing


LEVEL_STEP = 0.05  # the grid of in-domain levels the gap along training is read on


def seed_gaps(claim: Claim, study: Study, domains: list[str]) -> dict[int, dict[float, float]] | None:
    """Each seed's gap (the mean over ``domains``) against the matched in-domain level, on the LEVEL_STEP grid, over
    the levels its pair reaches (annealed points, the study's targets). None for a study without the comparison
    design, a trend / interaction claim, or no seed with both runs."""
    design = study.summary.get("design") or {}
    if not design.get("band") or claim.expect in ("trend", "interaction") or claim.run is None or claim.reference is None:
        return None
    reference = claim.reference
    ms, primary = measures(design)
    m = next(x for x in ms if x.name == primary)
    match = design.get("match_domains")
    seeds: dict[int, list[tuple[np.ndarray, np.ndarray, float, float]]] = {}
    for (name, seed), r in sorted(study.runs.items(), key=lambda kv: kv[0][1]):
        ref = study.runs.get((reference, seed))
        if name != claim.run or ref is None:
            continue
        a, b = curves(r, m, domains, match), curves(ref, m, domains, match)
        if a is None or b is None or any(d not in a.domains or d not in b.domains for d in domains):
            continue
        xa, xb = np.asarray(a.in_domain, float), np.asarray(b.in_domain, float)
        oa, ob = np.argsort(xa, kind="stable"), np.argsort(xb, kind="stable")
        lo, hi = max(xa.min(), xb.min()), min(xa.max(), xb.max())
        if lo >= hi:
            continue
        ys = [(np.asarray(a.domains[d], float), np.asarray(b.domains[d], float)) for d in domains]
        seeds[seed] = [(xa[oa], xb[ob], lo, hi)] + [(ya[oa], yb[ob], 0.0, 0.0) for ya, yb in ys]
    if not seeds:
        return None
    return _on_grid(seeds)


def gap_along_training(claim: Claim, study: Study, domains: list[str]) -> dict | None:
    """A pair claim's gap against the matched in-domain level over the whole of training (annealed points, the
    study's targets): per level of a 0.05 grid, the mean over the seeds whose pair reaches it, with its 95% t
    interval where at least 2 do. None for a study without the comparison design or a trend / interaction claim."""
    per_seed = seed_gaps(claim, study, domains)
    if per_seed is None:
        return None
    design = study.summary["design"]
    points = []
    for level in sorted({lv for g in per_seed.values() for lv in g}):
        vals = [g[level] for g in per_seed.values() if level in g]
        mean = math.fsum(vals) / len(vals)
        ci = None
        if len(vals) >= 2:
            sd = float(np.std(vals, ddof=1))
            half = float(stats.t.ppf(0.975, len(vals) - 1)) * sd / math.sqrt(len(vals))
            ci = [mean - half, mean + half]
        points.append({"level": level, "mean": mean, "ci95": ci, "n": len(vals)})
    return {"band": [float(x) for x in design["band"]], "points": points}


def _on_grid(seeds: dict[int, list[tuple[np.ndarray, np.ndarray, float, float]]]) -> dict[int, dict[float, float]]:
    """Each seed's gap (the mean over domains) at every level of the LEVEL_STEP grid its pair reaches."""
    lo = min(v[0][2] for v in seeds.values())
    hi = max(v[0][3] for v in seeds.values())
    grid = [round(float(x), 2) for x in np.arange(math.ceil(lo / LEVEL_STEP) * LEVEL_STEP, hi + 1e-9, LEVEL_STEP)]
    out: dict[int, dict[float, float]] = {}
    for seed, v in seeds.items():
        (xa, xb, plo, phi), doms = v[0], v[1:]
        out[seed] = {
            level: float(np.mean([np.interp(level, xa, ya) - np.interp(level, xb, yb) for ya, yb, _, _ in doms]))
            for level in grid
            if plo <= level <= phi
        }
    return out


def plot_gap_along_training(card: dict, path: Path) -> int:
    """One panel per claim with a gap along training: the mean gap against the matched level with its 95% band over
    seeds, the study's band shaded, 0 and the margin marked (higher level = earlier in training, drawn on the left).
    Returns the number of panels."""
    import matplotlib  # only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in card["claims"] if r.get("gap_along_training")]
    if not rows:
        return 0
    cols = 4
    nrows = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.6 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, rows):
        g = r["gap_along_training"]
        xs = [p["level"] for p in g["points"]]
        ax.plot(xs, [p["mean"] for p in g["points"]], color="C0")
        band_pts = [p for p in g["points"] if p["ci95"]]
        ax.fill_between([p["level"] for p in band_pts], [p["ci95"][0] for p in band_pts], [p["ci95"][1] for p in band_pts], color="C0", alpha=0.25)
        ax.axvspan(*g["band"], color="0.85")
        ax.axhline(0, color="k", lw=0.8)
        if r["expect"] != "no_effect":
            ax.axhline(card["margin"] * (1 if (r["expect"] != "better") else -1), color="C3", lw=0.8, ls="--")
        else:
            for s in (1, -1):
                ax.axhline(s * card["margin"], color="C3", lw=0.8, ls="--")
        ax.invert_xaxis()
        ax.set_title(f"{r['id']} ({r['verdict']})", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    fig.supxlabel("matched in-domain loss (training runs left to right)", fontsize=9)
    fig.supylabel("OOD gap, nats/token", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return len(rows)
