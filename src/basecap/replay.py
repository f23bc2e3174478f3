"""Annealed points added to a finished run afterwards (``basecap anneal RUN_DIR --at STEP`` or ``--level LOSS``).

A cooldown branch needs the run's exact state at its fork, and a finished run keeps only its last checkpoints. But
training is a pure function of the resolved config (same data order, same initialisation, same kernels on the same
machine), and branches leave the main run bit-identical (``basecap.cooldown``). So the state at step ``s`` is
rebuilt by training the run's own config again from step 0 to ``s`` in a scratch folder, where the branch forks as
it would have in the first place. Before the point is added, every training and evaluation record of the replay is
compared with the run's own records up to ``s``, bit for bit (timings aside): a replay that differs (another
machine, other kernels, a changed trainer) adds nothing and says where it differs. The run's ``run.json`` then
lists ``s`` among its ``train.cooldowns``, as if it had been trained with it, and ``replayed_forks`` says which
points were added this way, at which commit, checked against how many records.

``--level`` adds the forks ``train.cooldown_levels`` would have placed (``cooldown.level_forks``), decided from the
run's records as the run decides them while training, one replay per new fork (a fork's own point is among the records
that decide the next); a level served at a step the run already forked at marks that point. ``run.json`` then lists the
levels in ``train.cooldown_levels``, as if the run had been trained with them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .atomic import atomic_write
from .config_base import ConfigError
from .records import EVAL, TRAIN, AnnealRecord, MetricsRecord, annealed_steps, anneals, evals
from .rundir import RunDir, git_state

TIMINGS = ("tokens_per_s", "mfu")


def _main_records(records: list[MetricsRecord], upto: int) -> list[dict]:
    """The main run's records up to ``upto`` (no annealed points), without the timings (a replay is not timed alike)."""
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records if r["kind"] in (TRAIN, EVAL) and r["step"] <= upto]


def _finished(run_dir: str | Path) -> tuple[RunDir, dict]:
    rd = RunDir(run_dir)
    if rd.read_done() is None:
        raise ConfigError(f"{rd.path}: not a finished run (no done.json); a run still training forks its branches itself")
    if not rd.metrics_path.is_file():
        raise ConfigError(f"{rd.path}: its records are archived (metrics.jsonl.zst); add points to the run folder, not to results/")
    return rd, rd.read_info()


def _replay(rd: RunDir, info: dict, steps: list[int], corpus, log, flag: str) -> tuple[list[AnnealRecord], int]:
    """Replay the run to the last of ``steps`` with branches forked at each, check it against the run's records and
    insert the points into them; returns (the points, the number of records checked)."""
    from .config import validate_run
    from .train import train

    records = rd.read_metrics()
    done = [s for s in steps if s in annealed_steps(records)]
    if done:
        raise ConfigError(f"{rd.path}: already has an annealed point forked at step {done[0]}")
    # the run's config forking only at ``steps``: validated as any config (each fork inside the run, with a step of decay)
    train_over = {"cooldowns": steps, "cooldown_levels": [], "cooldown_level_domains": [], "loggers": ["jsonl"], "progress": False}
    replay = validate_run({**info["config"], "train": {**info["config"]["train"], **train_over}}, prefix=flag)
    last = steps[-1]
    scratch = rd.path / "cooldown" / f"replay_{last:08d}"
    shutil.rmtree(scratch, ignore_errors=True)
    log(f"[{replay.run_id}] replaying steps 0-{last} to fork cooldown branches at {', '.join(map(str, steps))}")
    train(replay, scratch, corpus=corpus, log=log, stop_at=last)
    got = RunDir(scratch).read_metrics()
    want, have = _main_records(records, last), _main_records(got, last)
    if have != want:
        first = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
        where = want[first] if first < len(want) else have[first]
        raise RuntimeError(
            f"{rd.path}: the replay differs from the run's records at its {where['kind']} record of step {where['step']} "
            f"({len(have)} replayed, {len(want)} recorded): the run cannot be rebuilt exactly here, so no point was added "
            f"(the scratch folder {scratch} is kept for a look)"
        )
    points = anneals(got)
    merged: list[MetricsRecord] = list(records)
    for point in points:  # each where a branch trained in the run would stand: after the run's records of its fork step
        at = max(i for i, r in enumerate(merged) if r["step"] <= point["step"]) + 1
        merged.insert(at, point)
    atomic_write(rd.metrics_path, "".join(json.dumps(r) + "\n" for r in merged))
    shutil.rmtree(scratch, ignore_errors=True)
    for point in points:
        log(f"[{replay.run_id}] annealed point at step {point['step']} added: in-domain loss {point['in_domain_loss']:.4f}")
    log(f"[{replay.run_id}] the replay equals the run's {len(want)} records up to step {last}")
    return points, len(want)


