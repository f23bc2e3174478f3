"""The training loop: one loop for every architecture (no mixer-specific branches).

AdamW with warmup + cosine decay, gradient clipping and accumulation, fp32 on CPU and bf16 autocast
on CUDA; evaluation of every domain every K steps into ``metrics.jsonl``; atomic checkpoints that
resume exactly (the batch of step s is a pure function of (seed, s), and optimizer + RNG state are
restored), so a killed run continues with the same loss sequence it would have had.

Every step records tokens/s and MFU: model FLOP/s (3 x the forward FLOPs per token x tokens/s) over the
peak FLOP/s of the devices: ``train.peak_flops``, else the data sheet (CUDA) or a careful matmul measurement
stored once per machine and thread count (``basecap.peak``, docs/performance.md). A step above the peak records
``mfu_above_peak`` instead of ``mfu``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Literal, cast

import torch

from .checkpoint import latest_good_checkpoint, restore, save_checkpoint
from .compile import compile_for_training
from .config import RunConfig
from .cooldown import forks_at, level_record, pending_fork, run_branch
from .config_base import ConfigError
from .distributed import DistEnv, grad_sync, init_distributed, mean_across_ranks, wrap
from .eval.ood import DomainEvaluator, in_domain_loss
from .model import build_model
from .optim import cooldown_lr, lr_at, make_optimizer, optimizer_step
from .records import EVAL, TRAIN, AnnealRecord, LevelRecord, MetricsRecord, PointRecord, TrainRecord, eval_at, points, trains
from .peak import mfu_fields, mfu_text, peak_flops
from .reuse import check_same_run
from .rundir import RunDir, environment_info
from .tracking import Tracker, check_loggers, open_loggers


class TrainingDiverged(RuntimeError):
    pass


def resolve_device(cfg: RunConfig, local_rank: int = 0) -> tuple[torch.device, torch.dtype | None]:
    want = cfg.train.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' requested but no CUDA device is available; allowed here: cpu, auto")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dtype = cfg.train.dtype
    if dtype == "auto":
        dtype = "bf16" if dev.type == "cuda" else "fp32"
    return dev, (torch.bfloat16 if dtype == "bf16" else None)


def mfu(tokens_per_s: float, train_flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak FLOP/s (of every device together)."""
    return tokens_per_s * train_flops_per_token / peak_flops


@dataclass
class _Run:
    """Everything the loop touches, built once by ``_setup``."""

    cfg: RunConfig
    rd: RunDir
    env: DistEnv
    device: torch.device
    autocast: Callable | None
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    batches: Any  # data.TrainBatches
    evaluator: DomainEvaluator
    start: int
    log: Callable
    tracker: Tracker
    train_flops_per_token: float  # 3 x the forward FLOPs: backward is two matmuls per forward one
    peak_flops: float  # of all ranks together
    bar: Any = None  # tqdm progress bar on rank 0
    wall: dict = field(default_factory=dict)  # run.json's "wall": the sessions whose work the records keep
    t0: float = field(default_factory=time.perf_counter)  # this session's start
    curve_evaluator: DomainEvaluator | None = None  # eval.curve_max_tokens: the main run's evaluations before its end
    history: list[LevelRecord] = field(default_factory=list)  # evaluations and annealed points so far (cooldown.level_record): where level forks go

    def lr_at(self, step: int) -> float:
        return lr_at(step, self.cfg.train)

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.train.batch_size * self.cfg.data.seq_len


def train(cfg: RunConfig, run_dir, corpus=None, log=print, stop_at: int | None = None) -> PointRecord | dict[str, Any]:
    """Train one run into ``run_dir`` (resuming from its last good checkpoint) and return the final evaluation
    record ({} when ``stop_at`` left it before any evaluation). A finished run is not trained again. ``cfg`` is a
    resolved run config. ``stop_at``: leave after that many steps (and a branch forked there), unfinished:
    ``basecap.replay`` rebuilds a run's state so."""
    check_loggers(cfg.train.loggers)  # a missing optional package fails before any compute
    device, amp_dtype = resolve_device(cfg, int(os.environ.get("LOCAL_RANK", "0")))
    env = init_distributed(device.type, cfg.train.dist_timeout_s)
    with RunDir(run_dir).lock(env):  # one process (one torchrun job) per run directory, for the whole run
        return _train(cfg, RunDir(run_dir), env, device, amp_dtype, corpus, log=log, stop_at=stop_at)


