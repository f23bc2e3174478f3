"""Scores that are not losses: a claim whose statistic is a speed ratio or an accuracy (docs/metrics.md, "Scores that
are not losses"). Each has its own records, its own unit of replication and its own margin; its p values enter the
family like every claim's.

- ``speed_ratio``: the run's speed over the reference's, from a speed benchmark's JSON in the study's results folder
  (``speed.json`` by default, written by ``basecap bench longctx``: schema ``basecap.bench.longctx/1``, its module's
  docstring), tested on the log scale: the difference of the mean log times per step of the reference and of the run
  (positive = the run is faster), Welch's t-test over the repeats (each variant is timed in a process of its own, so
  the repeats are not pairs). A claim selects one row per side with its ``at`` table (e.g. kind, T, threads) and the
  benchmark's name of each run (``bench_names``, default the run's name); a row that is not ``ok`` says why there is
  no time, and a row without the times of its repeats (``step_s_all`` for training) cannot be tested.
- ``accuracy``: the run's score minus the reference's, in points (0-100), from the suite results in the study's
  archived run records (``eval_<suite>.json``; a claim's ``score`` names the keys, fractions in [0, 1], whose mean is
  the score). With two or more seeds of both: a paired t-test over seeds. With one seed: a difference of two
  proportions over the examples (Agresti & Caffo 2000: one success and one failure added to each, a normal test), when
  the result says how many examples a score is over (the retrieval suites' ``cells`` and ``samples``, or
  ``num_examples``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scipy import stats

from ..config_base import ConfigError
from .claims import Claim
from .robust import apply_plan
from .sequential import Plan
from .verdicts import claim_margin, claim_tests
from .rows import ClaimRow

SPEED_SCHEMA = "basecap.bench.longctx/1"
TIMES = {"train": "step_s_all", "decode": "decode_s_per_token_all"}  # each repeat's seconds, by the row's kind


def read_speed(path: Path) -> list[dict]:
    """The rows of a speed benchmark's JSON, checked: each names its variant and says whether it was measured."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConfigError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != SPEED_SCHEMA or not isinstance(data.get("rows"), list):
        raise ConfigError(f"{path}: schema: expected {{'schema': '{SPEED_SCHEMA}', 'rows': [...]}} (basecap bench longctx)")
    for i, r in enumerate(data["rows"]):
        if not isinstance(r, dict) or not isinstance(r.get("variant"), str) or not isinstance(r.get("status"), str):
            raise ConfigError(f"{path}: rows[{i}]: every row names its variant and status")
    return data["rows"]


def pick_row(rows: list[dict], variant: str, at: dict, where: str) -> dict | None:
    """The one row of ``variant`` at the coordinates ``at`` (None when there is none; two are an error)."""
    found = [r for r in rows if r["variant"] == variant and all(r.get(k) == v for k, v in at.items())]
    if len(found) > 1:
        raise ConfigError(f"{where}: {len(found)} rows of {variant} at {at}: add the coordinate that tells them apart to the claim's at")
    return found[0] if found else None


def speed_samples(rows: list[dict], claim: Claim, where: str) -> tuple[tuple[list[float], list[float]] | None, str]:
    """Each repeat's seconds of the run and of the reference, or None and why there is nothing to test."""
    assert claim.run is not None and claim.reference is not None  # a speed claim is a pair claim (Claim's validator)
    names = [claim.bench_names.get(n, n) for n in (claim.run, claim.reference)]
    picked = [pick_row(rows, n, claim.at, where) for n in names]
    missing = [n for n, r in zip(names, picked) if r is None]
    if missing:
        return None, f"{where} has no row of {', '.join(missing)} at {claim.at}"
    out = []
    for n, r in zip(names, picked):
        assert r is not None
        if r["status"] != "ok":
            return None, f"{where}: {n} {r['status'].replace('_', ' ')} ({r.get('reason')})"
        times = r.get(TIMES.get(str(r.get("kind")), ""))
        if not isinstance(times, list) or not all(isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in times):
            return None, f"{where}: the row of {n} has no time per repeat ({TIMES.get(str(r.get('kind')), 'kind?')})"
        out.append([float(x) for x in times])
    return (out[0], out[1]), ""


