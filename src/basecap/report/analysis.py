"""The numbers of a report: each run name's final losses, bits per byte, unigram baseline and context gain
(mean and sd over seeds), and the OOD gap of every run against a reference run *at matched in-domain loss*,
paired by seed, with confidence intervals and Holm-corrected verdicts (``report.stats``); with a study's
comparison design, every measure of it (``report.design``).

Matched-loss gap: each run's evaluations give points (in-domain loss x, OOD loss y). For a run and the
reference with the same seed, both curves (smoothed over ``smooth`` consecutive evaluations) are
interpolated on a common grid of x over the range both reached. The primary endpoint is the mean gap over
the lowest 30% of that range (the trained end); the whole-range mean and the end gap are secondary.
Definitions: docs/metrics.md.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import numpy as np

from .baselines import NEAR_UNIGRAM_NATS, run_unigram, unigram_in_domain
from .runs import Run
from .stats import SMOOTH, RunCurves, apply_holm, build_comparisons, holm, matched_endpoints, paired_test


def domain_curve(run: Run, domain: str) -> tuple[np.ndarray, np.ndarray]:
    """(in-domain loss, ``domain`` loss) at each evaluation, in training order."""
    return (np.array([e["in_domain_loss"] for e in run.evals]), np.array([e["domains"][domain]["loss"] for e in run.evals]))


def matched_gap(run: Run, ref: Run, domain: str, points: int = 50, smooth: int = 1) -> dict | None:
    """OOD loss of ``run`` minus ``ref`` at matched in-domain loss (``stats.matched_endpoints``): the primary
    endpoint, the whole-range mean, the end gap and the matched range; None when there is no gap."""
    xr, yr = domain_curve(run, domain)
    xf, yf = domain_curve(ref, domain)
    g = matched_endpoints(xr, yr, xf, yf, smooth=smooth, points=points)
    if not g.ok or g.matched_range is None:
        return None
    return {"primary": g.primary, "mean_gap": g.mean_gap, "end_gap": g.end_gap, "matched_range": list(g.matched_range)}


def curves_of(run: Run) -> RunCurves:
    """The run's evaluation curves for ``report.stats``, with the final evaluation's per-window losses."""
    doms = [d for d in run.domains if all(d in e["domains"] for e in run.evals)]
    last = run.evals[-1]["domains"] if run.evals else {}
    return RunCurves(
        run.name,
        run.seed,
        [e["in_domain_loss"] for e in run.evals],
        {d: [e["domains"][d]["loss"] for e in run.evals] for d in doms},
        {d: last[d]["window_losses"] for d in doms if last[d].get("window_losses") is not None},
    )


def _mean_std(vals: list[float]) -> tuple[float, float | None]:
    return (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else None)


def run_setting(run: Run) -> tuple:
    return tuple(sorted(run.in_domains))


def ood_domains(runs: list[Run]) -> list[str]:
    """Domains held out by at least one run (the mixed-domain control trains on them)."""
    return list(dict.fromkeys(d for r in runs for d in r.ood_domains))


def _reference_for(run: Run, runs: list[Run], refs: list[Run]) -> Run | None:
    """The reference run with the same seed and the same training domains. If the named reference was
    trained on other domains (a limited-vs-mixed study), use the run of this setting that has the
    reference's architecture (same model config)."""
    for ref in refs:
        if ref.seed == run.seed and run_setting(ref) == run_setting(run):
            return ref
    if not refs:
        return None
    arch = refs[0].info["config"]["model"]
    for r in runs:
        if r.seed == run.seed and run_setting(r) == run_setting(run) and r.info["config"]["model"] == arch:
            return r
    return None


def _ref_runs(run: Run, groups: dict[str, list[Run]], refs: list[str]) -> list[Run]:
    """The runs of the reference for ``run``: with several references, the one whose mixer is the run's
    (model.mixer.name: an ablation of two base architectures compares each variant with its own base), else the first."""
    mixer = _mixer(run)
    return groups[next((n for n in refs if _mixer(groups[n][0]) == mixer), refs[0])]


def _mixer(run: Run) -> str | None:
    return ((run.info.get("config") or {}).get("model") or {}).get("mixer", {}).get("name")


def summarize(runs: list[Run], reference: str | list[str] | None = None, smooth: int = SMOOTH, design: dict | None = None) -> dict:
    """Final losses with the unigram baseline and context gain of every run name (mean, sd over seeds),
    and the statistics of every comparison against the reference (``report.stats``). With a study's comparison
    ``design`` (its ``[compare]`` table, ``report.design``) the comparisons are those of its primary measure,
    with every other measure, the limited-vs-mixed interaction and the target strata beside them."""
    groups = runs_by_name(runs)
    names = list(groups)
    refs = [r for r in ([reference] if isinstance(reference, str) else reference or []) if r in groups]
    refs = refs or names[:1]
    reference = refs[0] if refs else None
    domains = sorted({d for r in runs for d in r.domains}, key=lambda d: (d not in runs[0].in_domains, d))
    final = {name: _final_row(rs, domains) for name, rs in groups.items()}
    near = [n for n, row in final.items() if row.get("context_gain") and row["context_gain"][0] < NEAR_UNIGRAM_NATS]
    comps = _comparisons(runs, groups, refs, smooth) if refs else []
    in_comps = _in_domain_comparisons(runs, groups, refs) if refs else []
    out = {
        "reference": reference,
        "references": refs,
        "domains": domains,
        "smooth": smooth,
        "final": final,
        "comparisons": comps,
        "in_domain_comparisons": in_comps,
        "near_unigram": near,
    }
    if design and design.get("band") and refs:
        out.update(_designed(runs, groups, refs, smooth, design, comps))
    return out