def _train(cfg: RunConfig, rd: RunDir, env: DistEnv, device, amp_dtype, corpus, *, log, stop_at: int | None = None) -> PointRecord | dict[str, Any]:
    if env.active and cfg.train.batch_size % (env.world_size * cfg.train.grad_accum):
        raise ConfigError(
            f"train.batch_size={cfg.train.batch_size} must be divisible by world_size x grad_accum = {env.world_size} x {cfg.train.grad_accum}"
        )
    if not env.is_main:
        log = lambda *_: None  # noqa: E731 - only rank 0 talks and writes
    check_same_run(cfg, rd)
    finished = rd.read_done()
    if finished is not None and finished.get("steps") == cfg.train.steps:
        log(f"[{cfg.run_id}] already finished ({cfg.train.steps} steps); skipping")
        final: PointRecord | None = rd.final_eval()  # the whole record: done.json keeps only its scalar fields (metrics.jsonl holds the rest)
        assert final is not None  # done.json was read above
        return final

    t0 = time.perf_counter()
    run = _setup(cfg, rd, env, device, amp_dtype, corpus, log=log)
    run.t0 = t0  # the session's wall clock counts its setup (corpus, model, restore) too
    final = None
    forks, levels = set(cfg.train.cooldowns), bool(cfg.train.cooldown_levels)
    with run.tracker:  # closed as failed if the loop raises
        owed = pending_fork(cfg, run.start, run.history)  # every rank holds it: all of them train the branch
        if owed is not None:  # killed during the branch forked here: finish it before the run goes on
            _branch(run, owed)
        t_last = time.perf_counter()
        for step in range(run.start, stop_at or cfg.train.steps):
            loss, lr, gnorm = _step(run, step)
            now = time.perf_counter()
            _record_step(run, step + 1, loss, lr, gnorm, run.tokens_per_step / max(now - t_last, 1e-9))
            t_last = now
            done = step + 1
            if done % cfg.eval.every == 0 or done == cfg.train.steps:
                final = _evaluate(run, done)
                t_last = time.perf_counter()  # tokens/s counts training steps, not evaluations or checkpoints
            fork = done in forks or (levels and done % cfg.eval.every == 0 and forks_at(cfg.train, done, run.history))
            if done % cfg.train.checkpoint_every == 0 or done == cfg.train.steps or fork:
                rd.sync_metrics()  # on disk before the checkpoint that covers them
                save_checkpoint(rd.checkpoints, done, run.model, run.opt, {}, keep=cfg.train.keep_checkpoints, env=env)
                run.tracker.flush()
                _record_wall(run, done)
                t_last = time.perf_counter()
            if fork:
                _branch(run, done)
                t_last = time.perf_counter()
        if stop_at is not None and stop_at < cfg.train.steps:
            return final or {}
        return _finish(run, final)


def _branch(run: _Run, fork: int) -> AnnealRecord:
    """The cooldown branch forked after ``fork`` steps (``cooldown.run_branch``); the run is back at ``fork`` after it."""
    return run_branch(
        run,
        fork,
        lambda r, step, lr: _step(r, step, lr),
        _evaluate,
        lambda k, n, start, floor: cooldown_lr(k, n, start, floor, run.cfg.train.decay_shape),
        run.log,
    )


