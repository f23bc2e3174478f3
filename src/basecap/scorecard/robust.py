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

from .claims import Arm, Claim, ClaimsFile
from .compute import Study, claim_values, lacking_runs, level_band
from .sequential import Plan
from .verdicts import FAILS, HOLDS, UNDECIDED, claim_margin, claim_tests

SPECS = (("targets: all", "annealed_all", "band"), ("level: lowest", "primary", "lowest"), ("level: half", "primary", "half"))


def plan_of(claims: ClaimsFile, study: str) -> Plan:
    st = claims.studies[study]
    return Plan(tuple(st.looks), st.spending, tuple(st.looks_taken))


def read(claim: Claim, study: Study, plan: Plan, domains: list[str], margin: float, band=None) -> dict:
    """One specification of a claim: its per-seed values, tests and the p values after the study's plan."""
    got = claim_values(claim, study, domains, band)
    t = claim_tests(claim, got["values"], claim_margin(claim, margin))
    t["p_holds_plan"], t["plan"] = plan.adjust(t["p_holds"], t["n"])
    t["p_fails_plan"], _ = plan.adjust(t["p_fails"], t["n"])
    return {"test": t, "seeds": got["seeds"], "values": got["values"], "parts": got["parts"], "used": got["used"]}


def arm_claim(claim: Claim, arm: Arm) -> Claim:
    return claim.model_copy(update={"study": arm.study, "run": arm.run, "reference": arm.reference, "arms": [], "measure": "primary"})


def arms_of(claim: Claim, claims: ClaimsFile, studies: dict[str, Study], domains: list[str]) -> list[dict]:
    """Each arm of ``claim``: its reading, or what it waits for (then its p values count as 1: the claim cannot hold
    or fail before every arm is in)."""
    out = []
    for arm in claim.arms:
        c = arm_claim(claim, arm)
        folder = claims.results_dir(arm.study)
        st = studies.get(folder)
        entry: dict = {"label": arm.label, "study": arm.study, "results": folder, "run": arm.run, "reference": arm.reference}
        lacking = lacking_runs(c.runs, st) if st is not None else c.runs
        if st is None or lacking:
            entry.update(status="waiting", detail=f"results/{folder}/ {'has no records of ' + ', '.join(lacking) if st else 'is not published yet'}")
            entry["test"] = None
        else:
            entry.update(status="measured", **read(c, st, plan_of(claims, arm.study), domains, claims.margin))
        out.append(entry)
    return out


def combine(row: dict) -> None:
    """The claim's p values for the family: the largest of its own and its arms' (after each study's plan); a note
    names the arms that wait or that break the verdict's direction."""
    t = row["test"]
    own_h, own_f = t["p_holds_plan"], t["p_fails_plan"]
    arms = row.get("arms") or []
    ph = [own_h] + [a["test"]["p_holds_plan"] if a.get("test") and a["test"]["n"] >= 2 else 1.0 for a in arms]
    pf = [own_f] + [a["test"]["p_fails_plan"] if a.get("test") and a["test"]["n"] >= 2 else 1.0 for a in arms]
    t["p_holds_claim"], t["p_fails_claim"] = max(ph), max(pf)
    waiting = [a["label"] for a in arms if a["status"] == "waiting"]
    if waiting:
        row["arm_note"] = f"arms still to come: {', '.join(waiting)}"


def verdict_at(t: dict | None, a_holds: float, a_fails: float) -> str:
    """A specification's verdict at the levels the claim's verdict used (its steps' alpha / divisor)."""
    if not t or t["n"] < 2:
        return UNDECIDED
    if t["p_holds_plan"] <= a_holds:
        return HOLDS
    if t["p_fails_plan"] <= a_fails:
        return FAILS
    return UNDECIDED


def specifications(row: dict, claim: Claim, study: Study, claims: ClaimsFile, domains: list[str], alpha: float) -> None:
    """The specification table of a tested claim (``row["specs"]``) and its robustness label."""
    t = row["test"]
    a_h, a_f = t["level_holds"], t["level_fails"]  # the levels the claim's verdict used (alpha / m if undecided)
    plan = plan_of(claims, claim.study) if claim.study else Plan()
    specs = [{"spec": "primary (the study's own)", "estimate": t["mean"], "ci95": t["ci95"], "n": t["n"], "verdict": verdict_at(t, a_h, a_f)}]
    if (study.summary.get("design") or {}).get("band"):
        for label, measure, level in SPECS:
            band = level_band(claim, study, level)
            if band is None:
                specs.append({"spec": label, "estimate": None, "ci95": None, "n": 0, "verdict": "n/a", "detail": "no level to read"})
                continue
            c = claim.model_copy(update={"measure": measure})
            try:
                got = read(c, study, plan, domains, claims.margin, None if level == "band" else band)
            except (ValueError, KeyError) as e:  # a curve that does not reach the band: no reading there
                specs.append({"spec": label, "estimate": None, "ci95": None, "n": 0, "verdict": "n/a", "detail": str(e)})
                continue
            st = got["test"]
            if st["n"] < 2:
                specs.append(
                    {
                        "spec": label,
                        "band": [round(band[0], 4), round(band[1], 4)],
                        "estimate": st["mean"],
                        "ci95": None,
                        "n": st["n"],
                        "verdict": "n/a",
                        "detail": "fewer than 2 seeds reach the band",
                    }
                )
                continue
            specs.append(
                {
                    "spec": label,
                    "band": [round(band[0], 4), round(band[1], 4)],
                    "estimate": st["mean"],
                    "ci95": st["ci95"],
                    "n": st["n"],
                    "verdict": verdict_at(st, a_h, a_f),
                }
            )
    for a in row.get("arms") or []:
        at = a.get("test")
        specs.append(
            {
                "spec": f"rate arm {a['label'].split(':')[0]}",
                "label": a["label"],
                "estimate": at["mean"] if at else None,
                "ci95": at["ci95"] if at else None,
                "n": at["n"] if at else 0,
                "verdict": verdict_at(at, a_h, a_f) if at else "waiting",
            }
        )
    row["specs"] = specs
    readable = [s for s in specs[1:] if s["verdict"] not in ("n/a", "waiting")]
    breaks = [s["spec"] for s in readable if s["verdict"] != row["verdict"]]
    missing = [s["spec"] for s in specs[1:] if s["verdict"] in ("n/a", "waiting")]
    row["robust"] = not breaks and not missing
    row["breaks"] = breaks
    row["robust_missing"] = missing
