"""Rotary position embedding (Su et al. 2021, "RoFormer"), rotate-half convention."""

from __future__ import annotations

import torch


def rope_tables(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    ang = positions.float()[:, None] * inv[None, :]  # [T, D/2]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, H, T, D]; rotate-half convention
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


def rope_qk(q: torch.Tensor, k: torch.Tensor, offset: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[B, H, T, D]`` rotated for the positions ``offset .. offset + T - 1``."""
    cos, sin = rope_tables(torch.arange(offset, offset + q.shape[2], device=q.device), q.shape[-1], theta)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)
