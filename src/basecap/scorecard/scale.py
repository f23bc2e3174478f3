"""Scale steps (``[[scale_steps]]`` of the claims file): a claim measured again at another size, outside the family.

A step compares the runs that answer its claim (their names in the study that answers it) in another study, an
experiment file at a larger size. Its gap is a one-sample test over seeds with an uncorrected 95% interval, shown
beside the claim's gap at its own size, with the difference of the two (the step's gap minus the claim's; Welch's
interval, ``scipy.stats.ttest_ind(equal_var=False)``: the two sizes' runs are independent trainings). It enters no
Holm family and carries no verdict: it says whether the claim's gap keeps its size when the model and its tokens grow.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scipy import stats

from ..report.stats import paired_test
from .compute import claim_values, lacking_runs, level_band, scale_of_config, scale_of_run
from .gap_model import gap_model
from .robust import seed_gaps
from .rows import ClaimRow

if TYPE_CHECKING:
    from .claims import Claim
    from .compute import Study

# where else a step reads its gap, at both sizes (the specifications of docs/metrics.md, "Robust verdicts"): each
# size at the lowest level every curve of its pair reaches, and at the level its slowest run reaches at half of
# training (the same fraction of training at both sizes)
STEP_LEVELS = (("lowest common level", "lowest"), ("half of training", "half"))


def _test(values: list[float]) -> dict:
    t = paired_test(values)
    return {"mean": t.mean, "ci95": list(t.ci95) if t.ci95 else None, "n": t.n, "sd": t.sd, "p": t.p}


def welch(a: list[float], b: list[float]) -> dict | None:
    """mean(a) - mean(b) with Welch's 95% interval and two-sided p (None with fewer than 2 values on a side)."""
    if len(a) < 2 or len(b) < 2:
        return None
    res = stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(0.95)
    return {"mean": float(sum(a) / len(a) - sum(b) / len(b)), "ci95": [float(ci.low), float(ci.high)], "p": float(res.pvalue), "df": float(res.df)}


def reading(test: dict | None, sign: int) -> str:
    """Where the uncorrected interval lies, in the claim's words (no verdict: the step is outside the family)."""
    if not test or not test.get("ci95"):
        return "too few seeds for an interval"
    lo, hi = test["ci95"]
    side = "above 0" if lo > 0 else "below 0" if hi < 0 else "includes 0"
    if side == "includes 0" or sign == 0:
        return f"the 95% interval {side}"
    return f"the 95% interval {side}: {'the paper' + chr(39) + 's direction' if (lo > 0) == (sign > 0) else 'against the paper'}"