def _setup(cfg: RunConfig, rd: RunDir, env: DistEnv, device, amp_dtype, corpus, *, log) -> _Run:
    """Data, model, optimizer and the resume point; writes run.json."""
    from .data import build_corpus, load_recipe
    from .data.loader import check_domains

    corpus = corpus or build_corpus(load_recipe(cfg.data.recipe), log=log)
    check_domains({"train.cooldown_level_domains": cfg.train.cooldown_level_domains}, cfg.data.eval_domains or corpus.domains, source="evaluation")
    if env.is_main:
        rd.create()
    batches, evaluator = _data(cfg, env, corpus)
    curve_tokens = cfg.eval.curve_max_tokens
    curve_evaluator = _evaluator(cfg, corpus, curve_tokens) if curve_tokens is not None and curve_tokens != cfg.eval.max_tokens else None
    if cfg.train.threads and device.type == "cpu":
        torch.set_num_threads(cfg.train.threads)
    autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype) if amp_dtype else None
    peak = _peak(cfg, device, amp_dtype)

    torch.manual_seed(cfg.train_seed)
    core = compile_for_training(build_model(cfg.model, corpus.vocab_size).to(device), cfg, log)
    info = _run_info(cfg, core, corpus, env, device) | {"peak_flops": peak}
    model = wrap(core, cfg.train.parallel, env, device)
    opt = make_optimizer(model, cfg.train)
    start = _resume(cfg, rd, model, opt, log)
    wall = _kept_wall(rd, start)
    if env.is_main:
        rd.truncate_metrics(start)
        rd.write_info(info | {"wall": wall})
    kept = [r for r in rd.read_metrics() if r["step"] <= start]  # every rank: what truncation keeps
    tracker = _open_tracker(cfg, rd, env, info, kept)
    if start == 0:
        counts = info["params"]
        log(
            f"[{cfg.run_id}] {cfg.model.mixer.name}: {counts['total'] / 1e6:.2f}M params "
            f"({counts['non_embedding'] / 1e6:.2f}M non-embedding), {info['flops_per_token'] / 1e6:.1f} MFLOPs/token fwd, device {device}"
        )
    run = _Run(
        cfg,
        rd,
        env,
        device,
        autocast,
        model,
        opt,
        batches,
        evaluator,
        start,
        log,
        tracker,
        train_flops_per_token=3 * info["flops_per_token"],
        peak_flops=peak["per_device"] * env.world_size,
        wall=wall,
        curve_evaluator=curve_evaluator,
        history=[level_record(r, cfg.train.cooldown_level_domains) for r in points(kept)],
    )
    if cfg.train.progress and env.is_main:
        from tqdm import tqdm

        run.bar = tqdm(total=cfg.train.steps, initial=start, desc=cfg.run_id, unit="step", mininterval=1.0, dynamic_ncols=True, file=sys.stderr)
    model.train()
    return run


def _data(cfg: RunConfig, env: DistEnv, corpus) -> tuple[Any, DomainEvaluator]:
    """This rank's training batches (``data.TrainBatches``) and the evaluator of the evaluation domains."""
    from .data import TrainBatches

    # the batch of a step does not depend on grad_accum (a memory knob): micro-batches are slices of it
    batches = TrainBatches(
        corpus,
        weights=cfg.data.train_weights,
        seq_len=cfg.data.seq_len,
        batch_size=cfg.train.batch_size // env.world_size,
        seed=cfg.train_seed,
        rank=env.rank,
        world_size=env.world_size,
        retrieval=cfg.data.retrieval,
    )
    return batches, _evaluator(cfg, corpus, cfg.eval.max_tokens)


def _evaluator(cfg: RunConfig, corpus, max_tokens: int) -> DomainEvaluator:
    """The evaluator of the evaluation domains on ``max_tokens`` tokens of each."""
    return DomainEvaluator(
        corpus,
        cfg.data.eval_domains or corpus.domains,
        cfg.eval.split,
        cfg.data.seq_len,
        cfg.eval.batch_size,
        max_tokens,
        train_weights=cfg.data.train_weights,
        seen_min_count=cfg.eval.seen_min_count,
    )


def _resume(cfg: RunConfig, rd: RunDir, model, opt, log) -> int:
    """The step the run starts from: that of its last good checkpoint, restored into ``model`` and ``opt``, else 0."""
    ckpt = latest_good_checkpoint(rd.checkpoints, log=log)
    if ckpt is None:
        return 0
    start = restore(ckpt, model, opt)["step"]
    log(f"[{cfg.run_id}] resuming from {ckpt.name} (step {start})")
    return start