def summary_tests(claim: Claim, est: float, se: float, df: float | None, margin: float) -> dict:
    """The claim's two tests on an estimate with its standard error, Student t with ``df`` degrees of freedom (None:
    normal), with the same hypotheses as ``claim_tests`` (holds: the direction two-sided, or TOST within the margin;
    fails: the paper's effect ruled out, or a difference beyond the margin). With no spread the data decide exactly."""
    dist = stats.t(df) if df else stats.norm

    def above(bound: float) -> float:  # p of H0: delta <= bound
        if se == 0:
            return 0.0 if est > bound else 1.0
        return float(dist.sf((est - bound) / se))

    def below(bound: float) -> float:  # p of H0: delta >= bound
        if se == 0:
            return 0.0 if est < bound else 1.0
        return float(dist.cdf((est - bound) / se))

    s = claim.sign
    if s:
        p_holds = min(1.0, 2 * (above(0.0) if s > 0 else below(0.0)))
        p_fails = min(1.0, 2 * (below(margin) if s > 0 else above(-margin)))
    else:
        p_holds = max(above(-margin), below(margin))
        p_fails = min(1.0, 2 * min(above(margin), below(-margin)))
    half = float(dist.ppf(0.975)) * se
    return {
        "mean": est,
        "sd": None,
        "se": se,
        "df": df,
        "ci95": [est - half, est + half],
        "p": min(1.0, 2 * min(above(0.0), below(0.0))),
        "margin": margin,
        "p_holds": p_holds,
        "p_fails": p_fails,
        "p_equivalence": max(above(-margin), below(margin)),
    }


def welch_tests(claim: Claim, run_s: list[float], ref_s: list[float], margin: float) -> dict:
    """A speed claim's tests: the log speed ratio (mean log seconds of the reference minus the run's), Welch's t."""
    x, y = [-math.log(v) for v in run_s], [-math.log(v) for v in ref_s]
    n = len(x) + len(y)
    base = {"method": "welch", "units": "repeats", "n": n, "repeats": [len(x), len(y)], "margin": margin}
    if len(x) < 2 or len(y) < 2:
        return {**base, "n": min(len(x), len(y)), "mean": None, "sd": None, "ci95": None, "p": None, "p_holds": 1.0, "p_fails": 1.0}
    vx, vy = stats.tvar(x) / len(x), stats.tvar(y) / len(y)
    se = math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1)) if se > 0 else None
    est = math.fsum(x) / len(x) - math.fsum(y) / len(y)
    return {**summary_tests(claim, est, se, df, margin), **base}


def _lookup(result: dict, key: str, where: str) -> float:
    value: object = result
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ConfigError(f"{where}: no key {key!r}")
        value = value[part]
    if not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"{where}: {key} is {value!r}, not a fraction in [0, 1]")
    return float(value)


def _examples(result: dict, key: str) -> int | None:
    """How many examples the score at ``key`` is over, where the result says: a retrieval suite's cells at that
    length times its samples per cell, or its ``num_examples``."""
    parts = key.split(".")
    if parts[0] == "accuracy_by_length" and len(parts) == 2 and isinstance(result.get("cells"), list) and result.get("samples"):
        cells = [c for c in result["cells"] if str(c.get("length")) == parts[1]]
        return len(cells) * int(result["samples"]) if cells else None
    n = result.get("num_examples")
    return int(n) if isinstance(n, int) and n > 0 else None


def run_score(run_dir: Path, claim: Claim) -> tuple[float, int | None] | None:
    """The run's score (the mean of its sources, a fraction) and how many examples it is over (only for one
    source that says), or None when a suite result is missing."""
    from ..rundir import RunDir

    values, counts = [], []
    for src in claim.score:
        path = RunDir(run_dir).suite_result(src.suite, src.name)
        if not path.is_file():
            return None
        result = json.loads(path.read_text(encoding="utf-8"))
        values.append(_lookup(result, src.key, str(path)))
        counts.append(_examples(result, src.key))
    n = counts[0] if len(counts) == 1 else None
    return math.fsum(values) / len(values), n