def scale_steps(root: Path, claims: Any, studies: dict, rows: list[ClaimRow]) -> list[dict]:
    """One entry per scale step: the claim's gap at its own size (from its row) and at the step's size."""
    out = []
    target: dict | None = None  # the paper's size a trend is carried to, built once (a model on the meta device)
    for step in claims.scale_steps:
        row: dict = dict(next(r for r in rows if r["id"] == step.claim))
        c = claims.step_claim(step)
        if step.base is not None:  # the smaller size's gap from the base study, with the step's runs
            row, base_claim = _base_row(root, claims, studies, step, row), claims.step_claim(step, step.base)
        else:
            base_claim = row.get("claim_obj")
        spec, folder = claims.studies[step.study], claims.results_dir(step.study)
        st = studies.get(folder)
        base_study = row["study"]
        entry = {
            "claim": step.claim,
            "paper": row["paper"],
            "why": step.why,
            "family": step.family,
            "runs": c.runs,
            "study": step.study,
            "experiment": spec.experiment,
            "size": spec.size,
            "label": spec.label,
            "results": None,
            "status": "not run",
            "detail": f"experiments/paper/{spec.experiment} at size {spec.size} (results/{folder}/ not published yet)",
            "seeds": [],
            "values": [],
            "test": None,
            "difference": None,
            "reading": "",
            "scale": None,
            "base": {
                "study": base_study,
                "results": row["results"],
                "size": claims.studies[base_study].size if base_study else None,
                "seeds": row["seeds"],
                "test": {k: (row["test"] or {}).get(k) for k in ("mean", "ci95", "n", "sd", "p")} if row["test"] else None,
                "scale": row["scale"],
                "own": step.base is None,  # the claim's own row in the family, or another study's runs at its size
                "detail": row.get("detail", ""),
            },
        }
        out.append(entry)
        lacking = c.runs if st is None else lacking_runs(c.runs, st)
        if lacking or st is None:
            entry["scale"] = scale_of_config(root, spec.experiment, spec.size, c.run or c.reference)
            kept = sorted(d.parent.name for d in (root / "results" / folder / "runs").glob("*/done.json"))
            if st is None and kept:  # finished runs archived before the study is reported
                entry["kept"] = kept
                entry["detail"] += f"; finished runs kept in results/{folder}/runs/: {', '.join(kept)}"
            if st is not None:
                entry["status"], entry["lacking"] = "in part", lacking
                entry["detail"] = f"results/{folder}/ is published in part: no records of {', '.join(lacking)} yet"
            continue
        got = claim_values(c, st, c.domains or claims.domains)
        scale_run = c.run or c.reference
        entry.update(
            results=folder,
            status="measured",
            detail="",
            seeds=got["seeds"],
            values=got["values"],
            parts=got["parts"],
            test=_test(got["values"]),
            scale=scale_of_run(st.runs[next(k for k in got["used"] if k[0] == scale_run)]) if got["used"] else None,
            difference=welch(got["values"], row["values"]) if row["values"] else None,
        )
        entry["reading"] = reading(entry["test"], c.sign)
        base = studies.get(row["results"]) if row.get("results") and row["values"] else None
        if base is not None and base_claim is not None:
            domains = c.domains or claims.domains
            entry["levels"] = step_levels(base_claim, base, c, st, domains)
            entry["gap_model"] = gap_model(seed_gaps(base_claim, base, domains), seed_gaps(c, st, domains))
        entry["direction"] = directions(entry, claims.margin)
        if entry["difference"] and entry["scale"] and entry["base"]["scale"]:
            target = target or target_scale(root)
            entry["trend"] = trend(entry, row["values"], target)
    return out


# The size a step's trend is carried to: the paper's smallest (its 110M preset, architectures.toml at size 110m)
TARGET = ("architectures.toml", "110m", "transformer_pp")


def target_scale(root: Path) -> dict:
    return {"label": TARGET[1], **scale_of_config(root, *TARGET)}


def direction(diff: dict | None, margin: float) -> str:
    """How the gap moved from the smaller to the larger size, by the Welch 95% interval of (larger minus smaller):
    *grows* (above 0), *shrinks* (below 0), *holds* (inside +-margin), else *not determined*."""
    if not diff or not diff.get("ci95"):
        return "not determined"
    lo, hi = diff["ci95"]
    if lo > 0:
        return "grows"
    if hi < 0:
        return "shrinks"
    return "holds" if -margin <= lo and hi <= margin else "not determined"


def directions(entry: dict, margin: float) -> dict:
    """The direction at the step's band and at each of STEP_LEVELS, and whether they agree."""
    got = {"band": direction(entry.get("difference"), margin)}
    for lv in entry.get("levels") or []:
        got[lv["level"]] = direction(lv.get("difference"), margin)
    # a finding where every reading gives the same determined direction
    agree = len(set(got.values())) == 1 and "not determined" not in got.values() and len(got) == 1 + len(STEP_LEVELS)
    return {**got, "agree": agree}


