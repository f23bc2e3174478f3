"""The optimiser and one optimiser step, shared by every loop that trains a model in basecap: the main training
loop (``train.py``), MQAR's from-scratch trainings (``eval/recall.py``) and the CPU planner's measured rate
(``plan/cpu.py``). One definition, so a change to clipping, accumulation or the parameter groups reaches all of
them at once.

The step is the arithmetic only: the loop that calls it owns the schedule (it passes the rate), the data (it passes
the micro-batches), the records and the checkpoints.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable, Iterable, Protocol

import torch

__all__ = ["OptimizerSettings", "make_optimizer", "optimizer_step"]


class OptimizerSettings(Protocol):
    """What ``make_optimizer`` reads: the ``[train]`` section, or an MQAR training's settings."""

    @property
    def lr(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...

    @property
    def betas(self) -> tuple[float, float]: ...


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
