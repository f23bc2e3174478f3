"""The new architecture's row: its gap against the reference in each rate arm, read as the scorecard reads a claim.

Per arm, the per-seed gap at matched in-domain loss is the scorecard's (``scorecard.compute.pair_gaps``: the study's
primary measure, the mean of the held-out domains' gaps), tested by the scorecard's two tests
(``scorecard.verdicts.claim_tests``) and read through the study's plan of looks (``scorecard.sequential.Plan``):
*keeps* when TOST shows the gap within the margin, else *degrades* when the two-sided test shows it worse, else
*undecided* (as the scorecard's predictions read an outcome: a gap shown worse but within the margin is too small to
call a change of base capability). The row's verdict is an intersection-union over the arms the study has (tuned,
A, and B where the reference trained at the architecture's rate): each p value the largest of the arms'.

What the verdict survives (``spec_readings``, ``robustness``): each arm is read again under the scorecard's
specifications (``scorecard.robust.SPECS``: every target instead of the seen ones, the band at the lowest level
every curve reaches, the band at the level of half of training), each choice on its own, with the same tests and plan.
The verdict is *robust* when every arm under every specification gives it; otherwise the row names the choices that
break it (docs/metrics.md, "Robust verdicts").
"""

from __future__ import annotations

from typing import Any, TypedDict

from ..report.stats import paired_test
from ..scorecard.claims import Claim
from ..scorecard.compute import Study, lacking_runs, pair_gaps
from ..scorecard.robust import read, under_specifications
from ..scorecard.verdicts import claim_tests
from .study import Design

KEEPS, DEGRADES, UNDECIDED, NOT_RUN, NO_GAP = "keeps", "degrades", "undecided", "not run", "no gap"


class Interval(TypedDict):
    n: int
    gap: float | None
    ci95: list[float] | None


class SpecReading(TypedDict, total=False):
    """One arm read under one specification (``spec_readings``)."""

    spec: str  # "targets: all", "level: lowest", "level: half"
    band: list[float]  # the in-domain band it was read in (the study's for "targets: all")
    n: int
    gap: float | None
    ci95: list[float] | None
    verdict: str  # keeps / degrades / undecided, or "n/a" with ``detail``
    detail: str


class ArmReading(TypedDict, total=False):
    """One rate arm of the row (``arm_reading``)."""

    arm: str  # "tuned", "A" or "B"
    run: str
    reference: str
    lr: float
    verdict: str
    n: int  # paired seeds
    gap: float | None  # the mean over seeds of the mean over held-out domains
    ci95: list[float] | None
    note: str  # why an arm has no reading
    seeds: list[int]
    values: list[float]
    domains: dict[str, Interval]
    notes: list[str]
    p_keeps: float
    p_degrades: float
    reading: str  # how the study's plan of looks read the p values
    specs: list[SpecReading]  # the arm under each specification (``spec_readings``)


class Robustness(TypedDict):
    robust: bool  # every arm under every specification gives the row's verdict
    breaks: list[str]  # "arm A: level: lowest (undecided)": where another verdict comes out
    missing: list[str]  # where a specification cannot be read (no level to read, fewer than 2 seeds)


class Overall(TypedDict, total=False):
    verdict: str
    note: str
    p_keeps: float
    p_degrades: float


class CompareRow(TypedDict, total=False):
    """The new architecture's row: ``compare.json`` and what ``basecap compare`` prints (``row_text``)."""

    architecture: str
    mixer: dict[str, Any]
    mixer_files: list[dict[str, Any]]
    study: str
    size: str | None
    experiment: str
    reference: str
    reference_mixer: str
    lr: float
    grid: list[float]
    tuning: dict[str, Any] | None
    reference_lr: float
    compiled: bool  # the new architecture's runs trained with train.compile (the reference's as published)
    arm_b_note: str | None
    seeds: list[int]
    looks: list[int]
    domains: list[str]
    margin: float
    alpha: float
    arms: list[ArmReading]
    overall: Overall
    robustness: Robustness  # whether every arm under every specification gives the verdict
    in_domain_loss: float | None
    params: dict[str, Any] | None
    corpus: str
    cost: str
    state_bytes: int
    state_at: int
    state_grows: bool
    commit: str | None
    dirty: bool | None
    mqar: dict[str, Any]
    speed: dict[Any, dict[str, Any]]
    wall_seconds: float
    trained: dict[str, Any]  # the runs this comparison trained (tuning and seeds, not the copies): count and wall seconds


