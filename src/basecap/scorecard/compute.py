"""Claim -> runs -> comparison: the one place that turns a claim into one number per seed.

Runs are read from a study's archived records (``results/<study>/runs/``) with the report's own reader
(``report.runs.load_run``) and curves (``report.analysis.curves_of``), and compared with the report's own matching
(``report.stats.build_comparisons``), so the scorecard follows any change of the comparison design. A study with a comparison design
(``report.design``) is compared with its design's primary measure, or the measure a claim names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..config_base import ConfigError
from ..report.analysis import curves_of
from ..report.runs import Run, load_run
from ..report.stats import SMOOTH, RunCurves, build_comparisons
from .claims import Claim


@dataclasses.dataclass
class Study:
    """A published study: its runs by (name, seed), its summary.json and each run's record fingerprint."""

    name: str
    dir: Path
    runs: dict[tuple[str, int], Run]
    summary: dict
    fingerprints: dict[tuple[str, int], str]


def fingerprint(run: Run) -> str:
    """A run's identity: the hash of its evaluation and training records (a copy made with --reuse has the same)."""
    return hashlib.sha256(json.dumps([run.train, run.evals], sort_keys=True).encode()).hexdigest()[:16]


def load_study(results_dir: Path) -> Study | None:
    """The study published in ``results_dir`` (None when the folder or its summary.json does not exist)."""
    summary_path = results_dir / "summary.json"
    if not summary_path.is_file():
        return None
    runs = {}
    for d in sorted((results_dir / "runs").iterdir()) if (results_dir / "runs").is_dir() else []:
        if d.is_dir() and (d / "run.json").is_file():
            r = load_run(d)
            runs[(r.name, r.seed)] = r
    return Study(
        results_dir.name, results_dir, runs, json.loads(summary_path.read_text(encoding="utf-8")), {k: fingerprint(r) for k, r in runs.items()}
    )


def pair_gaps(
    study: Study,
    run: str,
    reference: str,
    domains: list[str],
    seeds: list[int] | None = None,
    measure: str = "primary",
    *,
    band: tuple[float, float] | None = None,
) -> tuple[dict[str, dict[int, float]], list[str]]:
    """Per domain, {seed: value of ``measure``} of ``run`` against ``reference`` (same seed), from the report's
    ``build_comparisons`` at the study's smoothing; and its notes (seeds without a gap, and why). ``band`` replaces
    the study's band (a specification of the level)."""
    pairs: list[tuple[RunCurves, RunCurves]] = []
    for (name, seed), r in sorted(study.runs.items(), key=lambda kv: kv[0][1]):
        ref = study.runs.get((reference, seed))
        if name == run and ref is not None and (seeds is None or seed in seeds):
            # no per-window losses: the scorecard needs the gaps, not the evaluation-noise bootstrap
            run_curves, ref_curves = (dataclasses.replace(curves_of(x), final_windows={}) for x in (r, ref))
            pairs.append((run_curves, ref_curves))
    smooth = study.summary.get("smooth") or SMOOTH
    design = study.summary.get("design")
    if design and band is not None:
        design = {**design, "band": list(band)}
    if design:  # a study with a comparison design: its primary measure (or the one the claim names), as its report
        from ..report.design import measure_comparisons, measures

        ms, primary = measures(design)
        name = primary if measure == "primary" else measure
        m = next((x for x in ms if x.name == name), None)
        if m is None:
            raise ConfigError(f"measure {measure!r}: study {study.name} has {', '.join(x.name for x in ms)}")
        run_pairs = [
            (r, study.runs[(reference, seed)])
            for (n, seed), r in sorted(study.runs.items(), key=lambda kv: kv[0][1])
            if n == run and (reference, seed) in study.runs and (seeds is None or seed in seeds)
        ]
        comps = measure_comparisons(run_pairs, m, design, domains, smooth) if m.name != "legacy" else build_comparisons(pairs, domains, smooth=smooth)
    else:
        comps = build_comparisons(pairs, domains, smooth=smooth)
    field = "per_seed"
    out = {c["domain"]: dict(zip(c["seeds"], c[field])) for c in comps}
    notes = [f"{run} vs {reference}, {c['domain']}: {n}" for c in comps for n in c["notes"]]
    return out, notes