def trend(entry: dict, base_values: list[float], target: dict) -> dict | None:
    """The gap's change per doubling of what the step grows (non-embedding parameters, else training tokens), with
    its Welch interval, and, for a size step, the gap carried on log-linearly to ``target``'s parameters along the
    step's own path (tokens growing with parameters as in the step): gap_L + k (gap_L - gap_S), k the target's
    doublings past the larger size over the step's doublings; its interval from the two sizes' seed variances
    (Welch-Satterthwaite degrees of freedom). Two points carried several doublings: a direction, not a number."""
    small, large = entry["base"]["scale"], entry["scale"]
    grows = "parameters" if large["params_non_embedding"] > 1.5 * small["params_non_embedding"] else "tokens"
    key = "params_non_embedding" if grows == "parameters" else "train_tokens"
    doublings = math.log2(large[key] / small[key])
    if doublings <= 0:  # neither grew (a stand-in with the same runs at both sizes): no trend to speak of
        return None
    d = entry["difference"]
    out: dict = {
        "grows": grows,
        "doublings": doublings,
        "per_doubling": {"mean": d["mean"] / doublings, "ci95": [x / doublings for x in d["ci95"]]},
        "prediction": None,
    }
    a, b = entry["values"], base_values
    if grows != "parameters" or len(a) < 2 or len(b) < 2:
        return out
    k = math.log2(target["params_non_embedding"] / large[key]) / doublings
    va, vb = stats.tvar(a) / len(a), stats.tvar(b) / len(b)
    mean = (1 + k) * (sum(a) / len(a)) - k * (sum(b) / len(b))
    var = (1 + k) ** 2 * va + k**2 * vb
    df = var**2 / (((1 + k) ** 2 * va) ** 2 / (len(a) - 1) + (k**2 * vb) ** 2 / (len(b) - 1))
    half = float(stats.t.ppf(0.975, df)) * math.sqrt(var)
    out["prediction"] = {
        "target": target,
        "k": k,
        "tokens_on_path": large["train_tokens"] * target["params_non_embedding"] / large["params_non_embedding"],
        "mean": mean,
        "ci95": [mean - half, mean + half],
        "df": df,
    }
    return out


def _base_row(root: Path, claims: Any, studies: dict, step: Any, row: dict) -> dict:
    """What a step with a ``base`` study is set against: the gap of its runs there (the fields of a claim's row that
    ``scale_steps`` reads), or, while the base study is not published with them, no values and why."""
    c, spec, folder = claims.step_claim(step, step.base), claims.studies[step.base], claims.results_dir(step.base)
    st = studies.get(folder)
    out: dict = {"id": row["id"], "paper": row["paper"], "study": step.base, "results": None, "seeds": [], "values": [], "test": None}
    if st is None or lacking_runs(c.runs, st):
        have = "not published yet" if st is None else f"published in part: no records of {', '.join(lacking_runs(c.runs, st))} yet"
        out["scale"] = scale_of_config(root, spec.experiment, spec.size, c.run or c.reference)
        out["detail"] = f"results/{folder}/ {have}"
        return out
    got = claim_values(c, st, c.domains or claims.domains)
    used = next((k for k in got["used"] if k[0] == (c.run or c.reference)), None)
    out.update(results=folder, seeds=got["seeds"], values=got["values"], test=_test(got["values"]) if got["values"] else None)
    out["scale"] = scale_of_run(st.runs[used]) if used else scale_of_config(root, spec.experiment, spec.size, c.run or c.reference)
    return out


def _at_level(claim: Claim, study: Study, level: str, domains: list[str]) -> dict | None:
    band = level_band(claim, study, level)
    if band is None:
        return None
    try:
        got = claim_values(claim, study, domains, band)
    except (ValueError, KeyError):  # a curve that does not reach the band
        return None
    return {"band": [round(band[0], 4), round(band[1], 4)], "values": got["values"], "test": _test(got["values"]) if got["values"] else None}


def step_levels(base_claim: Claim, base: Study, step_claim: Claim, step: Study, domains: list[str]) -> list[dict]:
    """The step's gap and its own size's at each of STEP_LEVELS, with the Welch difference (step minus own size)."""
    out = []
    for label, level in STEP_LEVELS:
        a, b = _at_level(step_claim, step, level, domains), _at_level(base_claim, base, level, domains)
        diff = welch(a["values"], b["values"]) if a and b else None
        out.append({"label": label, "level": level, "step": a, "base": b, "difference": diff})
    return out
