"""The scorecard: every claim of the paper (``experiments/paper/claims.toml``) tested once, from the published
studies' archived records, with one Holm family over the claims file; ``results/SCORECARD.md`` and
``results/scorecard.json``. ``basecap scorecard`` writes them (docs/metrics.md, "The scorecard")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config_base import ConfigError
from .claims import CLAIMS_FILE, load_claims
from .scale import scale_steps
from .compute import claim_values, comparison_key, lacking_runs, load_study, provenance, scale_of_config, scale_of_run
from .metrics import metric_key, metric_row
from .predictions import predictions
from .principle import PRINCIPLE_FILE, load_principle, principle_row
from .robust import apply_plan, arms_of, combine, gap_along_training, pair_band, plan_of, specifications
from .verdicts import NOT_RUN, UNTESTABLE, claim_margin, decide, claim_tests
from .rows import ClaimRow

if TYPE_CHECKING:
    from .claims import Claim, ClaimsFile
    from .compute import Study

__all__ = ["build_scorecard", "load_claims"]


def load_studies(results: Path) -> dict:
    """Every published study under ``results`` (a folder with summary.json), by folder name."""
    out = {}
    for d in sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []:
        st = load_study(d)
        if st is not None:
            out[d.name] = st
    return out


def _superseded(c: Claim, claims: Any, studies: dict, domains: list[str]) -> tuple[Claim, dict | None, dict | None]:
    """(the claim as the study that answers it, the superseded study's estimate or None, the superseding study
    still to come or None): a claim whose study is superseded by a published study with its runs is computed there
    and the old study's estimate is kept beside; until then it stays with the old study, and the row says what the
    superseding study is and how far it is published."""
    old = claims.studies[c.study]
    new = claims.answering(c)  # with a run map, only the claims whose every run it maps move
    if new is c or old.superseded_by is None:
        return c, None, None
    folder = claims.results_dir(old.superseded_by)
    st = studies.get(folder)
    lacking = lacking_runs(new.runs, st) if st is not None else new.runs
    if lacking:
        spec = claims.studies[old.superseded_by]
        pending = dict(study=old.superseded_by, results=folder, experiment=spec.experiment, size=spec.size, label=spec.label)
        return c, None, {**pending, "published": st is not None, "lacking": lacking}
    prev = studies.get(claims.results_dir(c.study))
    if prev is None:
        return new, None, None
    from ..report.stats import paired_test

    t = paired_test(claim_values(c, prev, domains)["values"])
    before = {"study": c.study, "results": claims.results_dir(c.study), "mean": t.mean, "ci95": list(t.ci95) if t.ci95 else None, "n": t.n}
    return new, before, None


def plans(claims: Any, rows: list[ClaimRow]) -> dict:
    """How each study of the family's claims is read: its declared plan, its undeclared looks, or one look."""
    out = {}
    for study in sorted({r["study"] for r in rows if r["study"] and r.get("results") and r["study"] in claims.studies}):
        st = claims.studies[study]
        if st.looks:
            plan = f"declared: looks at {', '.join(map(str, st.looks))} seeds, {st.spending.replace('_', '-')} spending"
            reading = "repeated p values at the look reached"
        elif st.looks_taken:
            plan = f"undeclared looks at {', '.join(map(str, st.looks_taken))} seeds ({st.looks_reason})"
            reading = f"Bonferroni over {len(st.looks_taken) + 1} looks (p x {len(st.looks_taken) + 1}): the most conservative valid reading"
        else:
            plan, reading = "one look at the seeds fixed in the study file", "as tested"
        out[study] = {"plan": plan, "reading": reading}
    return out


def _new_row(c: Claim, domains: list[str], before: dict | None, pending: dict | None) -> ClaimRow:
    """A claim's row as the claims file states it, before any test: not run, no estimate yet."""
    return {
        "id": c.id,
        "section": c.section,
        "paper": c.paper,
        "study": c.study,
        "expect": c.expect,
        "direction": c.direction,
        "run": c.run,
        "reference": c.reference,
        "runs": c.runs,
        "domains": domains,
        "measure": c.measure,
        "family": c.untestable is None and c.gpu is None,
        "gpu_family": c.untestable is None and c.gpu is not None,  # the paper's GPU-scale claims: a family of their own
        "metric": c.metric,
        "margin": c.margin,
        "analogue_of": c.analogue_of,
        "claim_obj": c,
        "test": None,
        "verdict": NOT_RUN,
        "detail": "",
        "scale": None,
        "results": None,
        "seeds": [],
        "values": [],
        "reused": [],
        "before": before,
        "pending": pending,
    }


