"""Tune, then compare (docs/experiments.md).

Every run of a tune experiment is first trained at each swept value of the tuned keys on the tuning
seeds. Its value is chosen on one number only: the final in-domain loss on the validation split, averaged
over the tuning seeds (lowest wins; a diverged run never wins; a tie goes to the value listed first). The
OOD domains are the study's test set: choosing on them would leak the answer into the comparison, so
the chooser never reads them. The choice is written to ``<out_dir>/tuning.json``; the comparison seeds
then run at the chosen values, under the plain run names.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .atomic import write_json
from .config import ExperimentConfig, RunConfig
from .config_base import ConfigError
from .rundir import RunDir

TUNING_FILE = "tuning.json"
SPLIT = "validation"


def validation_loss(record: Mapping[str, Any], run_id: str) -> float:
    """What a value is chosen on: a tuning run's final in-domain loss on the validation split. Only
    ``split`` and ``in_domain_loss`` of the evaluation record are read, never its per-domain (OOD) losses."""
    if record.get("split") != SPLIT:
        raise ConfigError(f"{run_id}: its final evaluation is on the {record.get('split')!r} split; a value is chosen on {SPLIT} only")
    return float(record["in_domain_loss"])


def choose(means: list[float | None]) -> int:
    """Index of the lowest mean loss; a missing or non-finite one (a diverged run) never wins; ties go to
    the first in grid order."""

    def rank(i):
        m = means[i]
        return (m if m is not None and math.isfinite(m) else math.inf, i)

    best = min(range(len(means)), key=rank)
    if rank(best)[0] == math.inf:
        raise ConfigError("tune: every value tried diverged (no finite in-domain loss); widen the grid")
    return best


def read_tuning(path: Path) -> dict:
    """A stored tuning.json, or {} when it is missing or unreadable (then it is computed again)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _fingerprint(exp: ExperimentConfig, points: list[tuple[dict, str]], by_name: dict[str, list[RunConfig]]) -> dict:
    """What a stored choice depends on: the protocol and every tuning run's resolved config (a changed grid,
    seed list or training setting recomputes it)."""
    assert exp.tune is not None  # a tune experiment
    configs = {rc.run_id: hashlib.sha256(rc.model_dump_json().encode()).hexdigest()[:16] for _, name in points for rc in by_name[name]}
    return {"keys": exp.tune.keys, "seeds": exp.tune.seeds, "metric": exp.tune.metric, "split": SPLIT, "configs": configs}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _entry(points: list[tuple[dict, str]], by_name: dict[str, list[RunConfig]], losses: dict[str, float], fingerprint: dict) -> dict:
    """One run's tuning record: every value tried with its loss per tuning seed and their mean, and the choice."""
    tried: list[dict[str, Any]] = []
    for values, name in points:
        per_seed = {str(rc.seed): losses[rc.run_id] for rc in by_name[name]}
        mean = sum(per_seed.values()) / len(per_seed)
        tried.append({"name": name, "values": values, "losses": {s: _finite(v) for s, v in per_seed.items()}, "mean": _finite(mean)})
    best = tried[choose([t["mean"] for t in tried])]
    return {"grid": fingerprint, "tried": tried, "chosen": best["values"], "chosen_name": best["name"]}


def tune(
    exp: ExperimentConfig,
    runs: list[RunConfig],
    out: Path,
    train_fn: Callable[[RunConfig, Path], Mapping[str, Any]],
    only: list[str] | None = None,
    log=print,
    *,
    write: bool = True,
) -> dict[str, dict[str, Any]]:
    """The tuning phase: comparison run name -> chosen values, for every run (or those in ``only``).

    ``runs`` are the resolved tuning runs; ``train_fn(rc, run_dir)`` trains one and returns its final
    evaluation record (a finished run returns it at once). A run whose stored choice in tuning.json was made
    on the same grid keeps it without training; the others are trained and chosen again, and tuning.json is
    rewritten atomically (``write``: False on the non-main ranks of a distributed job)."""
    assert exp.tune is not None  # a tune experiment
    every = exp.tuning_grid()
    grid = {n: pts for n, pts in every.items() if not only or n in only}
    by_name: dict[str, list[RunConfig]] = {}
    for rc in runs:
        by_name.setdefault(rc.name, []).append(rc)
    path = out / TUNING_FILE
    entries = {n: e for n, e in read_tuning(path).get("runs", {}).items() if n in every}
    prints = {n: _fingerprint(exp, pts, by_name) for n, pts in grid.items()}
    todo = [n for n in grid if entries.get(n, {}).get("grid") != prints[n]]
    if todo:
        wanted = {name for n in todo for _, name in grid[n]}
        log(
            f"== tuning {', '.join(exp.tune.keys)} of {', '.join(todo)} on seeds {exp.tune.seeds} "
            f"({sum(len(by_name[w]) for w in wanted)} runs; chosen on in-domain {SPLIT} loss)"
        )
        losses = {rc.run_id: validation_loss(train_fn(rc, out / rc.run_id), rc.run_id) for rc in runs if rc.name in wanted}
        for n in todo:
            entries[n] = _entry(grid[n], by_name, losses, prints[n])
            log(f"[{n}] chosen: {_values_text(entries[n]['chosen'])} (mean in-domain {SPLIT} loss {_loss_text(entries[n])})")
        if write:  # read again first: another process sharing the study (basecap run/train --run) may have written its choices meanwhile
            entries.update({n: e for n, e in read_tuning(path).get("runs", {}).items() if n in every and n not in todo})
            out.mkdir(parents=True, exist_ok=True)
            write_json(path, {"metric": exp.tune.metric, "split": SPLIT, "keys": exp.tune.keys, "seeds": exp.tune.seeds, "runs": entries})
    return {n: entries[n]["chosen"] for n in grid}


def _values_text(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _loss_text(entry: dict) -> str:
    return "; ".join(
        f"{_values_text(t['values'])}: {t['mean']:.4f}" if t["mean"] is not None else f"{_values_text(t['values'])}: diverged" for t in entry["tried"]
    )


def _get(config: Any, key: str):
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def check_trained_at_choice(out: Path, runs: list[RunConfig], keys: list[str]):
    """A comparison run already trained at another value than the one now chosen (the grid changed) would
    be skipped as finished: refuse, naming its folder, before anything trains."""
    for rc in runs:
        rd = RunDir(out / rc.run_id)
        if not rd.exists():
            continue
        stored, now = rd.read_info()["config"], json.loads(rc.model_dump_json())
        differ = [k for k in keys if _get(stored, k) != _get(now, k)]
        if differ:
            raise ConfigError(
                f"{rd.path}: trained with " + ", ".join(f"{k}={_get(stored, k)}" for k in differ) + " but the tuning "
                "now chooses "
                + ", ".join(f"{k}={_get(now, k)}" for k in differ)
                + f" ({out / TUNING_FILE}); remove that folder to train it at the chosen value"
            )