def _claim(design: Design, run: str, reference: str, expect: str) -> Claim:
    return Claim(id="compare", section="compare", paper="-", study=design.name, expect=expect, run=run, reference=reference)


def _interval(values: list[float]) -> Interval:
    t = paired_test(values)
    return {"n": t.n, "gap": t.mean, "ci95": list(t.ci95) if t.ci95 else None}


def verdict(p_keeps: float, p_degrades: float, alpha: float) -> str:
    return KEEPS if p_keeps <= alpha else DEGRADES if p_degrades <= alpha else UNDECIDED


def arm_reading(design: Design, study: Study, arm: str, run: str, reference: str, lr: float) -> ArmReading:
    """One arm: the per-seed gaps of ``run`` against ``reference`` (paired by seed), per domain and their mean, the
    two tests read through the study's plan, and the arm's verdict."""
    out: ArmReading = {"arm": arm, "run": run, "reference": reference, "lr": lr, "verdict": NOT_RUN, "n": 0, "gap": None, "ci95": None}
    missing = lacking_runs([run, reference], study)
    if missing:
        out["note"] = f"no records of {', '.join(missing)}"
        return out
    by_domain, notes = pair_gaps(study, run, reference, design.domains)
    seeds = sorted(set.intersection(*(set(by_domain.get(d, {})) for d in design.domains)))
    values = [sum(by_domain[d][s] for d in design.domains) / len(design.domains) for s in seeds]
    mean = _interval(values)
    out["seeds"], out["values"], out["n"], out["gap"], out["ci95"] = seeds, values, mean["n"], mean["gap"], mean["ci95"]
    out["domains"] = {d: _interval([by_domain[d][s] for s in seeds]) for d in design.domains}
    if notes:
        out["notes"] = notes
    keeps = claim_tests(_claim(design, run, reference, "no_effect"), values, design.margin)
    worse = claim_tests(_claim(design, run, reference, "worse"), values, design.margin)
    (p_keeps, reading), (p_degrades, _) = design.plan.adjust(keeps["p_holds"], len(values)), design.plan.adjust(worse["p_holds"], len(values))
    out["p_keeps"], out["p_degrades"], out["reading"] = p_keeps, p_degrades, reading or "one look"
    out["verdict"] = verdict(p_keeps, p_degrades, design.alpha) if len(values) >= 2 else UNDECIDED if values else NO_GAP
    return out


def spec_readings(design: Design, study: Study, arm: ArmReading) -> list[SpecReading]:
    """``arm`` read under each of the scorecard's specifications, each choice on its own: the same per-seed pairing,
    tests and plan of looks as the arm's own reading, in the band the specification places."""

    def both(c: Claim, at: tuple[float, float] | None) -> tuple[dict, dict]:
        k, w = (read(x, study, design.plan, design.domains, design.margin, at)["test"] for x in (c, c.model_copy(update={"expect": "worse"})))
        return k, w

    out: list[SpecReading] = []
    for p in under_specifications(_claim(design, arm["run"], arm["reference"], "no_effect"), study, both):
        if p.result is None:
            out.append(
                {
                    "spec": p.spec,
                    **({"band": p.band} if p.band else {}),
                    "n": 0,
                    "gap": None,
                    "ci95": None,
                    "verdict": "n/a",
                    "detail": p.detail or "",
                }
            )
            continue
        k, w = p.result
        got: SpecReading = {"spec": p.spec, "band": p.band or [], "n": k["n"], "gap": k["mean"], "ci95": k["ci95"]}
        if k["n"] < 2:
            got["verdict"], got["detail"] = "n/a", "fewer than 2 seeds reach the band"
        else:
            got["verdict"] = verdict(k["p_holds_plan"], w["p_holds_plan"], design.alpha)
        out.append(got)
    return out


def robustness(arms: list[ArmReading], verdict_: str) -> Robustness:
    """Whether every arm under every specification gives the row's verdict ``verdict_`` (arms with their readings)."""
    breaks = [f"arm {a['arm']}: {s['spec']} ({s['verdict']})" for a in arms for s in a.get("specs", []) if s["verdict"] not in ("n/a", verdict_)]
    breaks = [f"arm {a['arm']} ({a['verdict']})" for a in arms if a["verdict"] != verdict_] + breaks
    missing = [f"arm {a['arm']}: {s['spec']} ({s.get('detail', 'n/a')})" for a in arms for s in a.get("specs", []) if s["verdict"] == "n/a"]
    return {"robust": not breaks and not missing, "breaks": breaks, "missing": missing}