def _claim_row(c: Claim, claims: ClaimsFile, studies: dict, root: Path, copy_of: dict, seen: dict) -> ClaimRow:
    """One claim's row: untestable, a metric claim (metrics.py), waiting for its study or some of its runs, or a
    pair claim tested on its study's records (``_test_pair``). ``seen`` (comparison -> claim id) refuses a
    comparison that enters the family twice."""
    domains = c.domains or claims.domains
    before = pending = None
    if c.untestable is None and c.study is not None:
        c, before, pending = _superseded(c, claims, studies, domains)
    row = _new_row(c, domains, before, pending)
    if c.untestable is not None:
        row["verdict"], row["detail"] = UNTESTABLE, c.untestable
        return row
    assert c.study is not None and c.reference is not None  # a testable claim names both (Claim's validator)
    study = claims.studies[c.study]
    folder = claims.results_dir(c.study)
    st = studies.get(folder)
    scale_run = c.run or c.reference
    if c.metric != "ood_gap":  # a speed ratio or an accuracy: its own records and test (metrics.py)
        metric_row(row, c, claims, studies, root, plan_of(claims, c.study))
        row["scale"] = scale_of_config(root, study.experiment, study.size, scale_run)
        if row["test"] is not None:
            key = metric_key(c)
            if key in seen:
                raise ConfigError(f"claim {c.id} repeats the comparison of claim {seen[key]}: a comparison enters the family once")
            seen[key] = c.id
        return row
    if st is None:
        row["scale"] = scale_of_config(root, study.experiment, study.size, scale_run)
        row["detail"] = (
            f"needs the paper's GPU scale: {c.gpu}"
            if c.gpu
            else f"experiments/paper/{study.experiment} at size {study.size} (results/{folder}/ not published yet)"
        )
        return row
    lacking = lacking_runs(c.runs, st)
    if lacking:  # a study published in part (its other runs still training): the claim waits for them
        row["scale"], row["lacking"] = scale_of_config(root, study.experiment, study.size, scale_run), lacking
        row["detail"] = (
            f"results/{folder}/ is published in part: no records of {', '.join(lacking)} yet "
            f"(experiments/paper/{study.experiment} at size {study.size})"
        )
        return row
    row["results"] = folder
    _test_pair(row, c, claims, studies, copy_of, seen)
    return row


def _test_pair(row: ClaimRow, c: Any, claims: ClaimsFile, studies: dict, copy_of: dict, seen: dict) -> None:
    """Fill a pair claim's row from its published study (``row["results"]``): its per-seed gaps, its tests read by
    the study's plan, its rate arms and controls, and the reading over them (``robust.combine``)."""
    folder, domains = row["results"], row["domains"]
    st = studies[folder]
    scale_run = c.run or c.reference
    band = _own_band(row, c, st)
    got = claim_values(c, st, domains, band)
    key = comparison_key(c, st, got["used"], domains)
    if key in seen:
        raise ConfigError(f"claim {c.id} repeats the comparison of claim {seen[key]} (the same run records): a comparison enters the family once")
    seen[key] = c.id
    row["seeds"], row["values"], row["parts"], row["notes"] = got["seeds"], got["values"], got["parts"], got["notes"]
    row["scale"] = scale_of_run(st.runs[next(k for k in got["used"] if k[0] == scale_run)]) if got["used"] else None
    row["reused"] = [{"run": f"{n}-s{s}", "copy_of": copy_of[(folder, f"{n}-s{s}")]} for n, s in got["used"] if (folder, f"{n}-s{s}") in copy_of]
    plan = row["plan"] = plan_of(claims, c.study)
    row["test"] = apply_plan(claim_tests(c, got["values"], claim_margin(c, claims.margin)), plan)
    row["arms"] = arms_of(c, claims, studies, domains)
    row["controls"] = arms_of(c, claims, studies, domains, c.controls)
    row["study_obj"] = st
    combine(row)


