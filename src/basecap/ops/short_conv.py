"""Depthwise causal short convolution (as in H3, Mamba, DeltaNet), with a decode state."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ShortConv(nn.Module):
    """Depthwise causal conv over time on ``[B, T, C]``, optional SiLU.

    Decode state is the last ``kernel_size - 1`` inputs ``[B, K-1, C]``; ``forward`` returns the
    new one (never mutating the old), so chunked prefill and token-by-token decode agree.
    """

    def __init__(self, channels: int, kernel_size: int = 4, activation: bool = True):
        super().__init__()
        self.channels, self.kernel_size, self.activation = channels, kernel_size, activation
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.weight._no_reinit = True
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, C = x.shape
        pad = cache if cache is not None else x.new_zeros(B, self.kernel_size - 1, C)
        xp = torch.cat([pad, x], dim=1)  # [B, K-1+T, C]
        y = F.conv1d(xp.transpose(1, 2), self.weight, groups=C).transpose(1, 2)
        if self.activation:
            y = F.silu(y)
        new_cache = xp[:, -(self.kernel_size - 1):] if cache is not None and self.kernel_size > 1 else (xp[:, :0] if cache is not None else None)
        return y, new_cache

    def init_cache(self, batch: int, device="cpu", dtype=torch.float32) -> torch.Tensor:
        return torch.zeros(batch, self.kernel_size - 1, self.channels, device=device, dtype=dtype)

    def cache_bytes(self) -> int:
        return (self.kernel_size - 1) * self.channels * 4
