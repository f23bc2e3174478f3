"""The optimiser, its rate schedule and one optimiser step, shared by every loop that trains a model in basecap:
the main training loop (``train.py``, its cooldown branches included), MQAR's from-scratch trainings
(``eval/recall.py``) and the CPU planner's measured rate (``plan/cpu.py``). One definition, so a change to clipping,
accumulation, the parameter groups or the schedule reaches all of them at once.

The step is the arithmetic only: the loop that calls it reads the rate from ``lr_at`` and passes it, owns the data
(it passes the micro-batches), the records and the checkpoints.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from typing import Callable, Iterable, Protocol, runtime_checkable

import torch

__all__ = [
    "OptimizerSettings",
    "ScheduleSettings",
    "WsdSettings",
    "cooldown_lr",
    "decay_factor",
    "lr_at",
    "make_optimizer",
    "optimizer_step",
]


class OptimizerSettings(Protocol):
    """What ``make_optimizer`` reads: the ``[train]`` section, or an MQAR training's settings."""

    @property
    def lr(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...

    @property
    def betas(self) -> tuple[float, float]: ...


def decay_factor(p: float, shape: str) -> float:
    """How much of the way from the floor to the starting rate is left at decay progress ``p`` in [0, 1]:
    1 at p = 0, 0 at p = 1 (linear, cosine, or 1-sqrt, the shape Haegele et al. 2024 found best for wsd)."""
    p = min(1.0, max(0.0, p))
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return 0.5 * (1 + math.cos(math.pi * p))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(p)
    raise ValueError(f"decay shape {shape!r}: allowed linear, cosine, 1-sqrt")


class ScheduleSettings(Protocol):
    """What ``lr_at`` reads: the ``[train]`` section, or an MQAR training's settings (cosine only)."""

    @property
    def lr(self) -> float: ...

    @property
    def steps(self) -> int: ...

    @property
    def warmup_steps(self) -> int: ...

    @property
    def min_lr_ratio(self) -> float: ...

    @property
    def schedule(self) -> str: ...


@runtime_checkable
class WsdSettings(ScheduleSettings, Protocol):
    """A schedule that can be ``wsd``: where its decay starts and the decay's shape (the ``[train]`` section)."""

    @property
    def decay_shape(self) -> str: ...

    def wsd_decay_start(self) -> int: ...


def lr_at(step: int, cfg: ScheduleSettings) -> float:
    """The learning rate of 0-based ``step``: linear warmup to ``lr``, then (``schedule="cosine"``) cosine
    decay to ``lr * min_lr_ratio``, or (``"wsd"``) ``lr`` held until the last ``decay_fraction`` of the
    steps and decayed to the floor over them in ``decay_shape``, the last step at the floor."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    floor = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "wsd":
        if not isinstance(cfg, WsdSettings):
            raise TypeError(f"schedule 'wsd' needs decay_shape and wsd_decay_start(); {type(cfg).__name__} has neither")
        start = cfg.wsd_decay_start()
        if step < start:
            return cfg.lr
        return cooldown_lr(step - start, cfg.steps - start, cfg.lr, floor, cfg.decay_shape)
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def cooldown_lr(k: int, length: int, start_lr: float, floor: float, shape: str) -> float:
    """Rate of the ``k``-th (0-based) of ``length`` decay steps from ``start_lr`` to ``floor``: the last one is
    at the floor. A wsd run's decay and a cooldown branch share it, so a branch forked where a wsd run starts
    its decay reproduces that run's end exactly."""
    return floor + (start_lr - floor) * decay_factor((k + 1) / length, shape)


def make_optimizer(model: torch.nn.Module, settings: OptimizerSettings) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters: weight decay on the matrices (two or more dimensions), none on
    biases, norms' gains and other vectors."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(settings.betas[0], settings.betas[1]), foreach=True)


def optimizer_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    micro: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    lr: float,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    grad_clip: float,
    sync: Callable[[bool], AbstractContextManager] | None = None,
    autocast: Callable[[], AbstractContextManager] | None = None,
    reduce: Callable[[float], float] | None = None,
    check: Callable[[float], None] | None = None,
) -> tuple[float, torch.Tensor]:
    """One optimiser step at rate ``lr`` over the micro-batches ``micro`` (gradient accumulation: each
    micro-batch's ``loss_fn(x, y)`` divided by their number), then clipping and AdamW. Returns the step's loss
    (the micro-batches' sum, through ``reduce``, e.g. the mean over ranks) and the gradient norm before clipping.

    ``sync(last)`` wraps a micro-batch's forward and backward (a data-parallel wrapper's gradient all-reduce on the
    last one only); ``autocast()`` wraps the forward (mixed precision); ``check(loss)`` runs before anything changes
    the weights (the main loop stops there on a non-finite loss). ``grad_clip`` 0 clips nothing but still measures
    the norm. The gradients are cleared after the step, so the next one starts from none.
    """
    for g in opt.param_groups:
        g["lr"] = lr
    batches = list(micro)
    loss_sum = 0.0
    for i, (x, y) in enumerate(batches):
        with sync(i == len(batches) - 1) if sync else nullcontext():
            with autocast() if autocast else nullcontext():
                loss = loss_fn(x, y) / len(batches)
            loss.backward()
        loss_sum += loss.item()
    if reduce is not None:
        loss_sum = reduce(loss_sum)
    if check is not None:
        check(loss_sum)
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    gnorm = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss_sum, gnorm
