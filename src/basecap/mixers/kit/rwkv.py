"""What the RWKV-5/6/7 time-mixing blocks share (Peng et al. 2024, arXiv 2404.05892; Peng et al.
2025, arXiv 2503.14456): config fields, heads and decode state (``RWKVTimeMixing``), the depth-ramped
init, the orthogonally initialised projections, the GroupNorm over heads (``ln_x``) and the WKV form
dispatch."""

from __future__ import annotations

from typing import cast

import torch
from pydantic import Field
from torch import nn

from ...ops.wkv import depth_ratios, orthogonal_init_, wkv6_chunked, wkv6_recurrent, wkv7_chunked, wkv7_recurrent
from ..base import MixerConfig, State
from .recurrent import keep_init


class RWKVConfig(MixerConfig):
    """Fields shared by the RWKV time-mixing configs."""

    name: str
    head_dim: int = Field(64, gt=0, description="per-head key = value size; d_model must be a multiple")
    init_n_layers: int = Field(12, gt=0, description="depth the init ramps assume (mixers are not told n_layers)")

    def default_mlp(self) -> str:
        return "rwkv_cmix"


def depth_ramps(d_model: int, layer_idx: int, init_n_layers: int) -> tuple[float, float, torch.Tensor]:
    """RWKV's init ramps: ``ratio_0_to_1`` and ``ratio_1_to_almost0`` over depth, ``ddd = arange(D) / D``
    over channels."""
    ratio_0_to_1, ratio_1_to_almost0 = depth_ratios(layer_idx, init_n_layers)
    return ratio_0_to_1, ratio_1_to_almost0, torch.arange(d_model) / d_model


def rwkv_projections(d_model: int, n: int, gains: tuple[float, ...]) -> tuple[nn.Linear, ...]:
    """``n`` bias-free d_model x d_model projections; the first ``len(gains)`` are orthogonal with
    those gains (kept by the backbone), the rest get the backbone's init."""
    projs = tuple(nn.Linear(d_model, d_model, bias=False) for _ in range(n))
    for proj, gain in zip(projs, gains):
        orthogonal_init_(proj.weight, gain)
        keep_init(proj.weight)
    return projs


def head_norm(n_heads: int, d_model: int, eps: float, layer_idx: int, init_n_layers: int) -> nn.GroupNorm:
    """GroupNorm over heads with RWKV's depth-ramped weight ``((1 + l) / L) ** 0.7``."""
    ln_x = nn.GroupNorm(n_heads, d_model, eps=eps)
    nn.init.constant_(ln_x.weight, ((1 + min(layer_idx, init_n_layers - 1)) / init_n_layers) ** 0.7)
    keep_init(ln_x)
    return ln_x


def norm_heads(ln_x: nn.GroupNorm, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``ln_x`` over the heads of ``y [B, T, H, K]``, in ``dtype``; returns ``[B, T, H * K]``."""
    B, T = y.shape[:2]
    return ln_x(y.reshape(B * T, -1).to(dtype)).view(B, T, -1)


def run_wkv6(impl: str, r, k, v, log_w, u, S0, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """WKV-6 (RWKV-5/6) in the form ``impl`` ("ref", "fast" or "chunked"); the fast form's state is None in training."""
    if impl == "ref":
        return wkv6_recurrent(r, k, v, log_w, u, S0)
    if impl == "fast":
        from ...kernels.fla import wkv6

        return wkv6(r, k, v, log_w, u, S0)
    return wkv6_chunked(r, k, v, log_w, u, S0, chunk_size=chunk_size)


def run_wkv7(impl: str, r, log_w, k, v, a, b, S0, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """WKV-7 (RWKV-7's generalised delta rule) in the form ``impl`` ("ref", "fast" or "chunked")."""
    if impl == "ref":
        return wkv7_recurrent(r, log_w, k, v, a, b, S0)
    if impl == "fast":
        from ...kernels.fla import wkv7

        return wkv7(r, log_w, k, v, a, b, S0)
    return wkv7_chunked(r, log_w, k, v, a, b, S0, chunk_size=chunk_size)


def wkv6_flops(n_heads: int, C: int, K: int) -> float:
    """Chunked form per head: intra-chunk scores (~C/2 keys x K) and scores @ v (C x V), chunk state
    build + state read (2 x K x V); token shift, norms and LoRAs are not counted here."""
    return 2.0 * n_heads * (K * (C + 1) / 2 + C * K + 2 * K * K)


def wkv_state_in(state: State | None) -> torch.Tensor | None:
    return None if state is None else cast(torch.Tensor, state["wkv"])


def wkv_state_out(state: State | None, last: torch.Tensor, S: torch.Tensor | None) -> State | None:
    """The new decode state (None in training): the last input token and the WKV state."""
    return None if state is None else {"shift": last, "wkv": cast(torch.Tensor, S)}  # every form returns S given a state


class RWKVTimeMixing:
    """What an RWKV time-mixing block inherits besides ``Mixer`` (a mixin): its heads and its decode
    state, the last input token ``[B, d_model]`` (token shift) and the fp32 WKV state ``[B, H, K, K]``."""

    cfg: RWKVConfig
    d_model: int
    n_heads: int
    head_dim: int

    def _init_heads(self, head_dim: int) -> tuple[int, int]:
        """Sets and returns ``n_heads`` and ``head_dim`` (which must divide d_model)."""
        if self.d_model % head_dim:
            raise ValueError(f"{self.cfg.name}.head_dim={head_dim} must divide d_model={self.d_model}")
        self.n_heads, self.head_dim = self.d_model // head_dim, head_dim
        return self.n_heads, head_dim

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        K = self.head_dim
        return {
            "shift": torch.zeros(batch, self.d_model, device=device, dtype=dtype),
            "wkv": torch.zeros(batch, self.n_heads, K, K, device=device, dtype=torch.float32),
        }

    def state_size(self, seq_len: int) -> int:
        return (self.d_model + self.n_heads * self.head_dim**2) * 4
