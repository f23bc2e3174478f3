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

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..ops.delta_rule import delta_rule_chunked, delta_rule_recurrent, l2_normalize
from ..ops.short_conv import ShortConv
from .base import Mixer, MixerConfig, State


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
        if self.dt_min > self.dt_max:
            raise ValueError("dt_min must be <= dt_max")
        return self


class GatedDeltaNet(Mixer):
    config_class = GatedDeltaNetConfig
    impls = ("ref", "chunked")
    test_variants = [{"n_heads": 2, "head_dim": 8}, {"n_heads": 2, "head_dim": 8, "short_conv": False}]

    def __init__(self, d_model: int, cfg: GatedDeltaNetConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        H = self.n_heads = cfg.n_heads
        K = self.head_k = cfg.head_dim or max(1, (3 * d_model // 4) // H)
        V = self.head_v = cfg.expand_v * K
        self.qkv_proj = nn.Linear(d_model, H * (2 * K + V), bias=False)
        self.g_proj = nn.Linear(d_model, H * V, bias=False)  # output gate
        self.a_proj = nn.Linear(d_model, H, bias=False)  # decay input
        self.b_proj = nn.Linear(d_model, H, bias=False)  # beta
        lo, hi = cfg.A_init_range
        self.A_log = nn.Parameter(torch.empty(H).uniform_(lo, hi).log())
        dt = torch.exp(torch.rand(H) * (math.log(cfg.dt_max) - math.log(cfg.dt_min)) + math.log(cfg.dt_min))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log._no_reinit = self.dt_bias._no_reinit = True
        self.A_log._no_weight_decay = self.dt_bias._no_weight_decay = True
        if cfg.short_conv:  # depthwise, so one conv over [q, k, v] = three separate ones
            self.conv = ShortConv(H * (2 * K + V), cfg.conv_size)
        self.o_norm = nn.RMSNorm(V, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(H * V, d_model, bias=False)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """g_t = log alpha_t <= 0, ``[B, H, T]``."""
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias.float())
        return g.transpose(1, 2)

    def forward(self, x: torch.Tensor, state: State | None = None):
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.head_k, self.head_v
        new_state: dict = {}
        qkv = self.qkv_proj(x)
        if self.cfg.short_conv:
            qkv, conv = self.conv(qkv, None if state is None else state["conv"])
            if state is not None:
                new_state["conv"] = conv
        else:
            qkv = F.silu(qkv)
        q, k, v = qkv.split([H * K, H * K, H * V], dim=-1)
        q = l2_normalize(q.view(B, T, H, K).transpose(1, 2).contiguous())  # [B, H, T, K]
        k = l2_normalize(k.view(B, T, H, K).transpose(1, 2).contiguous())
        v = v.view(B, T, H, V).transpose(1, 2).contiguous()
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)  # [B, H, T]
        g = self.log_decay(x)
        S0 = None if state is None else state["S"]
        impl = self.cfg.impl
        if impl == "fast" or (impl == "auto" and x.is_cuda):
            from ..kernels.fla import resolve_impl  # imports fla (Triton) only for a CUDA input
            impl = resolve_impl(self.cfg.name, impl, x)
        if impl == "ref":
            o, S = delta_rule_recurrent(q, k, v, beta, g, state=S0)
        elif impl == "fast":
            from ..kernels.fla import delta_rule
            o, S = delta_rule(q, k, v, beta, g, state=S0)
        else:
            o, S = delta_rule_chunked(q, k, v, beta, g, state=S0, chunk_size=self.cfg.chunk_size)
        gate = self.g_proj(x).view(B, T, H, V)
        o = (self.o_norm(o.transpose(1, 2).to(x.dtype)) * F.silu(gate)).reshape(B, T, H * V)
        if state is None:
            return self.o_proj(o), None
        new_state["S"] = S
        return self.o_proj(o), new_state

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        state: State = {"S": torch.zeros(batch, self.n_heads, self.head_k, self.head_v, device=device, dtype=torch.float32)}
        if self.cfg.short_conv:
            state["conv"] = self.conv.init_cache(batch, device, dtype)
        return state

    def state_size(self, seq_len: int) -> int:
        conv = self.conv.cache_bytes() if self.cfg.short_conv else 0
        return self.n_heads * self.head_k * self.head_v * 4 + conv

    def flops_per_token(self, seq_len: int) -> float:
        # chunked form per head and token (see DeltaNet.flops_per_token), plus the decay weighting
        C, K, V = min(self.cfg.chunk_size, max(seq_len, 1)), self.head_k, self.head_v
        return 2.0 * self.n_heads * (2 * C * K + C * (K + V) + 3 * K * V + C * V + 2 * C)
