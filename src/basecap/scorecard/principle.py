"""The paper's principle as a claim (``experiments/paper/principle.toml``; docs/metrics.md, "The principle").

Full-sequence arbitrary selection keeps base capability, in a testable form: across architectures, selection ability
(MQAR accuracy on the file's protocol, ``results/principle/mqar.json``, written by ``basecap principle mqar``) predicts
the OOD gap (each point's primary gap against its study's reference). The statistic is Spearman's rank correlation of
the points' mean accuracy and mean gap; its interval a percentile bootstrap over points, then within each drawn point
over its LM seeds (the gap) and its MQAR seeds (the accuracy). It enters the scorecard's family as one more claim:
holds when rho < 0 is shown (the share of resampled rho >= 0 at the family's adjusted level), fails when a correlation
of the margin (-0.5) or stronger is ruled out (twice the share of resampled rho <= -0.5: the two-sided interval at that
level lies above it).
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ValidationError, model_validator
from scipy import stats

from ..config_base import ConfigError, Strict, format_validation_error
from .claims import Arm, Claim, ClaimsFile, experiment_path
from .compute import claim_values, lacking_runs
from .robust import pair_band
from .verdicts import FAILS, HOLDS, UNDECIDED
from .rows import ClaimRow

PRINCIPLE_FILE = Path("experiments/paper/principle.toml")
MQAR_FILE = Path("results/principle/mqar.json")
FIGURE = Path("results/principle_mqar_vs_gap.png")
MIN_POINTS = 5  # fewer points than this: the claim is not run

# the rest of the protocol, as architectures.toml's mqar suite and train_mqar's defaults have it: the curve is read at
# every pair count up to twice the scored one
CURVE_KV_PAIRS = (1, 2, 4, 8, 16)
BATCH_SIZE, VOCAB_SIZE, NUM_TEST, POWER_A, WEIGHT_DECAY = 32, 128, 256, 0.01, 0.1
FIXED = {"batch_size": BATCH_SIZE, "vocab_size": VOCAB_SIZE, "num_test": NUM_TEST, "power_a": POWER_A, "weight_decay": WEIGHT_DECAY}


class MqarProtocol(Strict):
    d_model: int
    n_layers: int
    seq_len: int
    train_kv_pairs: list[int]
    score_kv_pairs: int
    steps: int
    lr: float
    seeds: list[int]


class Bootstrap(Strict):
    resamples: int
    seed: int


class Point(Strict):
    label: str
    study: str  # a [studies.*] entry of the claims file
    run: str
    reference: str


class Principle(Strict):
    id: str
    paper: str
    mqar: MqarProtocol
    expect: Literal["negative"]
    statistic: Literal["spearman"]
    margin: float  # the correlation a 'fails' rules out (or stronger)
    bootstrap: Bootstrap
    points: list[Point]

    @model_validator(mode="after")
    def _check(self) -> Principle:
        if not -1 < self.margin < 0:
            raise ValueError(f"margin: a negative correlation in (-1, 0), got {self.margin}")
        labels = [p.label for p in self.points]
        if len(set(labels)) != len(labels):
            raise ValueError("points: each label once")
        if self.bootstrap.resamples < 100:
            raise ValueError("bootstrap.resamples: at least 100")
        return self


class Prediction(Strict):
    architecture: str
    paper: str
    predicts: Literal["keeps", "degrades"]
    why: str


class PrincipleFile(Strict):
    principle: Principle
    predictions: list[Prediction] = []


def protocol(spec: Principle) -> dict:
    """Everything that decides a point's MQAR accuracy but its mixer and seed (stored in mqar.json and checked when read)."""
    return {**spec.mqar.model_dump(), "test_kv_pairs": list(CURVE_KV_PAIRS), **FIXED}


def load_principle(path: str | Path, claims: ClaimsFile, root: str | Path = ".") -> PrincipleFile:
    """principle.toml, validated: its keys, and each point's study (a claims-file study) and runs (its experiment file's)."""
    from ..config import load_experiment

    path = Path(path)
    try:
        spec = PrincipleFile.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, f"{path}: ")) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    names: dict[str, list[str]] = {}
    for i, p in enumerate(spec.principle.points):
        where = f"{path}: principle.points[{i}] ({p.label})"
        if p.study not in claims.studies:
            raise ConfigError(f"{where}: unknown study {p.study!r}; studies: {', '.join(claims.studies)}")
        if p.study not in names:
            st = claims.studies[p.study]
            names[p.study] = [r["name"] for r in load_experiment(experiment_path(Path(root), st), [f"size={st.size}"]).runs]
        bad = [r for r in (p.run, p.reference) if r not in names[p.study]]
        if bad:
            raise ConfigError(f"{where}: {', '.join(map(repr, bad))} is not a run of {claims.studies[p.study].experiment}")
    return spec


