"""The principle out of sample: what it predicts for architectures published after the paper (``[[predictions]]`` of
``experiments/paper/principle.toml``), scored against their measured gaps (docs/metrics.md, "Predictions").

Each architecture is trained through ``basecap compare`` into a study of its own; the scorecard finds the published
study (a results folder with summary.json) that holds records of the run named after the architecture and of
``transformer_pp``, and its arm A in the run ``<architecture>_lr2e-3`` (the architecture at Transformer++'s rate, the
rate arms' naming). Outside the family: each prediction is its own test of the principle, read at alpha with 95%
intervals. The measured outcome is claim-style, an intersection-union over the tuned comparison and arm A:
*keeps* when the gap is shown within the margin (TOST) in both; else *degrades* when it is shown worse (the two-sided
test, in that direction) in both; else *undecided*; each p value read through the plan of looks of the study whose
design the architecture joined (``compare.json``'s ``study``: seeds were added at its planned looks). A gap shown worse but within the margin is *keeps*: below the
margin a difference is too small to call a change of base capability (the claims file's margin_reason).

What the outcome survives: the same outcome read again under each of the scorecard's specifications
(``robust.SPECS``: every target, the band at the lowest common level, at half of training), each on its own. The
outcome is *robust* when every specification gives it; a call or a miss that one defensible choice undoes is fragile.
"""

from __future__ import annotations

import json

from .claims import Claim, ClaimsFile
from .compute import Study, claim_values, lacking_runs
from .principle import PrincipleFile
from .robust import under_specifications
from .sequential import Plan
from .verdicts import claim_tests

REFERENCE = "transformer_pp"
ARM_A = "{architecture}_lr2e-3"


def _find_study(architecture: str, studies: dict) -> str | None:
    """The published study with records of the architecture and of Transformer++ (one named after the architecture
    first, when several have both)."""
    have = [name for name, st in sorted(studies.items()) if not lacking_runs([architecture, REFERENCE], st)]
    named = [n for n in have if architecture in n]
    return (named or have or [None])[0]


def _claim(study: Study, run: str) -> Claim:
    return Claim(id="prediction", section="predictions", paper="-", study=study.name, expect="no_effect", run=run, reference=REFERENCE)


def _reading(c: Claim, study: Study, domains: list[str], margin: float, band: tuple[float, float] | None = None) -> dict:
    """The claim ``c`` (a run against Transformer++): per-seed gaps and both tests, in the study's band (``band``
    None) or the one given, on the claim's measure."""
    got = claim_values(c, study, domains, band)
    keeps = claim_tests(c, got["values"], margin)
    worse = claim_tests(c.model_copy(update={"expect": "worse"}), got["values"], margin)
    return {
        "run": c.run,
        "seeds": got["seeds"],
        "values": got["values"],
        "n": keeps["n"],
        "mean": keeps["mean"],
        "ci95": keeps["ci95"],
        "p_keeps": keeps["p_holds"],
        "p_degrades": worse["p_holds"],
    }


def _plan(st: Study, claims: ClaimsFile) -> Plan:
    """The plan of looks the architecture's seeds were added by: that of the study ``basecap compare`` joined (its
    compare.json's ``study``), else the study's own where the claims file declares one, else none."""
    from .robust import plan_of

    joined = st.dir / "compare.json"
    name = json.loads(joined.read_text(encoding="utf-8")).get("study") if joined.is_file() else st.name
    return plan_of(claims, name) if name in claims.studies else Plan()


def _outcome(readings: list[dict], plan: Plan, alpha: float) -> tuple[str, float, float, str]:
    """The intersection-union outcome over the readings, each p value through ``plan``: (outcome, p keeps, p degrades,
    how the plan read them)."""
    keeps = [plan.adjust(r["p_keeps"], r["n"]) for r in readings]
    degrades = [plan.adjust(r["p_degrades"], r["n"]) for r in readings]
    p_keeps, p_degrades = max(p for p, _ in keeps), max(p for p, _ in degrades)
    outcome = "keeps" if p_keeps <= alpha else "degrades" if p_degrades <= alpha else "undecided"
    return outcome, p_keeps, p_degrades, keeps[0][1]


def predictions(spec: PrincipleFile, claims: ClaimsFile, studies: dict) -> list[dict]:
    """One entry per prediction: what the principle predicted and why, the measured gaps (tuned, arm A), the outcome
    and whether the principle called it (called / missed / not yet decided / not run)."""
    out = []
    alpha, margin = claims.alpha, claims.margin
    for p in spec.predictions:
        entry: dict = {
            "architecture": p.architecture,
            "paper": p.paper,
            "predicts": p.predicts,
            "why": " ".join(p.why.split()),
            "results": None,
            "tuned": None,
            "arm_a": None,
            "outcome": "not run",
            "called": "not run",
            "detail": f"no published study has records of {p.architecture} and {REFERENCE} yet (`basecap compare`)",
        }
        out.append(entry)
        name = _find_study(p.architecture, studies)
        if name is None:
            continue
        st = studies[name]
        arm_run = ARM_A.format(architecture=p.architecture)
        entry.update(results=name, tuned=_reading(_claim(st, p.architecture), st, claims.domains, margin), detail="")
        if lacking_runs([arm_run], st):
            entry["detail"] = f"arm A ({arm_run}) still to come"
        else:
            entry["arm_a"] = _reading(_claim(st, arm_run), st, claims.domains, margin)
        readings = [entry["tuned"], entry["arm_a"]]
        if any(r is None or r["n"] < 2 for r in readings):
            entry.update(outcome="undecided", called="not yet decided")
            entry["detail"] = entry["detail"] or "fewer than 2 seeds"
            continue
        plan = _plan(st, claims)
        outcome, p_keeps, p_degrades, how = _outcome(readings, plan, alpha)
        entry.update(outcome=outcome, p_keeps=p_keeps, p_degrades=p_degrades, read=how or "one look")
        entry["called"] = "not yet decided" if outcome == "undecided" else "called" if outcome == p.predicts else "missed"
        entry["specs"] = _specifications(st, p.architecture, arm_run, claims, plan)
        entry["robust"] = all(sp["outcome"] == outcome for sp in entry["specs"])
    return out


def _specifications(st: Study, architecture: str, arm_run: str, claims: ClaimsFile, plan: Plan) -> list[dict]:
    """The outcome under each specification on its own (the tuned comparison and arm A, as the outcome is read)."""

    def reading(c: Claim, band: tuple[float, float] | None) -> dict:
        return _reading(c, st, claims.domains, claims.margin, band)

    tuned, arm_a = (under_specifications(_claim(st, run), st, reading) for run in (architecture, arm_run))
    specs = []
    for a, b in zip(tuned, arm_a, strict=True):
        if a.result is None or b.result is None:
            specs.append({"spec": a.spec, "outcome": "n/a", "detail": a.detail or b.detail})
            continue
        rs = [a.result, b.result]
        if any(r["n"] < 2 for r in rs):
            specs.append({"spec": a.spec, "outcome": "n/a", "detail": "fewer than 2 seeds"})
            continue
        outcome = _outcome(rs, plan, claims.alpha)[0]
        specs.append({"spec": a.spec, "outcome": outcome, "mean": rs[0]["mean"], "ci95": rs[0]["ci95"]})
    return specs
