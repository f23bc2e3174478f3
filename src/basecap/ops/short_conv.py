"""Depthwise causal short convolution (as in H3, Mamba, DeltaNet), with a decode state.

On CPU the convolution runs as K shifted multiply-adds in the ``[B, T, C]`` layout with a hand-written
backward (``_ShiftConv``): ``F.conv1d`` needs the channels-first layout (two transposed copies) and its
depthwise backward is slow on CPU; the shifted form took the convolution + SiLU of a Mamba-2 layer at the
quickstart's shape from about 55 to 26 ms (forward + backward, one thread; LOG.md). Elsewhere (CUDA)
``F.conv1d``. Both forms compute the same sums, in a different order (tests/test_short_conv.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _ShiftConv(torch.autograd.Function):
    """``y[:, t] = sum_j xp[:, t + j] * w[:, j]``: ``xp [B, K-1+T, C]`` is the input after its K-1 earlier steps."""

    @staticmethod
    def forward(ctx, xp: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        K = w.shape[1]
        T = xp.shape[1] - (K - 1)
        y = xp[:, K - 1 :] * w[:, K - 1]
        for j in range(K - 1):
            y.addcmul_(xp[:, j : j + T], w[:, j])
        ctx.save_for_backward(xp, w)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        xp, w = ctx.saved_tensors
        K, T = w.shape[1], dy.shape[1]
        dxp = torch.zeros_like(xp)
        dw = torch.empty_like(w)
        for j in range(K):
            dxp[:, j : j + T].addcmul_(dy, w[:, j])
            dw[:, j] = (dy * xp[:, j : j + T]).sum((0, 1))
        return dxp, dw


def causal_depthwise_conv(xp: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise causal convolution with ``weight [C, 1, K]`` of ``xp [B, K-1+T, C]`` (the input after the K-1
    earlier steps it continues from); returns the T outputs ``[B, T, C]``."""
    if xp.device.type == "cpu":
        return _ShiftConv.apply(xp, weight[:, 0])
    return F.conv1d(xp.transpose(1, 2), weight, groups=xp.shape[2]).transpose(1, 2)


class ShortConv(nn.Module):
    """Depthwise causal conv over time on ``[B, T, C]``, optional SiLU.

    Decode state is the last ``kernel_size - 1`` inputs ``[B, K-1, C]``; ``forward`` returns the
    new one (never mutating the old), so chunked prefill and token-by-token decode agree.
    """

    def __init__(self, channels: int, kernel_size: int = 4, activation: bool = True):
        super().__init__()
        self.channels, self.kernel_size, self.activation = channels, kernel_size, activation
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.weight._no_reinit = True  # type: ignore[attr-defined]  # a flag on the tensor: the backbone's init skips it
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, C = x.shape
        pad = cache if cache is not None else x.new_zeros(B, self.kernel_size - 1, C)
        xp = torch.cat([pad, x], dim=1)  # [B, K-1+T, C]
        y = causal_depthwise_conv(xp, self.weight)
        if self.activation:
            y = F.silu(y)
        new_cache = xp[:, T:] if cache is not None else None  # the last K-1 inputs
        return y, new_cache

    def init_cache(self, batch: int, device="cpu", dtype=torch.float32) -> torch.Tensor:
        return torch.zeros(batch, self.kernel_size - 1, self.channels, device=device, dtype=dtype)

    def cache_bytes(self) -> int:
        return (self.kernel_size - 1) * self.channels * 4