def _open_tracker(cfg: RunConfig, rd: RunDir, env: DistEnv, info: dict, kept: list[MetricsRecord]) -> Tracker:
    """The run's loggers (rank 0 only) with run.json's ``info`` as their config."""
    # the trackers fill what they lack up to the checkpoint from metrics.jsonl, and skip what they hold
    return open_loggers(
        cfg.train.loggers,
        rd.path,
        project=rd.path.resolve().parent.name,
        name=cfg.run_id,
        group=cfg.name,
        config=info,
        history=kept if env.is_main else (),
        enabled=env.is_main,
    )


def _peak(cfg: RunConfig, device, amp_dtype) -> dict:
    """The peak FLOP/s of one device (MFU's denominator) and where it comes from: ``train.peak_flops``, else
    the data sheet (CUDA) or the stored measurement of this machine at this thread count (``basecap.peak``)."""
    if cfg.train.peak_flops is not None:
        return {"per_device": cfg.train.peak_flops, "source": "train.peak_flops"}
    return peak_flops(device, amp_dtype or torch.float32)


def _run_info(cfg: RunConfig, model, corpus, env: DistEnv, device) -> dict:
    """What run.json records: the resolved config, sizes and provenance."""
    seq_len = cfg.data.seq_len
    return {
        "run_id": cfg.run_id,
        "config": json.loads(cfg.model_dump_json()),
        "vocab_size": corpus.vocab_size,
        "corpus": {"dir": corpus.dir.name, "tokenizer": corpus.tokenizer_path.name},
        "params": model.param_counts(),
        "flops_per_token": model.flops_per_token(seq_len),
        "state_bytes": model.state_size(seq_len),
        "world_size": env.world_size,
        "parallel": cfg.train.parallel if env.active else None,
        **environment_info(device),
    }


def _step(run: _Run, step: int, lr: float | None = None) -> tuple[float, float, torch.Tensor]:
    """One optimizer step (0-based ``step``) on the batch of that step (``optim.optimizer_step``: micro-batches with
    gradient accumulation, clipping, AdamW) at ``lr`` (default: the schedule's). Returns (loss, learning rate,
    gradient norm); stops the run on a non-finite loss before the weights change."""
    tc = run.cfg.train
    lr = lr_at(step, tc) if lr is None else lr
    xb, yb = run.batches.batch(step)
    dev = run.device

    def loss_fn(x, y):
        return _loss(run.model, x.to(dev, non_blocking=True), y.to(dev, non_blocking=True))

    def check(loss: float) -> None:
        if math.isfinite(loss):
            return
        if run.bar:
            run.bar.close()
        good = latest_good_checkpoint(run.rd.checkpoints, log=lambda *_: None)
        raise TrainingDiverged(
            f"[{run.cfg.run_id}] loss is {loss} at step {step + 1}; stopped. Saved checkpoints are intact (latest: {good.name if good else 'none'})."
        )

    loss, gnorm = optimizer_step(
        run.model,
        run.opt,
        zip(xb.chunk(tc.grad_accum), yb.chunk(tc.grad_accum)),
        lr=lr,
        loss_fn=loss_fn,
        grad_clip=tc.grad_clip,
        sync=lambda last: grad_sync(run.model, tc.parallel, run.env, sync=last),
        autocast=run.autocast,
        reduce=lambda v: mean_across_ranks(v, run.env),
        check=check,
    )
    return loss, lr, gnorm


def _loss(model, x, y):
    """Mean cross-entropy through the (possibly DDP/FSDP-wrapped) model's forward, so wrappers see the call;
    the model's head computes it without materialising the logits (``model.head_impl``)."""
    loss, _ = model(x, targets=y)
    return loss


def _record_step(run: _Run, done: int, loss: float, lr: float, gnorm, tokens_per_s: float):
    """The step's metrics record (rank 0 writes it) and the progress bar or log line."""
    util = mfu(tokens_per_s, run.train_flops_per_token, run.peak_flops)
    rec = cast(
        TrainRecord,
        {"kind": TRAIN, "step": done, "loss": loss, "lr": lr, "grad_norm": float(gnorm), "tokens_per_s": tokens_per_s, **mfu_fields(util)},
    )
    if run.env.is_main:
        run.rd.append_metrics(rec)
        run.tracker.log(rec)
    if run.bar:
        run.bar.update(1)
        run.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:.0f}", mfu=mfu_text(util), refresh=False)
    elif done % run.cfg.train.log_every == 0:
        run.log(f"[{run.cfg.run_id}] step {done}/{run.cfg.train.steps} loss {loss:.4f} lr {lr:.2e} {tokens_per_s:.0f} tok/s MFU {mfu_text(util, 1)}")