def _domain_mean(gaps: dict[str, dict[int, float]], domains: list[str]) -> dict[int, float]:
    """Per seed, the mean of the domains' gaps (seeds that have a gap on every domain)."""
    if not all(d in gaps for d in domains):
        return {}
    seeds = set.intersection(*(set(gaps[d]) for d in domains))
    return {s: float(np.mean([gaps[d][s] for d in domains])) for s in sorted(seeds)}


def lacking_runs(runs: list[str], study: Study) -> list[str]:
    """The runs (by name) of which ``study`` holds no record: a study not published whole yet."""
    have = {k[0] for k in study.runs}
    return [r for r in runs if r not in have]


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys on xs, in closed form with exactly rounded sums (math.fsum): the same bits
    wherever IEEE doubles are, which a LAPACK fit (np.polyfit) does not promise, so scorecard.json reproduces byte for byte."""
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.fsum((x - mx) ** 2 for x in xs)


def claim_values(claim: Claim, study: Study, domains: list[str], band: tuple[float, float] | None = None) -> dict:
    """The claim's statistic per seed (``values``, ``seeds``), its parts per domain, the runs it used and notes.

    - pair (worse / better / no_effect): the run's gap against the reference, mean over ``domains``;
    - trend: per seed, the least-squares slope of the gap (against the reference, whose gap is 0) on log2 x;
    - interaction: per seed, the gap of run vs reference minus the gap of control_run vs control_reference."""
    missing = lacking_runs(claim.runs, study)
    if missing:
        raise ConfigError(f"claim {claim.id}: study {study.name} has no records of {', '.join(missing)}")
    notes: list[str] = []
    parts: dict[str, dict] = {}

    def gaps(run: Any, ref: Any) -> dict[int, float]:
        g, n = pair_gaps(study, run, ref, domains, claim.seeds, claim.measure, band=band)
        notes.extend(n)
        parts[f"{run} vs {ref}"] = {d: {str(s): v for s, v in g.get(d, {}).items()} for d in domains}
        return _domain_mean(g, domains)

    if claim.expect == "trend":
        assert claim.x is not None and claim.reference is not None  # a trend claim names both (Claim's validator)
        per_run = {r: gaps(r, claim.reference) for r in claim.x if r != claim.reference}
        seeds = sorted(set.intersection(*(set(v) for v in per_run.values())))
        xs = [math.log2(claim.x[claim.reference])] + [math.log2(claim.x[r]) for r in per_run]
        values = {s: slope(xs, [0.0] + [per_run[r][s] for r in per_run]) for s in seeds}
    elif claim.expect == "interaction":
        main, control = gaps(claim.run, claim.reference), gaps(claim.control_run, claim.control_reference)
        values = {s: main[s] - control[s] for s in sorted(set(main) & set(control))}
    else:
        values = gaps(claim.run, claim.reference)
    used = sorted({k for k in study.runs if k[0] in claim.runs and k[1] in values}, key=lambda k: (claim.runs.index(k[0]), k[1]))
    return {"seeds": list(values), "values": list(values.values()), "parts": parts, "notes": notes, "used": used}


def comparison_key(claim: Claim, study: Study, used: list[tuple[str, int]], domains: list[str]) -> tuple:
    """What a claim's comparison is made of, by record fingerprint: two claims with the same key test the same
    comparison twice (copies of the same runs under other names)."""
    role = {n: i for i, n in enumerate(claim.runs)}
    return (claim.expect, claim.measure, tuple(domains), tuple(sorted((role[n], study.fingerprints[(n, s)]) for n, s in used)))


def scale_of_run(run: Run) -> dict:
    """Parameters, training tokens and context of one run, from its resolved config."""
    cfg = run.info["config"]
    return {
        "params": run.info["params"]["total"],
        "params_non_embedding": run.info["params"]["non_embedding"],
        "train_tokens": cfg["train"]["steps"] * cfg["train"]["batch_size"] * cfg["data"]["seq_len"],
        "context": cfg["data"]["seq_len"],
    }


def scale_of_config(root: Path, experiment: str, size: str, run: str) -> dict:
    """Parameters, training tokens and context of a run that has not run, from its experiment file at the
    study's size: the model is built on the meta device with the vocabulary ``basecap plan`` finds (the
    recipe's tokenizer), so the count is the one the run will report."""
    import torch

    from ..config import load_experiment
    from ..matching import resolve
    from ..model import build_model
    from ..plan import run_vocab

    exp = load_experiment(root / "experiments" / "paper" / experiment, [f"size={size}"])
    rc = next(rc for rc in exp.run_configs() if rc.name.split("@")[0] == run)
    with torch.device("meta"):
        counts = build_model(resolve(rc).model, run_vocab(rc)[0]).param_counts()
    return {
        "params": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "preset": rc.model.preset,
        "train_tokens": rc.train.steps * rc.train.batch_size * rc.data.seq_len,
        "context": rc.data.seq_len,
    }


