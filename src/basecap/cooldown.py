"""Cooldown branches: annealed points along one training run.

At each step ``s`` of ``train.cooldowns`` (and where ``train.cooldown_levels`` places one: ``level_forks``) the run forks a branch from its exact state (weights, optimizer,
data position): the branch continues the run's own data stream (the batch of step ``s + k`` is the run's)
while it decays the learning rate from the run's rate at ``s`` to the floor (``lr x min_lr_ratio``) over
``round(cooldown_fraction x s)`` steps, in ``train.decay_shape``. It is then evaluated like any evaluation and
recorded in ``metrics.jsonl`` as ``{"kind": "anneal", "step": s, "end_step": s + L, ...}``: an *annealed point*,
what the run would score had it been planned to stop there (Haegele et al. 2024; docs/metrics.md).

The main run is untouched: before a branch the run writes its checkpoint at ``s``, and after the branch it is
restored from it (checkpoints resume exactly), so its numbers are bit-identical with or without branches. A
branch writes its own checkpoints under ``cooldown/step_<s>/`` every ``train.checkpoint_every`` steps; a kill
during a branch resumes the run at ``s`` and the branch from its last checkpoint, and the branch folder is
removed once its point is recorded. With ``keep_cooldown_weights`` the branch's final weights stay in
``annealed/step_<s>/model.safetensors``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .checkpoint import latest_good_checkpoint, list_checkpoints, restore, save_checkpoint
from .records import ANNEAL, EVAL, AnnealRecord, LevelRecord, MetricsRecord, PointRecord
from .rundir import matched_loss

if TYPE_CHECKING:
    from .config import RunConfig, TrainConfig


def branch_root(run_path: Path, fork: int) -> Path:
    return run_path / "cooldown" / f"step_{fork:08d}"


def level_record(rec: PointRecord, domains: list[str]) -> LevelRecord:
    """What ``level_forks`` reads of an evaluation or annealed point: kind, step, in-domain loss, and the loss and
    token count of each domain of ``train.cooldown_level_domains``."""
    out: LevelRecord = {"kind": rec["kind"], "step": rec["step"], "in_domain_loss": rec["in_domain_loss"]}
    if domains:
        out["domains"] = {d: {"loss": rec["domains"][d]["loss"], "tokens": rec["domains"][d]["tokens"]} for d in domains if d in rec["domains"]}
    return out


def level_forks(train_cfg: TrainConfig, records: Sequence[LevelRecord] | Sequence[MetricsRecord]) -> dict[int, list[float]]:
    """The forks ``train.cooldown_levels`` places, from the run's records: fork step -> the levels it serves.

    Replayed in order of the main run's evaluations (so a resumed run decides as the uninterrupted one did): at an
    evaluation at step ``s`` before the last, the annealed loss a branch forked there would reach is predicted as the
    evaluation's loss less the drop of the run's latest branch forked before ``s`` at an evaluation step (its
    evaluation at the fork minus its annealed point). Every level not served yet that the prediction reaches is
    served by a fork at ``s``; before any branch has measured a drop, no level fork is placed. The loss is the
    in-domain loss, or that of ``train.cooldown_level_domains`` (a study matched on another coordinate, e.g. a
    mixed-domain run matched on prose)."""
    levels = sorted(train_cfg.cooldown_levels, reverse=True)
    if not levels:
        return {}
    on = train_cfg.cooldown_level_domains
    evals: dict[int, float] = {}
    anneals: list[tuple[int, float]] = []
    for r in records:
        if r["kind"] not in (EVAL, ANNEAL):
            continue
        x = matched_loss(r, on)
        if x is None:
            raise ValueError(f"train.cooldown_level_domains={on}: the {r['kind']} record of step {r['step']} has no loss on them")
        if r["kind"] == EVAL:
            evals[r["step"]] = x
        else:
            anneals.append((r["step"], x))
    anneals.sort()
    served: set[float] = set()
    out: dict[int, list[float]] = {}
    for s in sorted(evals):
        if s >= train_cfg.steps:
            break
        drops = [evals[f] - a for f, a in anneals if f < s and f in evals]
        if not drops:
            continue
        hit = [lv for lv in levels if lv not in served and evals[s] - drops[-1] <= lv]
        if hit:
            out[s] = hit
            served.update(hit)
    return out


def forks_at(train_cfg: TrainConfig, step: int, records: list[LevelRecord]) -> bool:
    """Whether the run forks a branch after ``step`` steps: a step of ``cooldowns``, or a level fork there."""
    return step in train_cfg.cooldowns or (bool(train_cfg.cooldown_levels) and step in level_forks(train_cfg, records))


def pending_fork(cfg: RunConfig, start: int, records: list[LevelRecord]) -> int | None:
    """The fork whose branch a run resuming at ``start`` still owes (its point not recorded yet), else None."""
    if not forks_at(cfg.train, start, records):
        return None
    done = {r["step"] for r in records if r["kind"] == ANNEAL}
    return None if start in done else start


def total_branch_steps(train_cfg: TrainConfig) -> int:
    """Optimizer steps every branch of a run adds together (``basecap plan`` counts them); a level fork is counted
    at its longest (a fork at the last step), since where it lands is known only once the run trains."""
    most = train_cfg.cooldown_steps(train_cfg.steps - 1)
    return sum(train_cfg.cooldown_steps(s) for s in train_cfg.cooldowns) + most * len(train_cfg.cooldown_levels)


def run_branch(
    run: Any,
    fork: int,
    step_fn: Callable[..., Any],
    evaluate_fn: Callable[..., PointRecord],
    lr_fn: Callable[[int, int, float, float], float],
    log: Callable[[str], Any],
) -> AnnealRecord:
    """Train, evaluate and record the branch forked after ``fork`` steps, then put the run back at ``fork``.
    ``step_fn(run, step, lr)`` is the trainer's optimizer step, ``evaluate_fn(run, step, kind, extra)`` its
    evaluation, ``lr_fn(k, length, start_lr, floor)`` the decay. Returns the recorded point."""
    tc, rd = run.cfg.train, run.rd
    length = tc.cooldown_steps(fork)
    main = next((c for c in reversed(list_checkpoints(rd.checkpoints)) if c.name == f"step_{fork:08d}"), None)
    if main is None:
        raise RuntimeError(f"[{run.cfg.run_id}] cooldown at step {fork}: the run's checkpoint at that step is missing")
    root = branch_root(rd.path, fork)
    begin = 0
    ckpt = latest_good_checkpoint(root, log=lambda *_: None)
    if ckpt is not None:
        begin = restore(ckpt, run.model, run.opt)["step"] - fork
        log(f"[{run.cfg.run_id}] cooldown branch at step {fork}: resuming at its step {begin} of {length}")
    start_lr = run.lr_at(fork)
    floor = tc.lr * tc.min_lr_ratio
    for k in range(begin, length):
        step_fn(run, fork + k, lr_fn(k, length, start_lr, floor))
        if (k + 1) % tc.checkpoint_every == 0 and k + 1 < length:
            save_checkpoint(root, fork + k + 1, run.model, run.opt, {"cooldown_of": fork}, keep=1, env=run.env)
    extra = {
        "end_step": fork + length,
        "cooldown_steps": length,
        "start_lr": start_lr,
        "end_lr": lr_fn(length - 1, length, start_lr, floor),
        "tokens": (fork + length) * run.tokens_per_step,
    }
    levels = level_forks(tc, run.history).get(fork)
    if levels:
        extra["levels"] = levels  # placed by train.cooldown_levels
    rec = cast(AnnealRecord, evaluate_fn(run, fork, ANNEAL, extra))
    if tc.keep_cooldown_weights:  # the checkpoint writer's full weights (tied embeddings and FSDP shards handled there)
        final = Path(save_checkpoint(root, fork + length, run.model, run.opt, {"cooldown_of": fork}, keep=1, env=run.env))
        if run.env.is_main:
            out = rd.path / "annealed" / f"step_{fork:08d}"
            out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(final / "model.safetensors", out / "model.safetensors")
    rd.sync_metrics()
    restore(main, run.model, run.opt)  # the main run continues from its own state at the fork
    if run.env.is_main:
        shutil.rmtree(root, ignore_errors=True)
    log(f"[{run.cfg.run_id}] annealed point at step {fork} (+{length} cooldown steps): in-domain loss {rec['in_domain_loss']:.4f}")
    return rec
