"""A growable KV cache for decoding: appending one token does not copy the cache."""

from __future__ import annotations

import torch

from .common import Tensor


def append_time(cache: Tensor, new: Tensor) -> Tensor:
    """``cat([cache, new], dim=2)`` without copying the cache when possible.

    The result is a view of a buffer with spare room. The first caller to extend a given length
    writes in place past its end (no existing state sees those slots); a second caller extending
    the same old state (branching) gets a fresh copy, so no returned state is ever altered. With
    autograd recording, a plain ``cat``."""
    n, m = cache.shape[2], new.shape[2]
    if torch.is_grad_enabled() and (cache.requires_grad or new.requires_grad):
        return torch.cat([cache, new], dim=2)
    base = cache._base
    if (
        base is not None
        and getattr(base, "_top1_filled", -1) == n
        and base.shape[2] >= n + m
        and base.dtype == new.dtype
        and base[:, :, :n].stride() == cache.stride()
        and base.data_ptr() == cache.data_ptr()
    ):
        base[:, :, n : n + m] = new
        base._top1_filled = n + m  # type: ignore[attr-defined]  # a mark on the buffer tensor: how much of it is filled
        return base[:, :, : n + m]
    B, H, _, D = new.shape
    base = new.new_empty(B, H, max(64, 2 * (n + m)), D)
    base[:, :, :n] = cache
    base[:, :, n : n + m] = new
    base._top1_filled = n + m  # type: ignore[attr-defined]  # a mark on the buffer tensor: how much of it is filled
    return base[:, :, : n + m]