def proportion_tests(claim: Claim, run: tuple[float, int], ref: tuple[float, int], margin: float) -> dict:
    """One seed's scores as a difference of two proportions over their examples, in points: Agresti-Caffo (one
    success and one failure added to each), normal tests (``summary_tests``)."""
    adj = [((round(p * n) + 1) / (n + 2), n + 2) for p, n in (run, ref)]
    est = 100 * (adj[0][0] - adj[1][0])
    se = 100 * math.sqrt(sum(p * (1 - p) / n for p, n in adj))
    return {
        **summary_tests(claim, est, se, None, margin),
        "method": "proportions",
        "units": "examples",
        "n": run[1] + ref[1],
        "examples": [run[1], ref[1]],
        "raw": [100 * run[0], 100 * ref[0]],
    }


def metric_row(row: ClaimRow, claim: Claim, claims: Any, studies: dict, root: Path, plan: Plan) -> None:
    """Fill a metric claim's row: its values and tests (``row["test"]``, p values read by ``plan`` where the units
    are seeds), or what it waits for (the row stays "not run")."""
    study = claims.studies[claim.study]
    folder = claims.results_dir(claim.study)
    margin = claim_margin(claim, claims.margin)
    row["unit"] = {"speed_ratio": "log speed ratio", "accuracy": "points"}[claim.metric]
    where = f"experiments/paper/{study.experiment} at size {study.size}"

    def waiting(what: str) -> str:
        return f"needs the paper's GPU scale: {claim.gpu}" if claim.gpu else f"{where} ({what} not published yet)"

    if claim.metric == "speed_ratio":
        path = root / "results" / folder / (claim.records or "speed.json")
        if not path.is_file():
            row["detail"] = waiting(f"results/{folder}/{path.name}")
            return
        samples, why = speed_samples(read_speed(path), claim, f"results/{folder}/{path.name}")
        if samples is None:
            row["detail"] = why
            return
        test = welch_tests(claim, samples[0], samples[1], margin)
        row.update({"results": folder, "seeds": [], "values": [], "seconds": {"run": samples[0], "reference": samples[1]}})
        # the repeats of a benchmark are not a study's seeds: no declared plan, but a file read after an earlier one
        # (looks_taken) counts that look, by Bonferroni
        plan = Plan(looks_taken=tuple(claim.looks_taken), unit="repeats")
    else:
        st = studies.get(folder)
        if st is None:
            row["detail"] = waiting(f"results/{folder}/")
            return
        assert claim.run is not None and claim.reference is not None  # a metric claim is a pair claim (Claim's validator)
        scores: dict[str, dict[int, tuple[float, int | None]]] = {}
        for name in (claim.run, claim.reference):
            for (n, seed), r in st.runs.items():
                if n == name and (claim.seeds is None or seed in claim.seeds):
                    got = run_score(r.dir, claim)
                    if got is not None:
                        scores.setdefault(name, {})[seed] = got
        run_s, ref_s = scores.get(claim.run, {}), scores.get(claim.reference, {})
        seeds = sorted(set(run_s) & set(ref_s))
        if not seeds:
            srcs = ", ".join(f"{s.suite}{'/' + s.name if s.name else ''}" for s in claim.score)
            row["detail"] = f"results/{folder}/ has no suite results {srcs} of both {claim.run} and {claim.reference} for one seed"
            return
        values = [100 * (run_s[s][0] - ref_s[s][0]) for s in seeds]
        counts = (run_s[seeds[0]][1], ref_s[seeds[0]][1])
        if len(seeds) == 1 and counts[0] and counts[1]:
            test = proportion_tests(claim, (run_s[seeds[0]][0], counts[0]), (ref_s[seeds[0]][0], counts[1]), margin)
            plan = Plan()
        else:
            test = claim_tests(claim, values, margin)
            test["units"] = "seeds"
        row.update({"results": folder, "seeds": seeds, "values": values})
    row["plan"] = plan
    row["test"] = apply_plan(test, plan)
    t = row["test"]
    t["p_holds_claim"], t["p_fails_claim"] = t["p_holds_plan"], t["p_fails_plan"]


def metric_key(claim: Claim) -> tuple:
    """What a metric claim compares: two claims with the same key test the same thing twice."""
    return (
        claim.metric,
        claim.study,
        claim.run,
        claim.reference,
        json.dumps(claim.at, sort_keys=True),
        tuple(s.model_dump_json() for s in claim.score),
    )
