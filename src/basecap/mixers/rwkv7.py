"""RWKV-7 "Goose" time mixing (Peng et al. 2025, "RWKV-7 'Goose' with Expressive Dynamic State
Evolution", arXiv 2503.14456).

A generalised delta rule with vector decay. In the paper's layout (state ``S`` is value x key,
row vectors):

    S_t = S_{t-1} (diag(w_t) - kappa_hat_t^T (a_t * kappa_hat_t)) + v_t^T k~_t,   wkv_t = S_t r_t^T
    w_t = exp(-e^{-0.5} sigmoid(w0 + tanh(x^w A_w) B_w))      decay in (0.545, 1)
    a_t = sigmoid(a0 + x^a A_a B_a)                            in-context learning rate
    kappa_hat_t = normalize(k_t * k_k) per head                removal key
    k~_t = k_t * (1 + (a_t - 1) * k_a)                         replacement key
    out_t = o_proj((GroupNorm(wkv_t) + (r_t . (k~_t * r_k)) v_t) * g_t),  g = sigmoid(x^g A_g) B_g

with static token-shift mixes for r, w, k, v, a, g. Defaults follow the paper's code: head size
64, LoRA ranks from d_model, depth-ramped inits (assuming ``init_n_layers`` layers). The value
residual across layers (v_first) is omitted: the backbone passes only x between layers.
impl "ref" is the step-by-step recurrence, "chunked" the chunked form in ``basecap.ops.wkv``,
"fast" (CUDA only) fla's ``chunk_rwkv7`` through ``kernels/fla.py``; "auto" is "fast" on CUDA when
fla imports, else "chunked".
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..ops.wkv import orthogonal_init_, token_shift
from .base import Mixer, State
from .kit.recurrent import keep_init
from .kit.rwkv import RWKVConfig, RWKVTimeMixing, depth_ramps, head_norm, norm_heads, run_wkv7, rwkv_projections, wkv_state_in, wkv_state_out


def _lora_rank(d_model: int, factor: float) -> int:
    return max(32, int(round(factor * d_model**0.5 / 32) * 32))


class RWKV7Config(RWKVConfig):
    name: Literal["rwkv7"] = "rwkv7"
    decay_lora_rank: int | None = Field(None, gt=0, description="default max(32, 2.5 sqrt(d_model) rounded to 32)")
    a_lora_rank: int | None = Field(None, gt=0, description="default max(32, 2.5 sqrt(d_model) rounded to 32)")
    gate_lora_rank: int | None = Field(None, gt=0, description="default max(32, 5 sqrt(d_model) rounded to 32)")
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"
    chunk_size: int = Field(32, gt=0, le=128, description="<= 128 keeps every intra-chunk factor below e^39")


class RWKV7(RWKVTimeMixing, Mixer):
    config_class = RWKV7Config
    cfg: RWKV7Config
    impls = ("ref", "chunked")
    out_projections = ("o_proj",)
    match_field = None
    compiles = True
    test_variants = [{"head_dim": 8, "decay_lora_rank": 8, "a_lora_rank": 4, "gate_lora_rank": 8}]
    fast_kernels = "fla"

    def __init__(self, d_model: int, cfg: RWKV7Config, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        D = d_model
        H, K = self._init_heads(cfg.head_dim)
        ratio_0_to_1, ratio_1_to_almost0, ddd = depth_ramps(D, layer_idx, cfg.init_n_layers)
        idx = torch.arange(D)
        linear = idx / max(D - 1, 1) - 0.5
        zigzag = ((idx % K) - (K - 1) / 2) / max((K - 1) / 2, 1)
        zigzag = zigzag * zigzag.abs()
        # token-shift mixes in the order r, w, k, v, a, g
        self.mix = nn.Parameter(torch.stack([1.0 - ddd ** (p * ratio_1_to_almost0) for p in (0.2, 0.9, 0.7, 0.7, 0.9, 0.2)]))

        def lora(rank: int | None, factor: float, scale_b: float = 0.1):
            rank = rank or _lora_rank(D, factor)
            return nn.Parameter(torch.zeros(D, rank)), nn.Parameter(orthogonal_init_(torch.empty(rank, D), scale_b))

        decay_speed = -6 + 6 * (idx / max(D - 1, 1)) ** (1 + ratio_0_to_1**0.3)
        self.w0 = nn.Parameter(decay_speed + 0.5 + zigzag * 2.5)
        self.w1, self.w2 = lora(cfg.decay_lora_rank, 2.5)
        self.a0 = nn.Parameter(-0.19 + zigzag * 0.3 + linear * 0.4)
        self.a1, self.a2 = lora(cfg.a_lora_rank, 2.5)
        self.g1, self.g2 = lora(cfg.gate_lora_rank, 5.0)
        self.k_k = nn.Parameter(0.71 - linear * 0.1)
        self.k_a = nn.Parameter(torch.full((D,), 1.02))
        self.r_k = nn.Parameter(torch.full((H, K), -0.04))

        self.r_proj, self.k_proj, self.v_proj, self.o_proj = rwkv_projections(D, 4, (1.0, 0.1, 1.0))
        self.ln_x = head_norm(H, D, 64e-5, layer_idx, cfg.init_n_layers)
        keep_init(self.mix, self.w0, self.w1, self.w2, self.a0, self.a1, self.a2, self.g1, self.g2, self.k_k, self.k_a, self.r_k)

    def forward(self, x: torch.Tensor, state: State | None = None):
        B, T, D = x.shape
        H, K = self.n_heads, self.head_dim
        prev, last = token_shift(x, None if state is None else cast(torch.Tensor, state["shift"]))
        xx = prev - x
        xr, xw, xk, xv, xa, xg = (x + xx * m for m in self.mix.unbind(0))
        r = self.r_proj(xr)
        log_w = -math.exp(-0.5) * torch.sigmoid(self.w0 + torch.tanh(xw @ self.w1) @ self.w2)
        k = self.k_proj(xk)
        v = self.v_proj(xv)
        a = torch.sigmoid(self.a0 + (xa @ self.a1) @ self.a2)
        g = torch.sigmoid(xg @ self.g1) @ self.g2
        kk = F.normalize((k * self.k_k).view(B, T, H, K), dim=-1)  # removal key kappa_hat
        k = k * (1 + (a - 1) * self.k_a)  # replacement key
        r, k, v, a, log_w = (t.view(B, T, H, K) for t in (r, k, v, a, log_w))
        y, S = run_wkv7(self.resolve_impl(x), r, log_w, k, v, -kk, kk * a, wkv_state_in(state), self.cfg.chunk_size)
        y = norm_heads(self.ln_x, y, x.dtype).view(B, T, H, K)
        y = y + (r * k * self.r_k).sum(-1, keepdim=True) * v  # per-head bonus for the current token
        return self.o_proj(y.reshape(B, T, D) * g), wkv_state_out(state, last, S)

    def flops_per_token(self, seq_len: int) -> float:
        # chunked form, multiply-adds per token and head: [r;a][k;b]^T (4CK), triangular solve
        # (C(K+V)/2), A v and A u products (3CV), chunk transition M and X (K^2 + 2KV), the scan
        # (K^2 V / C) and the state reads (2KV); the LoRAs are counted as matmul parameters
        C, K = self.cfg.chunk_size, self.head_dim
        mac = 4 * C * K + C * K + 3 * C * K + K * K + 2 * K * K + K**3 / C + 2 * K * K
        return 2.0 * self.n_heads * mac