def _own_band(row: ClaimRow, c: Claim, st: Study) -> tuple[float, float] | None:
    """Where the claim's own comparison is read when its pair does not reach the study's band on every seed: the
    pair's rule band, as for its rate arms (``robust.pair_band``; docs/metrics.md, "When a curve cannot reach the
    band"). None when the band is held (or there is no band to move to: the reading then says which seeds lack it)."""
    moved = pair_band(c, st)
    if moved is None or moved["band"] is None:
        return None
    band = (float(moved["band"][0]), float(moved["band"][1]))
    row["band"] = list(band)
    row["band_note"] = (
        f"read at {band[0]:.2f}-{band[1]:.2f}: the study's band is not inside the pair's common reach "
        f"(the lowest level every seed of both runs reaches is {moved['common'][0]:.3f}; docs/metrics.md, rule band)"
    )
    return band


def _read_robustness(rows: list[ClaimRow], claims: ClaimsFile) -> None:
    """Each tested pair claim of the family under every pre-declared specification, and its gap along training."""
    for r in rows:
        if r["family"] and r.get("test") and r["test"]["n"] >= 2 and r["metric"] == "ood_gap":
            specifications(r, r["claim_obj"], r["study_obj"], claims, r["domains"], claims.alpha)
            r["gap_along_training"] = gap_along_training(r["claim_obj"], r["study_obj"], r["domains"])


def _strip_internals(rows: list[ClaimRow]) -> None:
    """Drop what the rows carried for the computation only (objects, plans, resamples): not part of the card."""
    for r in rows:
        r.pop("claim_obj", None)
        r.pop("study_obj", None)
        r.pop("plan", None)
        r.pop("decider", None)
        if r.get("test"):
            r["test"].pop("_resampled", None)


def build_scorecard(root: str | Path = ".", claims_path: str | Path | None = None, principle_path: str | Path | None = None) -> dict:
    """The scorecard of the claims file against the studies under ``root``/results (paths relative to ``root``),
    with the principle (principle.toml beside the claims file, when it exists) as one more claim of the family and its
    predictions outside it."""
    root = Path(root)
    claims_file = root / (claims_path or CLAIMS_FILE)
    claims = load_claims(claims_file, root)
    studies = load_studies(root / "results")
    principle_file = root / principle_path if principle_path else claims_file.with_name(PRINCIPLE_FILE.name)
    spec = load_principle(principle_file, claims, root) if principle_file.is_file() else None
    copies = provenance(studies)
    copy_of = {(c["study"], c["run"]): c["copy_of"] for c in copies}
    seen: dict = {}
    rows = [_claim_row(c, claims, studies, root, copy_of, seen) for c in claims.claims]
    principle = None
    if spec is not None:
        row, principle = principle_row(spec, claims, studies, root)
        rows.append(row)
    m = decide(rows, claims.alpha, claims.power)
    m_gpu = decide(rows, claims.alpha, claims.power, family="gpu_family")
    _read_robustness(rows, claims)
    steps = scale_steps(root, claims, studies, rows)
    _strip_internals(rows)
    sim_path = root / "results" / "error_control.json"
    return {
        "error_control": json.loads(sim_path.read_text(encoding="utf-8")) if sim_path.is_file() else None,
        "plans": plans(claims, [r for r in rows if r["family"]]),
        "margin": claims.margin,
        "margin_reason": " ".join(claims.margin_reason.split()),
        "alpha": claims.alpha,
        "power": claims.power,
        "family_size": m,
        "gpu_family_size": m_gpu,
        "claims": rows,
        "scale_steps": steps,
        "principle": principle,
        "predictions": predictions(spec, claims, studies) if spec is not None else [],
        "studies": sorted(studies),
        "run_records": sum(len(st.runs) for st in studies.values()),
        "distinct_runs": len({fp for st in studies.values() for fp in st.fingerprints.values()}),
        "copies": copies,
    }