def provenance(studies: dict[str, Study]) -> list[dict]:
    """Every archived run record that is a copy of another study's run (same records; ``reused_from`` in its
    run.json), with the record it copies: one entry per copy, so no copy passes for a replication."""
    original: dict[str, str] = {}
    for st in studies.values():
        for key, r in st.runs.items():
            if not r.info.get("reused_from"):
                original.setdefault(st.fingerprints[key], f"{st.name}/runs/{r.run_id}")
    out = []
    for st in studies.values():
        for key, r in sorted(st.runs.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            src = r.info.get("reused_from")
            same = original.get(st.fingerprints[key])
            if src or (same and same != f"{st.name}/runs/{r.run_id}"):
                out.append({"study": st.name, "run": r.run_id, "copy_of": same, "reused_from": src.get("run_dir") if isinstance(src, dict) else src})
    return out


LEVELS = ("band", "lowest", "half")
HALF = 0.5  # the fraction of training whose level the "half" specification reads


def level_band(claim: Claim, study: Study, level: str) -> tuple[float, float] | None:
    """The in-domain band a level specification reads a claim's gap in, as wide as the study's band: ``band`` the
    study's own; ``lowest`` from the lowest level every curve of the claim reaches (the highest of its runs' lowest
    annealed points) up; ``half`` centred on the level the slowest of the claim's runs (the highest mean over seeds)
    is annealed to at its fork at half of training, a level every curve passes through. None where the study has no
    band (the old design) or the level cannot be placed."""
    from ..report.design import annealed_records
    from ..rundir import matched_loss

    design = study.summary.get("design") or {}
    if not design.get("band"):
        return None
    lo, hi = design["band"]
    width = hi - lo
    if level == "band":
        return (lo, hi)
    match = design.get("match_domains")
    runs = [r for (name, _), r in study.runs.items() if name in claim.runs]
    if level == "lowest":
        lows = [min(x for x in (matched_loss(rec, match) for rec in annealed_records(r)) if x is not None) for r in runs]
        return (max(lows), max(lows) + width) if lows else None
    if level == "half":
        by_run: dict[str, list[float]] = {}
        for r in runs:
            at = [matched_loss(rec, match) for rec in r.annealed if rec.get("step") == round(HALF * r.info["config"]["train"]["steps"])]
            by_run.setdefault(r.name, []).extend(x for x in at if x is not None)
        means = [math.fsum(v) / len(v) for v in by_run.values() if v]
        if len(means) < len(by_run) or not means:
            return None
        c = max(means)
        return (c - width / 2, c + width / 2)
    raise ValueError(f"level: one of {', '.join(LEVELS)}, got {level!r}")