def _designed(runs: list[Run], groups: dict[str, list[Run]], refs: list[str], smooth: int, design: dict, legacy: list[dict]) -> dict:
    """The comparisons of every measure of the design (``report.design``), its primary one first."""
    from .design import interactions, measure_comparisons, measures, reach, strata_shares

    ms, primary = measures(design)
    by_measure = {"legacy": legacy}
    for m in ms:
        if m.name != "legacy":
            by_measure[m.name] = _families(measure_comparisons(reference_pairs(runs, groups, refs), m, design, ood_domains(runs), smooth), groups)
    return {
        "comparisons": by_measure[primary],
        "design": {**design, "primary": primary},
        "comparisons_by_measure": by_measure,
        "interactions": interactions(by_measure, primary, runs),
        "strata_shares": strata_shares(runs),
        "reach": reach(runs, design),
    }


def reference_pairs(runs: list[Run], groups: dict[str, list[Run]], refs: list[str]) -> list[tuple[Run, Run]]:
    return [
        (r, ref)
        for rs in groups.values()
        for r in rs
        for ref in [_reference_for(r, runs, _ref_runs(r, groups, refs))]
        if ref is not None and ref is not r
    ]


def _families(comps: list[dict], groups: dict[str, list[Run]]) -> list[dict]:
    """Holm within two families: domains held out by the run, and domains the run trained on (the control)."""
    for c in comps:
        c["in_domain_here"] = c["domain"] in groups[c["run"]][0].in_domains
        c["holm_family"] = "trained-on domains" if c["in_domain_here"] else "held-out domains"
    for here in (False, True):
        apply_holm([c for c in comps if c["in_domain_here"] is here])
    return comps


def _final_row(rs: list[Run], domains: list[str]) -> dict:
    """Final evaluation of one run name over its seeds: losses and bpb, the unigram baseline on the same
    windows, and the context gain (unigram in-domain loss - model in-domain loss)."""
    done = [r for r in rs if r.evals]
    row = {
        "seeds": [r.seed for r in done],
        "params": rs[0].info["params"],
        "in_domains": rs[0].in_domains,
        "steps": max((r.evals[-1]["step"] for r in done), default=0),
    }
    row["in_domain_loss"] = _mean_std([r.evals[-1]["in_domain_loss"] for r in done]) if done else None
    for d in domains:
        vals = [r.evals[-1]["domains"][d] for r in done if d in r.evals[-1]["domains"]]
        if vals:
            row[d] = {"loss": _mean_std([v["loss"] for v in vals]), "bpb": _mean_std([v["bpb"] for v in vals])}
    weights = rs[0].info["config"]["data"]["train_weights"]
    gains, base = [], None
    for r in done:
        uni = run_unigram(r)
        ui = unigram_in_domain(uni, weights) if uni else None
        if ui is not None:
            base = base or {"in_domain": ui, "domains": uni}
            gains.append(ui - r.evals[-1]["in_domain_loss"])
    row["unigram"] = base
    row["context_gain"] = _mean_std(gains) if gains else None
    return row


def _comparisons(runs: list[Run], groups: dict[str, list[Run]], refs: list[str], smooth: int) -> list[dict]:
    """Every run against the reference run of its seed and training setting, per OOD domain. Holm corrects
    within two families: domains held out by the run (the study's questions) and domains the run trained on
    (the mixed-domain control), so a control does not dilute the held-out tests nor the reverse."""
    pairs = reference_pairs(runs, groups, refs)
    return _families(build_comparisons([(curves_of(r), curves_of(ref)) for r, ref in pairs], ood_domains(runs), smooth=smooth), groups)


def _in_domain_comparisons(runs: list[Run], groups: dict[str, list[Run]], refs: list[str]) -> list[dict]:
    """Every run name against the reference on its own training domains at the end of training: the final
    in-domain loss minus the reference's (the run of the same seed and training setting, evaluated at the
    same step; in a mixed-domain control, the reference's architecture trained on the same mixture), paired
    by seed, with the paired t-test and a Holm correction across these comparisons (a family of their own,
    apart from the OOD gaps). Positive = worse in-domain. Not a matched-loss quantity:
    it says how far each model got with the same data, which the OOD gap at matched loss deliberately
    sets aside."""
    diffs: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    notes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, rs in groups.items():
        for r in rs:
            ref = _reference_for(r, runs, _ref_runs(r, groups, refs))
            if ref is None or ref is r or not r.evals or not ref.evals:
                continue  # the reference itself, or its architecture in another training setting
            key = (name, ref.name)
            if r.evals[-1]["step"] != ref.evals[-1]["step"]:
                notes[key].append(
                    f"seed {r.seed}: final evaluations at different steps ({r.evals[-1]['step']} against {ref.evals[-1]['step']}); left out"
                )
                continue
            diffs[key].append((r.seed, r.evals[-1]["in_domain_loss"] - ref.evals[-1]["in_domain_loss"]))
    out: list[dict] = []
    for key in dict.fromkeys([*diffs, *notes]):
        pairs = sorted(diffs.get(key, []))
        t = paired_test([d for _, d in pairs])
        out.append(
            {
                "run": key[0],
                "reference": key[1],
                "n_seeds": t.n,
                "seeds": [s for s, _ in pairs],
                "per_seed": [d for _, d in pairs],
                "mean_diff": t.mean,
                "sd": t.sd,
                "ci95": list(t.ci95) if t.ci95 else None,
                "p": t.p,
                "notes": notes.get(key, []) + ([t.note] if t.note else []),
            }
        )
    for c, ph in zip(out, holm([c["p"] for c in out])):
        c["p_holm"] = ph
    return out


def runs_by_name(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        groups[r.name].append(r)
    return groups
