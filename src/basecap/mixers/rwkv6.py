"""RWKV-6 "Finch" time mixing (Peng et al. 2024, "Eagle and Finch: RWKV with Matrix-Valued States
and Dynamic Recurrence", arXiv 2404.05892).

RWKV-5 with data dependence: the token shift interpolates with a data-dependent amount (ddlerp,
one small LoRA producing five mixes) and the decay is per token,

    xx = x_{t-1} - x_t,   m_c = mu_c + lora_c(x_t + xx mu_x),  x^c_t = x_t + xx * m_c
    w_t = exp(-exp(d + tanh(x^w_t A_d) B_d))
    wkv_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T),   S_t = diag(w_t) S_{t-1} + k_t v_t^T
    out_t = o_proj(GroupNorm(wkv_t) * silu(g_t))

Defaults follow the paper: head size 64, mix LoRA rank 32, decay LoRA rank 64, depth-ramped
inits (assuming ``init_n_layers`` layers), GroupNorm eps ``1e-5 * 8**2``. impl "ref" is the
step-by-step recurrence, "chunked" the chunked form in ``basecap.ops.wkv``, "fast" (CUDA only) fla's
``chunk_rwkv6`` through ``kernels/fla.py``; "auto" is "fast" on CUDA when fla imports, else "chunked".
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


class RWKV6Config(RWKVConfig):
    name: Literal["rwkv6"] = "rwkv6"
    mix_lora_rank: int = Field(32, gt=0, description="rank of the ddlerp LoRA (one per mixed input)")
    decay_lora_rank: int = Field(64, gt=0, description="rank of the data-dependent decay LoRA")
    head_size_divisor: float = Field(8.0, gt=0, description="GroupNorm eps = 1e-5 * divisor**2 (RWKV's ln_x)")
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"
    chunk_size: int = Field(16, gt=0)


class RWKV6(RWKVTimeMixing, Mixer):
    config_class = RWKV6Config
    cfg: RWKV6Config
    impls = ("ref", "chunked")
    out_projections = ("o_proj",)
    match_field = None
    compiles = True
    test_variants = [{"head_dim": 8, "mix_lora_rank": 4, "decay_lora_rank": 8}]
    fast_kernels = "fla"

    def __init__(self, d_model: int, cfg: RWKV6Config, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        D, R = d_model, cfg.mix_lora_rank
        H, K = self._init_heads(cfg.head_dim)
        ratio_0_to_1, ratio_1_to_almost0, ddd = depth_ramps(D, layer_idx, cfg.init_n_layers)
        n = torch.arange(D) / max(D - 1, 1)
        # mixes in the order of the LoRA outputs: w, k, v, r, g
        self.mix_x = nn.Parameter(1.0 - ddd**ratio_1_to_almost0)
        self.mix = nn.Parameter(
            torch.stack(
                [
                    1.0 - ddd**ratio_1_to_almost0,
                    1.0 - ddd**ratio_1_to_almost0,
                    1.0 - (ddd**ratio_1_to_almost0 + 0.3 * ratio_0_to_1),
                    1.0 - ddd ** (0.5 * ratio_1_to_almost0),
                    1.0 - ddd ** (0.5 * ratio_1_to_almost0),
                ]
            )
        )  # [5, D]
        self.mix_lora_a = nn.Parameter(torch.zeros(D, 5 * R))
        self.mix_lora_b = nn.Parameter(torch.empty(5, R, D).uniform_(-0.01, 0.01))
        self.time_decay = nn.Parameter(-6 + 5 * n ** (0.7 + 1.3 * ratio_0_to_1))
        self.decay_lora_a = nn.Parameter(torch.zeros(D, cfg.decay_lora_rank))
        self.decay_lora_b = nn.Parameter(torch.empty(cfg.decay_lora_rank, D).uniform_(-0.01, 0.01))
        zigzag = ((torch.arange(D) + 1) % 3 - 1) * 0.1
        self.bonus = nn.Parameter((ratio_0_to_1 * (1 - n) + zigzag).view(H, K))

        self.r_proj, self.k_proj, self.v_proj, self.g_proj, self.o_proj = rwkv_projections(D, 5, (1.0, 0.1, 1.0, 0.1))
        self.ln_x = head_norm(H, D, 1e-5 * cfg.head_size_divisor**2, layer_idx, cfg.init_n_layers)
        keep_init(self.mix_x, self.mix, self.mix_lora_a, self.mix_lora_b, self.time_decay, self.decay_lora_a, self.decay_lora_b, self.bonus)

    def forward(self, x: torch.Tensor, state: State | None = None):
        B, T, D = x.shape
        H, K, R = self.n_heads, self.head_dim, self.cfg.mix_lora_rank
        prev, last = token_shift(x, None if state is None else cast(torch.Tensor, state["shift"]))
        xx = prev - x
        lora = torch.tanh((x + xx * self.mix_x) @ self.mix_lora_a).view(B, T, 5, R)
        mixes = torch.einsum("btfr,frd->fbtd", lora, self.mix_lora_b) + self.mix[:, None, None]  # [5, B, T, D]
        xw, xk, xv, xr, xg = (x + xx * m for m in mixes.unbind(0))
        r = self.r_proj(xr).view(B, T, H, K)
        k = self.k_proj(xk).view(B, T, H, K)
        v = self.v_proj(xv).view(B, T, H, K)
        g = F.silu(self.g_proj(xg))
        log_w = -(self.time_decay + torch.tanh(xw @ self.decay_lora_a) @ self.decay_lora_b).exp().view(B, T, H, K)
        y, S = run_wkv6(self.resolve_impl(x), r, k, v, log_w, self.bonus, wkv_state_in(state), self.cfg.chunk_size)
        return self.o_proj(norm_heads(self.ln_x, y, x.dtype) * g), wkv_state_out(state, last, S)

    def flops_per_token(self, seq_len: int) -> float:
        return wkv6_flops(self.n_heads, self.cfg.chunk_size, self.head_dim)  # the LoRAs count as matmul parameters