def overall(arms: list[ArmReading], alpha: float) -> Overall:
    """The intersection-union over the arms: each p value the largest of the arms' (an arm without two paired seeds
    leaves the row undecided, naming it)."""
    short = [a["arm"] for a in arms if a["n"] < 2]
    if short:
        return {"verdict": UNDECIDED if any(a["n"] for a in arms) else NOT_RUN, "note": f"fewer than 2 paired seeds in arm {', '.join(short)}"}
    p_keeps, p_degrades = max(a["p_keeps"] for a in arms), max(a["p_degrades"] for a in arms)
    return {"verdict": verdict(p_keeps, p_degrades, alpha), "p_keeps": p_keeps, "p_degrades": p_degrades}


def _num(v: float | None, fmt: str = "+.3f") -> str:
    return "-" if v is None else format(v, fmt)


def _ci(ci: list[float] | None) -> str:
    return "-" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


ARM_TEXT = {"tuned": "tuned", "A": "arm A (the reference's rate)", "B": "arm B (the architecture's rate)"}


def row_text(row: CompareRow) -> str:
    """The row as a few lines of plain text (what ``basecap compare`` prints)."""
    lines = [
        f"{row['architecture']} against {row['reference']} in {row['study']} (size {row['size']}, seeds {', '.join(map(str, row['seeds']))}; "
        f"tuned rate {row['lr']:g} from {', '.join(f'{x:g}' for x in row['grid'])}" + ("; its runs compiled)" if row.get("compiled") else ")"),
        f"  {'':<44}{'seeds':>6}{'gap':>9}  {'95% interval':<18}" + "".join(f"{d:>9}" for d in row["domains"]) + "  verdict",
    ]
    for a in row["arms"]:
        label = f"{ARM_TEXT[a['arm']]}, lr {a['lr']:g}"
        gaps = {d: iv["gap"] for d, iv in a.get("domains", {}).items()}
        doms = "".join(f"{_num(gaps.get(d)):>9}" for d in row["domains"])
        why = (a.get("note") or next(iter(a.get("notes") or []), None)) if not a["n"] else None
        lines.append(f"  {label:<44}{a['n']:>6}{_num(a['gap']):>9}  {_ci(a['ci95']):<18}{doms}  {a['verdict']}" + (f" ({why})" if why else ""))
    o = row["overall"]
    ps = (
        f" (p keeps {o['p_keeps']:.3g}, p degrades {o['p_degrades']:.3g}, read {row['arms'][0].get('reading', 'one look')})" if "p_keeps" in o else ""
    )
    lines.append(f"  verdict over the arms: {o['verdict']}{ps}" + (f"; {o['note']}" if o.get("note") else ""))
    for a in row["arms"]:
        specs = "; ".join(f"{s['spec']} {_num(s.get('gap'))} {_ci(s.get('ci95'))} {s['verdict']}" for s in a.get("specs", []))
        if specs:
            lines.append(f"    {ARM_TEXT[a['arm']]} under each specification: {specs}")
    rb = row.get("robustness")
    if rb:
        lines.append(
            "  robust: yes, every arm under every specification gives it"
            if rb["robust"]
            else "  robust: no; " + "; ".join([*(f"breaks at {b}" for b in rb["breaks"]), *(f"not read at {m}" for m in rb["missing"])])
        )
    extra = []
    if row.get("mqar"):
        m = row["mqar"]
        extra.append(
            f"MQAR accuracy at {m['score_kv_pairs']} pairs {m['mean']:.3f} over {len(m['values'])} seed(s)"
            + (" (shortened protocol)" if m.get("shortened") else "")
        )
    if row.get("state_bytes") is not None:
        extra.append(
            f"state {row['state_bytes'] / 2**10:.1f} KiB/sequence at T={row['state_at']}" + (" (grows with T)" if row.get("state_grows") else "")
        )
    for T, s in (row.get("speed") or {}).items():
        extra.append(f"speed at T={T}: {s['tokens_per_s']:,.0f} tokens/s forward+backward, {s['x_reference']:.2f}x {row['reference_mixer']}'s")
    if row.get("cost"):
        extra.append(f"cost {row['cost']}")
    params = row.get("params")
    if params:
        extra.append(f"{params['non_embedding'] / 1e6:.2f}M non-embedding parameters, in-domain loss {_num(row.get('in_domain_loss'), '.3f')}")
    if row.get("trained"):
        t = row["trained"]
        extra.append(
            f"trained {t['runs']} runs in {t['seconds']:,.0f} s of wall clock (their run.json; this invocation {row['wall_seconds']:,.0f} s)"
        )
    lines += [f"  {x}" for x in extra]
    return "\n".join(lines)
