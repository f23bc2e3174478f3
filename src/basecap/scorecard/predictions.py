"""The principle out of sample: what it predicts for architectures published after the paper (``[[predictions]]`` of
``experiments/paper/principle.toml``), scored against their measured gaps (docs/metrics.md, "Predictions").

Each architecture is trained through ``basecap compare`` into a study of its own; the scorecard finds the published
study (a results folder with summary.json) that holds records of the run named after the architecture and of
``transformer_pp``, and its arm A in the run ``<architecture>_lr2e-3`` (the architecture at Transformer++'s rate, the
rate arms' naming). Outside the family: each prediction is its own test of the principle, read at alpha with 95%
intervals. The measured outcome is claim-style, an intersection-union over the tuned comparison and arm A:
*keeps* when the gap is shown within the margin (TOST) in both; else *degrades* when it is shown worse (the two-sided
test, in that direction) in both; else *undecided*. A gap shown worse but within the margin is *keeps*: below the
margin a difference is too small to call a change of base capability (the claims file's margin_reason).
"""

from __future__ import annotations

from .claims import Claim, ClaimsFile
from .compute import Study, claim_values, lacking_runs
from .principle import PrincipleFile
from .verdicts import claim_tests

REFERENCE = "transformer_pp"
ARM_A = "{architecture}_lr2e-3"


def _find_study(architecture: str, studies: dict) -> str | None:
    """The published study with records of the architecture and of Transformer++ (one named after the architecture
    first, when several have both)."""
    have = [name for name, st in sorted(studies.items()) if not lacking_runs([architecture, REFERENCE], st)]
    named = [n for n in have if architecture in n]
    return (named or have or [None])[0]


def _reading(study: Study, run: str, domains: list[str], margin: float) -> dict:
    c = Claim(id="prediction", section="predictions", paper="-", study=study.name, expect="no_effect", run=run, reference=REFERENCE)
    got = claim_values(c, study, domains)
    keeps = claim_tests(c, got["values"], margin)
    worse = claim_tests(c.model_copy(update={"expect": "worse"}), got["values"], margin)
    return {
        "run": run,
        "seeds": got["seeds"],
        "values": got["values"],
        "n": keeps["n"],
        "mean": keeps["mean"],
        "ci95": keeps["ci95"],
        "p_keeps": keeps["p_holds"],
        "p_degrades": worse["p_holds"],
    }


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
        entry.update(results=name, tuned=_reading(st, p.architecture, claims.domains, margin), detail="")
        if lacking_runs([arm_run], st):
            entry["detail"] = f"arm A ({arm_run}) still to come"
        else:
            entry["arm_a"] = _reading(st, arm_run, claims.domains, margin)
        readings = [entry["tuned"], entry["arm_a"]]
        if any(r is None or r["n"] < 2 for r in readings):
            entry.update(outcome="undecided", called="not yet decided")
            entry["detail"] = entry["detail"] or "fewer than 2 seeds"
            continue
        p_keeps, p_degrades = (max(r[k] for r in readings) for k in ("p_keeps", "p_degrades"))
        outcome = "keeps" if p_keeps <= alpha else "degrades" if p_degrades <= alpha else "undecided"
        entry.update(outcome=outcome, p_keeps=p_keeps, p_degrades=p_degrades)
        entry["called"] = "not yet decided" if outcome == "undecided" else "called" if outcome == p.predicts else "missed"
    return out
