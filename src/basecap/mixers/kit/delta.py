"""The delta-rule core shared by DeltaNet and Gated DeltaNet: the form dispatch (step-by-step
reference, chunked PyTorch, fla kernel), the FLOP count and the decode state (matrix state + conv
cache)."""

from __future__ import annotations

from typing import cast

import torch

from ...ops.delta_rule import delta_rule_chunked, delta_rule_recurrent
from ...ops.short_conv import ShortConv
from ..base import State
from .recurrent import conv_bytes, conv_state


def run_delta_rule(impl: str, q, k, v, beta, g, state: State | None, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``o [B, H, T, V]`` and the final matrix state of the (gated, when ``g`` is given) delta rule in
    the form ``impl`` ("ref", "fast" or "chunked"), continuing from ``state["S"]`` when a decode state
    is given; q, k ``[B, H, T, K]``, beta and g ``[B, H, T]``."""
    S0 = None if state is None else cast(torch.Tensor, state["S"])
    if impl == "ref":
        return delta_rule_recurrent(q, k, v, beta, g, state=S0)
    if impl == "fast":
        from ...kernels.fla import delta_rule

        return delta_rule(q, k, v, beta, g, state=S0)
    return delta_rule_chunked(q, k, v, beta, g, state=S0, chunk_size=chunk_size)


def delta_flops(n_heads: int, C: int, K: int, V: int) -> float:
    """Chunked form per token: k.k and q.k within the chunk (2CK), the triangular solve and u, w
    (C(K+V)), the state reads/writes (3KV) and P @ u (CV); x2 for multiply-add."""
    return 2.0 * n_heads * (2 * C * K + C * (K + V) + 3 * K * V + C * V)


class DeltaRuleState:
    """``init_state`` / ``state_size`` of a delta-rule mixer (a mixin for ``Mixer``): the fp32 matrix
    state ``S [B, H, K, V]`` and the short-convolution cache, with ``H = n_heads``, ``K = head_k``,
    ``V = head_v`` and ``conv`` (None without a convolution) set by the mixer."""

    n_heads: int
    head_k: int
    head_v: int
    conv: ShortConv | None

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        S = torch.zeros(batch, self.n_heads, self.head_k, self.head_v, device=device, dtype=torch.float32)
        return {"S": S, **conv_state(self.conv, batch, device, dtype)}

    def state_size(self, seq_len: int) -> int:
        return self.n_heads * self.head_k * self.head_v * 4 + conv_bytes(self.conv)