def add_forks(run_dir: str | Path, steps: list[int], corpus=None, log=print) -> list[AnnealRecord]:
    """Add the annealed points of branches forked after each of ``steps`` to the finished run in ``run_dir`` (one
    replay, to the last of them); returns the points."""
    from .config import validate_run

    rd, info = _finished(run_dir)
    cfg = validate_run(info["config"])
    steps = sorted(set(steps))
    points, checked = _replay(rd, info, steps, corpus, log, "--at")
    commit, dirty = git_state()
    info["config"]["train"]["cooldowns"] = sorted({*cfg.train.cooldowns, *steps})
    info.setdefault("replayed_forks", []).append({"steps": steps, "commit": commit, "dirty": dirty, "checked_records": checked})
    rd.write_info(info)
    return points


def add_level_forks(run_dir: str | Path, levels: list[float], corpus=None, log=print, domains: list[str] | None = None) -> list[AnnealRecord]:
    """Add the forks ``train.cooldown_levels`` would have placed for ``levels`` to the finished run in ``run_dir``;
    returns the points added (a level served at a step the run already forked at adds none). ``domains``: the
    levels are losses on these domains (``train.cooldown_level_domains``), not the in-domain loss."""
    from .config import validate_run
    from .config_base import ConfigError
    from .cooldown import level_forks

    rd, info = _finished(run_dir)
    cfg = validate_run(info["config"])
    on = list(domains or [])
    if cfg.train.cooldown_levels and on != cfg.train.cooldown_level_domains:
        raise ConfigError(
            f"{rd.path}: its levels {cfg.train.cooldown_levels} are on {cfg.train.cooldown_level_domains or 'the in-domain loss'}; "
            f"levels on {on or 'the in-domain loss'} cannot be added beside them (one coordinate per run)"
        )
    known = {d for r in evals(rd.read_metrics()) for d in r["domains"]}
    off = [d for d in on if d not in known]
    if off:
        raise ConfigError(f"{rd.path}: --level-on {off}: the run's evaluations have no such domain; they have {sorted(known)}")
    levels = sorted({*cfg.train.cooldown_levels, *levels}, reverse=True)
    train_over = {**info["config"]["train"], "cooldown_levels": levels, "cooldown_level_domains": on}
    tc = validate_run({**info["config"], "train": train_over}, prefix="--level").train
    added: list[AnnealRecord] = []
    checks: list[int] = []
    while True:  # one fork at a time: its point may change where the next level is placed, as it would in training
        records = rd.read_metrics()
        placed = level_forks(tc, records)
        forked = annealed_steps(records)
        new = sorted(s for s in placed if s not in forked)
        if not new:
            break
        points, checked = _replay(rd, info, new[:1], corpus, log, "--level")
        added += points
        checks.append(checked)
    marks = [r for r in anneals(records) if r.get("levels") != placed.get(r["step"], r.get("levels"))]
    for r in marks:
        r["levels"] = placed[r["step"]]  # as the branch records it when the run places it itself
    if marks:
        atomic_write(rd.metrics_path, "".join(json.dumps(r) + "\n" for r in records))
    if not placed:
        log(f"[{cfg.run_id}] no evaluation of the run reaches the levels {levels} by the rule of train.cooldown_levels; nothing added")
    for s, lv in sorted(placed.items()):
        log(
            f"[{cfg.run_id}] level {', '.join(map(str, lv))} served by the fork at step {s}"
            + ("" if s in {p["step"] for p in added} else " (forked already)")
        )
    commit, dirty = git_state()
    info["config"]["train"]["cooldown_levels"] = levels
    if on:
        info["config"]["train"]["cooldown_level_domains"] = on
    entry = {
        "levels": levels,
        **({"level_domains": on} if on else {}),
        "steps": sorted(p["step"] for p in added),
        "commit": commit,
        "dirty": dirty,
        "checked_records": checks,
    }
    info.setdefault("replayed_forks", []).append(entry)
    rd.write_info(info)
    return added