# ---- Spearman's rho and the bootstrap ----------------------------------------------------------------------------


def average_ranks(xs: list[float]) -> list[float]:
    """Ranks 1..n, ties sharing the mean of their ranks (the plain reference)."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks; None when a coordinate has one value only."""
    rx, ry = average_ranks(xs), average_ranks(ys)
    mx, my = math.fsum(rx) / len(rx), math.fsum(ry) / len(ry)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = math.fsum((a - mx) ** 2 for a in rx), math.fsum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row pair of ``x``, ``y`` [B, k]; nan where a row has one value only."""
    rx, ry = stats.rankdata(x, axis=1), stats.rankdata(y, axis=1)
    rx, ry = rx - rx.mean(1, keepdims=True), ry - ry.mean(1, keepdims=True)
    sxx, syy = (rx * rx).sum(1), (ry * ry).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((sxx > 0) & (syy > 0), (rx * ry).sum(1) / np.sqrt(sxx * syy), np.nan)


DIGITS = 12  # means are compared to 12 decimals: a resampled mean equal in exact arithmetic ties whatever the order of its sum


def _round(v: Any) -> Any:
    return np.round(v, DIGITS)


def draws(k: int, n_gap: int, n_acc: int, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bootstrap's random numbers, in a fixed order from one generator (numpy's default, ``seed``): the drawn
    points [B, k], then uniforms for each drawn point's LM seeds [B, k, n_gap] and MQAR seeds [B, k, n_acc] (the
    j-th drawn point with n seeds takes seeds floor(u * n) of its first n uniforms)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, k, size=(resamples, k)), rng.random((resamples, k, n_gap)), rng.random((resamples, k, n_acc))


def bootstrap_plain(points: list[tuple[list[float], list[float]]], resamples: int, seed: int) -> list[float | None]:
    """Resampled rho, one loop per draw (the reference): ``points`` are (gaps over LM seeds, accuracies over MQAR seeds)."""
    P, U, V = draws(len(points), max(len(g) for g, _ in points), max(len(a) for _, a in points), resamples, seed)
    out: list[float | None] = []
    for b in range(resamples):
        xs, ys = [], []
        for j in range(len(points)):
            gaps, accs = points[int(P[b, j])]
            ys.append(float(_round(math.fsum(gaps[int(u * len(gaps))] for u in U[b, j, : len(gaps)]) / len(gaps))))
            xs.append(float(_round(math.fsum(accs[int(v * len(accs))] for v in V[b, j, : len(accs)]) / len(accs))))
        out.append(spearman(xs, ys))
    return out


def _resampled_means(values: list[list[float]], P: np.ndarray, U: np.ndarray) -> np.ndarray:
    n = np.array([len(v) for v in values])
    table = np.zeros((len(values), U.shape[2]))
    for i, v in enumerate(values):
        table[i, : len(v)] = v
    N = n[P]  # [B, k] seeds of each drawn point
    idx = np.floor(U * N[..., None]).astype(int)  # [B, k, n_max]
    used = np.arange(U.shape[2]) < N[..., None]
    picked = table[P[..., None], np.minimum(idx, U.shape[2] - 1)]
    return _round((picked * used).sum(2) / N)


def bootstrap(points: list[tuple[list[float], list[float]]], resamples: int, seed: int) -> np.ndarray:
    """The same resampled rho as ``bootstrap_plain`` (the same draws), vectorised; nan where rho is undefined."""
    P, U, V = draws(len(points), max(len(g) for g, _ in points), max(len(a) for _, a in points), resamples, seed)
    y = _resampled_means([g for g, _ in points], P, U)
    x = _resampled_means([a for _, a in points], P, V)
    return spearman_rows(x, y)


def tests(rho: float | None, resampled: np.ndarray, margin: float) -> dict:
    """The claim's two p values from the resampled rho (an undefined rho, all of a resample's points tied on a
    coordinate, counts as 0: no ordering), its 95% percentile interval, and the resamples kept for its verdict's
    interval."""
    r = np.where(np.isnan(resampled), 0.0, resampled)
    return {
        "method": "bootstrap",
        "statistic": "spearman",
        "mean": rho,
        "ci95": [float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))],
        "margin": margin,
        "p_holds": float((r >= 0).mean()),
        "p_fails": min(1.0, 2 * float((r <= margin).mean())),
        "resamples": len(r),
        "undefined": int(np.isnan(resampled).sum()),
        "_resampled": r,
    }


def decide_principle(row: ClaimRow, alpha: float, m: int) -> None:
    """The principle's verdict from its adjusted p values, and the interval its deciding test corresponds to: the
    percentile interval at 1 - 2a for 'holds' (its upper bound is the one-sided test's), 1 - a for 'fails'."""
    t = row["test"]
    holds, fails = t["p_holds_holm"] <= alpha, t["p_fails_holm"] <= alpha
    used = "holds" if holds or not fails else "fails"
    a = alpha / t["divisor_" + used] if holds or fails else alpha / m
    level = 1 - 2 * a if used == "holds" else 1 - a
    r = t["_resampled"]
    t["ci_corrected"] = [float(np.quantile(r, (1 - level) / 2)), float(np.quantile(r, (1 + level) / 2))]
    t["ci_corrected_level"], t["ci_corrected_for"] = level, used
    t["lean"] = None if not t["mean"] else "negative" if t["mean"] < 0 else "positive"
    if holds:
        row["verdict"], row["detail"] = HOLDS, ""
    elif fails:
        row["verdict"], row["detail"] = FAILS, f"a correlation of {t['margin']:g} or stronger is ruled out"
    else:
        row["verdict"] = UNDECIDED
        row["detail"] = f"leans {t['lean']}" if t["lean"] else ""


# ---- the points --------------------------------------------------------------------------------------------------


def arm_a(point: Point, claims: ClaimsFile) -> Arm | None:
    """The point's arm A (the architecture at Transformer++'s rate), from the claim that compares its run with its
    reference in its study, or None when no claim gives it one."""
    for c in claims.claims:
        if c.study is None or c.untestable is not None or c.metric != "ood_gap":
            continue
        a = claims.answering(c)
        if (a.study, a.run, a.reference) == (point.study, point.run, point.reference):
            return next((arm for arm in c.arms if arm.label.startswith("A")), None)
    return None


def gaps_of(study: str, run: str, reference: str, claims: ClaimsFile, studies: dict) -> tuple[list[float] | None, list[int], str]:
    """Per LM seed, the primary gap of ``run`` against ``reference`` in ``study`` (mean over the claims file's
    domains), or None and why not."""
    if run == reference:  # the anchor: its gap is 0 by definition
        return [0.0], [], ""
    folder = claims.results_dir(study)
    st = studies.get(folder)
    if st is None:
        return None, [], f"results/{folder}/ not published yet"
    lacking = lacking_runs([run, reference], st)
    if lacking:
        return None, [], f"results/{folder}/ has no records of {', '.join(lacking)} yet"
    c = Claim(id="principle_point", section="principle", paper="-", study=study, expect="no_effect", run=run, reference=reference)
    moved = pair_band(c, st)  # a pair that does not reach the study's band is read at its rule band, as a claim is
    band = (float(moved["band"][0]), float(moved["band"][1])) if moved and moved["band"] else None
    got = claim_values(c, st, claims.domains, band)
    if not got["values"]:
        return None, [], f"{run} vs {reference}: no seed with a gap"
    return got["values"], got["seeds"], (f"read at {band[0]:.2f}-{band[1]:.2f} (rule band)" if band else "")


def read_mqar(path: Path, spec: Principle) -> dict[str, dict]:
    """mqar.json's points (by label), checked against the declared protocol."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    want = protocol(spec)
    if data.get("protocol") != want:
        raise ConfigError(f"{path}: protocol: measured with {data.get('protocol')}, principle.toml declares {want}")
    return data.get("points", {})


def _summary(values: list[float]) -> dict:
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return {"n": n, "mean": mean, "ci95": None}
    sd = float(np.std(values, ddof=1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "ci95": [mean - half, mean + half]}


def principle_points(spec: Principle, claims: ClaimsFile, studies: dict, mqar: dict) -> list[dict]:
    """Each point's gaps (tuned and arm A), MQAR accuracies at the scored pair count, and what it lacks."""
    out = []
    for p in spec.points:
        gaps, seeds, why = gaps_of(p.study, p.run, p.reference, claims, studies)
        arm = arm_a(p, claims)
        if arm is None:
            arm_gaps, arm_why = gaps, why
        else:
            arm_gaps, _, arm_why = gaps_of(arm.study, arm.run, arm.reference, claims, studies)
        measured = mqar.get(p.label, {}).get("seeds", {})
        accs = [measured[str(s)]["acc_at_score"] for s in spec.mqar.seeds if str(s) in measured]
        missing = [why] if gaps is None else []
        if len(accs) < len(spec.mqar.seeds):
            missing.append(f"MQAR measured at {len(accs)} of {len(spec.mqar.seeds)} seeds")
        out.append(
            {
                "label": p.label,
                "study": p.study,
                "run": p.run,
                "reference": p.reference,
                "gap": {**_summary(gaps), "seeds": seeds, "values": gaps, **({"note": why} if why else {})} if gaps else None,
                "arm_a": {"label": arm.label if arm else "none: the tuned gap", "values": arm_gaps, **(_summary(arm_gaps) if arm_gaps else {})}
                if arm_gaps
                else {"label": arm.label if arm else None, "missing": arm_why},
                "mqar": {**_summary(accs), "values": accs} if accs else None,
                "missing": "; ".join(missing),
            }
        )
    return out


def reading(points: list[tuple[list[float], list[float]]], spec: Principle) -> dict | None:
    """rho of the points' means and its bootstrap tests; None with fewer than MIN_POINTS points."""
    if len(points) < MIN_POINTS:
        return None
    xs = [float(_round(math.fsum(a) / len(a))) for _, a in points]
    ys = [float(_round(math.fsum(g) / len(g))) for g, _ in points]
    rho = spearman(xs, ys)
    resampled = bootstrap(points, spec.bootstrap.resamples, spec.bootstrap.seed)
    return {"n": len(points), **tests(rho, resampled, spec.margin)}


def principle_row(spec: PrincipleFile, claims: ClaimsFile, studies: dict, root: Path) -> tuple[ClaimRow, dict]:
    """The principle's row in the family (a claim with its own decider) and the section that shows its points."""
    pr = spec.principle
    mqar = read_mqar(root / MQAR_FILE, pr)
    pts = principle_points(pr, claims, studies, mqar)
    ready = [p for p in pts if not p["missing"]]
    row: ClaimRow = {
        "id": pr.id,
        "section": "1, 5",
        "paper": pr.paper,
        "study": "principle",
        "expect": "negative",
        "direction": None,
        "run": None,
        "reference": None,
        "runs": [p["label"] for p in pts],
        "domains": claims.domains,
        "measure": "primary",
        "family": True,
        "gpu_family": False,
        "metric": "spearman",
        "margin": pr.margin,
        "analogue_of": None,
        "kind": "principle",
        "test": None,
        "verdict": "not run",
        "detail": "",
        "scale": None,
        "results": None,
        "seeds": [],
        "values": [],
        "reused": [],
        "before": None,
        "pending": None,
    }
    tuned = reading([(p["gap"]["values"], p["mqar"]["values"]) for p in ready], pr)
    arm_ready = [p for p in ready if p["arm_a"].get("values")]
    arm = reading([(p["arm_a"]["values"], p["mqar"]["values"]) for p in arm_ready], pr)
    missing = [f"{p['label']} ({p['missing']})" for p in pts if p["missing"]]
    if tuned is None:
        row["detail"] = (
            f"{len(ready)} of {len(pts)} points have their gap and MQAR (at least {MIN_POINTS} needed; \"The principle\" lists what each lacks)"
        )
    else:
        tuned.update(p_holds_plan=tuned["p_holds"], p_fails_plan=tuned["p_fails"], p_holds_claim=tuned["p_holds"], p_fails_claim=tuned["p_fails"])
        row.update({"test": tuned, "decider": decide_principle})
    section = {
        "id": pr.id,
        "protocol": pr.mqar.model_dump(),
        "bootstrap": pr.bootstrap.model_dump(),
        "margin": pr.margin,
        "points": pts,
        "measured": len(ready),
        "missing": missing,
        "arm_a": {k: v for k, v in arm.items() if not k.startswith("_")} if arm else None,
        "arm_a_points": len(arm_ready),
    }
    return row, section
