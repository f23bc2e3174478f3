"""Parts of the recurrent mixers: the causal short convolution in front of the recurrence (H3,
Mamba, DeltaNet) with its decode cache, and the dt / A initialisers of the Mamba parameterisation
(Gu & Dao 2023; used by Mamba-1/2 and Gated DeltaNet)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...ops.short_conv import ShortConv
from ..base import State


def check_ranges(cfg, *pairs: tuple[str, str]):
    """A config check: for each (low, high) pair of field names, low must not exceed high. Returns cfg."""
    for low, high in pairs:
        if getattr(cfg, low) > getattr(cfg, high):
            raise ValueError(f"{low} ({getattr(cfg, low)}) must not exceed {high} ({getattr(cfg, high)})")
    return cfg


def keep_init(*params) -> None:
    """Mark parameters or modules a mixer initialised itself, so the backbone's N(0, std) init skips them."""
    for p in params:
        p._no_reinit = True


def conv_or_silu(conv: ShortConv | None, x: torch.Tensor, state: State | None) -> tuple[torch.Tensor, State]:
    """``conv(x)`` (causal short convolution + SiLU) continuing from ``state["conv"]``, or SiLU alone
    when the mixer has no convolution (the ablation). Returns the output and the convolution's part
    of the new decode state (``{}`` in training or without a convolution)."""
    if conv is None:
        return F.silu(x), {}
    y, cache = conv(x, None if state is None else state["conv"])
    return y, ({} if cache is None else {"conv": cache})


def conv_state(conv: ShortConv | None, batch: int, device, dtype) -> State:
    """The convolution's part of a fresh decode state (``{}`` without a convolution)."""
    return {} if conv is None else {"conv": conv.init_cache(batch, device, dtype)}


def conv_bytes(conv: ShortConv | None) -> int:
    return 0 if conv is None else conv.cache_bytes()


def init_dt_bias(n: int, dt_min: float, dt_max: float, floor: float | None = None) -> torch.Tensor:
    """Bias b with softplus(b) = dt, dt log-uniform in [dt_min, dt_max] (Mamba's dt init), optionally
    clamped below at ``floor``."""
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    if floor is not None:
        dt = dt.clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))  # inverse of softplus


def init_A_log(n: int, low: float, high: float) -> torch.Tensor:
    """log A with A uniform in [low, high] (one decay rate per head; Mamba-2)."""
    return torch.empty(n).uniform_(low, high).log()
