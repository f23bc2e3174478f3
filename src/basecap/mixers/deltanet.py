"""DeltaNet: linear attention with the delta rule (Schlag et al. 2021, "Linear Transformers Are
Secretly Fast Weight Programmers"; Yang et al. 2024, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length", arXiv 2406.06484).

Per head: q, k, v from linear maps, each through a causal short convolution + SiLU (ShortConv),
q and k L2-normalised, beta_t = sigmoid(w_beta . x_t), then

    S_t = S_{t-1} + beta_t (v_t - S_{t-1}^T k_t) k_t^T        o_t = S_t^T q_t / sqrt(K)

followed by a per-head RMSNorm and the output projection. ``short_conv=False`` replaces the
convolutions by a plain SiLU (ablation). ``impl="ref"`` runs the step-by-step recurrence,
``"chunked"`` the chunked UT-transform form from ``ops/delta_rule.py``, ``"fast"`` (CUDA only) fla's
``chunk_delta_rule`` through ``kernels/fla.py``; ``"auto"`` is "fast" on CUDA when fla imports, else
"chunked" (docs/kernels.md).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from ..ops.delta_rule import l2_normalize
from ..ops.norm import RMSNorm
from ..ops.short_conv import ShortConv
from .base import Mixer, MixerConfig, State
from .kit.delta import DeltaRuleState, delta_flops, run_delta_rule
from .kit.heads import n_heads_for
from .kit.recurrent import conv_or_silu


class DeltaNetConfig(MixerConfig):
    name: Literal["deltanet"] = "deltanet"
    head_dim: int = Field(64, gt=0, description="key = value dim per head")
    n_heads: int | None = Field(None, gt=0, description="default: d_model // head_dim")
    short_conv: bool = True
    conv_size: int = Field(4, ge=1)
    chunk_size: int = Field(64, gt=0)
    norm_eps: float = Field(1e-5, gt=0)
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"


class DeltaNet(DeltaRuleState, Mixer):
    config_class = DeltaNetConfig
    cfg: DeltaNetConfig
    impls = ("ref", "chunked")
    out_projections = ("o_proj",)
    match_field = None
    compiles = True
    test_variants = [{"head_dim": 8}, {"head_dim": 8, "short_conv": False}]
    fast_kernels = "fla"

    def __init__(self, d_model: int, cfg: DeltaNetConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        self.n_heads = n_heads_for(d_model, cfg.head_dim, cfg.n_heads)
        self.head_dim = self.head_k = self.head_v = cfg.head_dim
        inner = self.n_heads * self.head_dim
        self.qkv_proj = nn.Linear(d_model, 3 * inner, bias=False)
        self.b_proj = nn.Linear(d_model, self.n_heads, bias=False)
        # depthwise, so one conv over [q, k, v] = three separate ones
        self.conv = ShortConv(3 * inner, cfg.conv_size) if cfg.short_conv else None
        self.o_norm = RMSNorm(self.head_dim, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(inner, d_model, bias=False)

    def forward(self, x: torch.Tensor, state: State | None = None):
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        qkv, conv_state_new = conv_or_silu(self.conv, self.qkv_proj(x), state)
        q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).contiguous()  # 3 x [B, H, T, D]
        q, k = l2_normalize(q), l2_normalize(k)
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)  # [B, H, T]
        o, S = run_delta_rule(self.resolve_impl(x), q, k, v, beta, None, state, self.cfg.chunk_size)
        o = self.o_norm(o.transpose(1, 2).to(x.dtype)).reshape(B, T, H * D)
        return self.o_proj(o), (None if state is None else {"S": S, **conv_state_new})

    def flops_per_token(self, seq_len: int) -> float:
        return delta_flops(self.n_heads, min(self.cfg.chunk_size, max(seq_len, 1)), self.head_k, self.head_v)
