"""Gated DeltaNet (Yang, Kautz, Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with
Delta Rule", ICLR 2025, arXiv 2412.06464).

Per head: q, k, v through causal short convolutions + SiLU, q and k L2-normalised,
beta_t = sigmoid(w_beta . x_t) and a scalar gate alpha_t = exp(g_t) with the Mamba-2
parameterisation g_t = -exp(A_log) * softplus(w_a . x_t + dt_bias). Then

    S_t = alpha_t S_{t-1} + beta_t (v_t - alpha_t S_{t-1}^T k_t) k_t^T    o_t = S_t^T q_t / sqrt(K)

and the output goes through a gated RMSNorm, RMSNorm(o_t) * silu(W_g x_t), and the output
projection. Defaults follow the paper: 6 heads with n_heads * head_dim = 0.75 d_model (head_dim 256
at d_model 2048), value dim expand_v = 2 times the key dim, short conv size 4, A ~ U(1, 16),
dt ~ logU(1e-3, 0.1).

``impl="ref"`` runs the step-by-step recurrence, ``"chunked"`` the chunked form of
``ops/delta_rule.py``, ``"fast"`` (CUDA only) fla's ``chunk_gated_delta_rule`` through
``kernels/fla.py``; ``"auto"`` is "fast" on CUDA when fla imports, else "chunked" (docs/kernels.md).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..ops.delta_rule import l2_normalize
from ..ops.norm import RMSNorm
from ..ops.short_conv import ShortConv
from .base import Mixer, MixerConfig, State
from .kit.delta import DeltaRuleState, delta_flops, run_delta_rule
from .kit.recurrent import check_ranges, conv_or_silu, init_A_log, init_dt_bias, keep_init


class GatedDeltaNetConfig(MixerConfig):
    name: Literal["gated_deltanet"] = "gated_deltanet"
    n_heads: int = Field(6, gt=0)
    head_dim: int | None = Field(None, gt=0, description="key dim per head; default 0.75 * d_model // n_heads")
    expand_v: int = Field(2, gt=0, description="value dim per head = expand_v * head_dim")
    short_conv: bool = True
    conv_size: int = Field(4, ge=1)
    chunk_size: int = Field(64, gt=0)
    norm_eps: float = Field(1e-5, gt=0)
    dt_min: float = Field(1e-3, gt=0)
    dt_max: float = Field(0.1, gt=0)
    A_init_range: tuple[float, float] = (1.0, 16.0)
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"

    @model_validator(mode="after")
    def _check(self):
        if not 0 < self.A_init_range[0] <= self.A_init_range[1]:
            raise ValueError("A_init_range must satisfy 0 < low <= high")
        return check_ranges(self, ("dt_min", "dt_max"))


class GatedDeltaNet(DeltaRuleState, Mixer):
    config_class = GatedDeltaNetConfig
    cfg: GatedDeltaNetConfig
    impls = ("ref", "chunked")
    out_projections = ("o_proj",)
    match_field = None
    compiles = True
    test_variants = [{"n_heads": 2, "head_dim": 8}, {"n_heads": 2, "head_dim": 8, "short_conv": False}]
    fast_kernels = "fla"

    def __init__(self, d_model: int, cfg: GatedDeltaNetConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        H = self.n_heads = cfg.n_heads
        K = self.head_k = cfg.head_dim or max(1, (3 * d_model // 4) // H)
        V = self.head_v = cfg.expand_v * K
        self.qkv_proj = nn.Linear(d_model, H * (2 * K + V), bias=False)
        self.g_proj = nn.Linear(d_model, H * V, bias=False)  # output gate
        self.a_proj = nn.Linear(d_model, H, bias=False)  # decay input
        self.b_proj = nn.Linear(d_model, H, bias=False)  # beta
        self.A_log = nn.Parameter(init_A_log(H, *cfg.A_init_range))
        self.dt_bias = nn.Parameter(init_dt_bias(H, cfg.dt_min, cfg.dt_max))
        keep_init(self.A_log, self.dt_bias)
        # depthwise, so one conv over [q, k, v] = three separate ones
        self.conv = ShortConv(H * (2 * K + V), cfg.conv_size) if cfg.short_conv else None
        self.o_norm = RMSNorm(V, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(H * V, d_model, bias=False)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """g_t = log alpha_t <= 0, ``[B, H, T]``."""
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias.float())
        return g.transpose(1, 2)

    def forward(self, x: torch.Tensor, state: State | None = None):
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.head_k, self.head_v
        qkv, conv_state_new = conv_or_silu(self.conv, self.qkv_proj(x), state)
        q, k, v = qkv.split([H * K, H * K, H * V], dim=-1)
        q = l2_normalize(q.view(B, T, H, K).transpose(1, 2).contiguous())  # [B, H, T, K]
        k = l2_normalize(k.view(B, T, H, K).transpose(1, 2).contiguous())
        v = v.view(B, T, H, V).transpose(1, 2).contiguous()
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)  # [B, H, T]
        g = self.log_decay(x)
        o, S = run_delta_rule(self.resolve_impl(x), q, k, v, beta, g, state, self.cfg.chunk_size)
        gate = self.g_proj(x).view(B, T, H, V)
        o = (self.o_norm(o.transpose(1, 2).to(x.dtype)) * F.silu(gate)).reshape(B, T, H * V)
        return self.o_proj(o), (None if state is None else {"S": S, **conv_state_new})

    def flops_per_token(self, seq_len: int) -> float:
        # the chunked delta rule (kit/delta.py), plus the decay weighting (2C per head)
        C = min(self.cfg.chunk_size, max(seq_len, 1))
        return delta_flops(self.n_heads, C, self.head_k, self.head_v) + 2.0 * self.n_heads * 2 * C
