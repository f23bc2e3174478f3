"""The q/k/v/o projection block of multi-head attention and its head layout."""

from __future__ import annotations

import torch
from torch import nn


def n_heads_for(d_model: int, head_dim: int, n_heads: int | None = None) -> int:
    """``n_heads`` if given, else as many heads of ``head_dim`` as fit in ``d_model`` (at least one)."""
    return n_heads or max(1, d_model // head_dim)


def qkvo_projections(d_model: int, n_heads: int, head_dim: int) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]:
    """Bias-free q, k, v (d_model -> H * D) and o (H * D -> d_model) projections, created in that order."""
    inner = n_heads * head_dim
    return (
        nn.Linear(d_model, inner, bias=False),
        nn.Linear(d_model, inner, bias=False),
        nn.Linear(d_model, inner, bias=False),
        nn.Linear(inner, d_model, bias=False),
    )


def split_heads(x: torch.Tensor, projections, n_heads: int, head_dim: int) -> list[torch.Tensor]:
    """Each projection of ``x [B, T, d_model]`` as heads ``[B, H, T, D]`` (a view, no copy)."""
    B, T, _ = x.shape
    return [p(x).view(B, T, n_heads, head_dim).transpose(1, 2) for p in projections]


def merge_heads(o: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, D] -> [B, T, H * D]``."""
    B, H, T, D = o.shape
    return o.transpose(1, 2).reshape(B, T, H * D)


def empty_kv(batch: int, n_heads: int, head_dim: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """An empty KV cache, ``k, v [B, H, 0, D]``."""
    empty = torch.zeros(batch, n_heads, 0, head_dim, device=device, dtype=dtype)
    return empty, empty.clone()
