"""RWKV-5 "Eagle" time mixing (Peng et al. 2024, "Eagle and Finch: RWKV with Matrix-Valued States
and Dynamic Recurrence", arXiv 2404.05892).

Multi-head matrix-valued state with a static per-channel decay ``w = exp(-exp(decay))`` and a
bonus ``u`` for the current token; r, k, v, g read a token-shifted input through learned static
mixes; SiLU output gate; GroupNorm over heads:

    x^c_t = x_t mu_c + x_{t-1} (1 - mu_c),  c in {r, k, v, g}
    wkv_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T),   S_t = diag(w) S_{t-1} + k_t v_t^T
    out_t = o_proj(GroupNorm(wkv_t) * silu(g_t))

Defaults follow the paper: head size 64, depth-ramped mix / decay / bonus inits, GroupNorm eps
``1e-5 * 8**2``. Init ramps assume ``init_n_layers`` layers. impl "ref" is the step-by-step
recurrence, "chunked" (= "auto") the chunked form in ``basecap.ops.wkv``.
"""

from __future__ import annotations

from typing import Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..ops.wkv import token_shift
from .base import Mixer, State
from .kit.recurrent import keep_init
from .kit.rwkv import (
    RWKVConfig,
    RWKVTimeMixing,
    depth_ramps,
    head_norm,
    norm_heads,
    run_wkv6,
    rwkv_projections,
    wkv6_flops,
    wkv_state_in,
    wkv_state_out,
)


class RWKV5Config(RWKVConfig):
    name: Literal["rwkv5"] = "rwkv5"
    head_size_divisor: float = Field(8.0, gt=0, description="GroupNorm eps = 1e-5 * divisor**2 (RWKV's ln_x)")
    impl: Literal["ref", "chunked", "auto"] = "auto"
    chunk_size: int = Field(16, gt=0)


class RWKV5(RWKVTimeMixing, Mixer):
    config_class = RWKV5Config
    cfg: RWKV5Config
    impls = ("ref", "chunked")
    out_projections = ("o_proj",)
    match_field = None
    compiles = True
    test_variants = [{"head_dim": 8}]

    def __init__(self, d_model: int, cfg: RWKV5Config, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        D = d_model
        H, K = self._init_heads(cfg.head_dim)
        ratio_0_to_1, ratio_1_to_almost0, ddd = depth_ramps(D, layer_idx, cfg.init_n_layers)
        n = torch.arange(D) / max(D - 1, 1)
        self.mix_r = nn.Parameter(ddd ** (0.5 * ratio_1_to_almost0))
        self.mix_k = nn.Parameter(ddd**ratio_1_to_almost0)
        self.mix_v = nn.Parameter(ddd**ratio_1_to_almost0 + 0.3 * ratio_0_to_1)
        self.mix_g = nn.Parameter(ddd ** (0.5 * ratio_1_to_almost0))
        self.time_decay = nn.Parameter((-6 + 5 * n ** (0.7 + 1.3 * ratio_0_to_1)).view(H, K))
        zigzag = ((torch.arange(D) + 1) % 3 - 1) * 0.1
        self.bonus = nn.Parameter((ratio_0_to_1 * (1 - n) + zigzag).view(H, K))

        self.r_proj, self.k_proj, self.v_proj, self.g_proj, self.o_proj = rwkv_projections(D, 5, (1.0, 0.1, 1.0, 0.1))
        self.ln_x = head_norm(H, D, 1e-5 * cfg.head_size_divisor**2, layer_idx, cfg.init_n_layers)
        keep_init(self.mix_r, self.mix_k, self.mix_v, self.mix_g, self.time_decay, self.bonus)

    def forward(self, x: torch.Tensor, state: State | None = None):
        B, T, D = x.shape
        H, K = self.n_heads, self.head_dim
        prev, last = token_shift(x, None if state is None else cast(torch.Tensor, state["shift"]))
        r = self.r_proj(torch.lerp(prev, x, self.mix_r)).view(B, T, H, K)
        k = self.k_proj(torch.lerp(prev, x, self.mix_k)).view(B, T, H, K)
        v = self.v_proj(torch.lerp(prev, x, self.mix_v)).view(B, T, H, K)
        g = F.silu(self.g_proj(torch.lerp(prev, x, self.mix_g)))
        log_w = (-self.time_decay.exp()).expand(B, T, H, K)
        y, S = run_wkv6(self.resolve_impl(x), r, k, v, log_w, self.bonus, wkv_state_in(state), self.cfg.chunk_size)
        return self.o_proj(norm_heads(self.ln_x, y, x.dtype) * g), wkv_state_out(state, last, S)

    def flops_per_token(self, seq_len: int) -> float:
        return wkv6_flops(self.n_heads, self.cfg.chunk_size, self.head_dim)