def _evaluate(run: _Run, step: int, kind: Literal["eval", "anneal"] = EVAL, extra: dict | None = None) -> PointRecord:
    """Loss and bits per byte of every evaluation domain (and per training-frequency stratum of the target),
    appended to metrics.jsonl; ``kind="anneal"`` for a cooldown branch's point (``extra``: its fields)."""
    evaluator = run.evaluator
    if kind == EVAL and step < run.cfg.train.steps and run.curve_evaluator is not None:
        evaluator = run.curve_evaluator  # eval.curve_max_tokens: a main-run evaluation before the last step
    res = evaluator.evaluate(run.model, run.device, run.autocast)  # every rank (FSDP needs all of them); rank 0 writes
    rec = cast(
        PointRecord,
        {
            "kind": kind,
            "step": step,
            "tokens": step * run.tokens_per_step,
            "split": run.cfg.eval.split,
            "in_domain_loss": in_domain_loss(res, run.cfg.data.train_weights),
            **(extra or {}),
            "domains": res,
        },
    )
    if run.env.is_main:
        run.rd.append_metrics(rec)
        run.tracker.log(rec)
    run.history.append(level_record(rec, run.cfg.train.cooldown_level_domains))  # every rank: each decides the same forks
    return rec


def _finish(run: _Run, final: PointRecord | None) -> PointRecord:
    """Close the progress bar, evaluate if the run resumed exactly at its end, write done.json."""
    if run.bar:
        run.bar.close()
    if final is None:  # resumed exactly at the end: its final evaluation was recorded before that checkpoint
        steps = run.cfg.train.steps
        final = eval_at(run.rd.read_metrics(), steps) or _evaluate(run, steps)
    if run.env.is_main:
        _record_wall(run, run.cfg.train.steps)
        _record_speed(run)
        run.rd.write_done(run.cfg.train.steps, final)
    return final


def _kept_wall(rd: RunDir, start: int) -> dict:
    """The earlier sessions of a resumed run, up to the checkpoint it resumes from (work after it is done again
    and counted again), from the run.json it is about to replace."""
    try:
        old = (rd.read_info().get("wall") or {}) if start > 0 else {}
    except (FileNotFoundError, ValueError):
        old = {}
    sessions = [dict(x, to_step=min(x["to_step"], start)) for x in old.get("sessions", []) if x["from_step"] < start]
    return {"seconds": sum(x["seconds"] for x in sessions), "sessions": sessions}


def _record_wall(run: _Run, step: int):
    """run.json's "wall": wall-clock seconds of each training session (a process that trained the run: setup, steps,
    evaluations, cooldown branches and checkpoints) up to its last checkpoint, and their sum: the time the kept
    records cost. A session killed after its last checkpoint loses what it did after it; that part is not counted."""
    if not run.env.is_main:
        return
    now = {"from_step": run.start, "to_step": step, "seconds": round(time.perf_counter() - run.t0, 3)}
    sessions = [x for x in run.wall.get("sessions", []) if x["from_step"] < run.start] + [now]
    run.wall = {"seconds": round(sum(x["seconds"] for x in sessions), 3), "sessions": sessions}
    info = run.rd.read_info()
    info["wall"] = run.wall
    run.rd.write_info(info)


def _record_speed(run: _Run):
    """run.json's "speed": medians over the run's training steps (every step of metrics.jsonl, resumed
    parts included; the first step, which warms up, is left out when there are others)."""
    steps = trains(run.rd.read_metrics())
    steps = steps[1:] if len(steps) > 1 else steps
    if not steps:
        return
    info = run.rd.read_info()
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in steps)
    info["speed"] = {"steps": len(steps), "tokens_per_s": tokens_per_s, **mfu_fields(mfu(tokens_per_s, run.train_flops_per_token, run.peak_flops))}
    run.rd.write_info(info)
