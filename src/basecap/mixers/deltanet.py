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
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..ops.delta_rule import delta_rule_chunked, delta_rule_recurrent, l2_normalize
from ..ops.short_conv import ShortConv
from .base import Mixer, MixerConfig, State


class DeltaNetConfig(MixerConfig):
    name: Literal["deltanet"] = "deltanet"
    head_dim: int = Field(64, gt=0, description="key = value dim per head")
    n_heads: int | None = Field(None, gt=0, description="default: d_model // head_dim")
    short_conv: bool = True
    conv_size: int = Field(4, ge=1)
    chunk_size: int = Field(64, gt=0)
    norm_eps: float = Field(1e-5, gt=0)
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"


class DeltaNet(Mixer):
    config_class = DeltaNetConfig
    impls = ("ref", "chunked")
    test_variants = [{"head_dim": 8}, {"head_dim": 8, "short_conv": False}]

    def __init__(self, d_model: int, cfg: DeltaNetConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        self.n_heads = cfg.n_heads or max(1, d_model // cfg.head_dim)
        self.head_dim = cfg.head_dim
        inner = self.n_heads * self.head_dim
        self.qkv_proj = nn.Linear(d_model, 3 * inner, bias=False)
        self.b_proj = nn.Linear(d_model, self.n_heads, bias=False)
        if cfg.short_conv:  # depthwise, so one conv over [q, k, v] = three separate ones
            self.conv = ShortConv(3 * inner, cfg.conv_size)
        self.o_norm = nn.RMSNorm(self.head_dim, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(inner, d_model, bias=False)

    def forward(self, x: torch.Tensor, state: State | None = None):
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        new_state: dict = {}
        qkv = self.qkv_proj(x)
        if self.cfg.short_conv:
            qkv, conv = self.conv(qkv, None if state is None else state["conv"])
            if state is not None:
                new_state["conv"] = conv
        else:
            qkv = F.silu(qkv)
        q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).contiguous()  # 3 x [B, H, T, D]
        q, k = l2_normalize(q), l2_normalize(k)
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)  # [B, H, T]
        S0 = None if state is None else state["S"]
        impl = self.cfg.impl
        if impl == "fast" or (impl == "auto" and x.is_cuda):
            from ..kernels.fla import resolve_impl  # imports fla (Triton) only for a CUDA input
            impl = resolve_impl(self.cfg.name, impl, x)
        if impl == "ref":
            o, S = delta_rule_recurrent(q, k, v, beta, state=S0)
        elif impl == "fast":
            from ..kernels.fla import delta_rule
            o, S = delta_rule(q, k, v, beta, state=S0)
        else:
            o, S = delta_rule_chunked(q, k, v, beta, state=S0, chunk_size=self.cfg.chunk_size)
        o = self.o_norm(o.transpose(1, 2).to(x.dtype)).reshape(B, T, H * D)
        if state is None:
            return self.o_proj(o), None
        new_state["S"] = S
        return self.o_proj(o), new_state

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        state: State = {"S": torch.zeros(batch, self.n_heads, self.head_dim, self.head_dim, device=device, dtype=torch.float32)}
        if self.cfg.short_conv:
            state["conv"] = self.conv.init_cache(batch, device, dtype)
        return state

    def state_size(self, seq_len: int) -> int:
        conv = self.conv.cache_bytes() if self.cfg.short_conv else 0
        return self.n_heads * self.head_dim * self.head_dim * 4 + conv

    def flops_per_token(self, seq_len: int) -> float:
        # chunked form per head and token: k.k and q.k within the chunk (2CK), the triangular solve
        # and u, w (C(K+V)), the state reads/writes (3KV) and P @ u (CV); x2 for multiply-add
        C, K, V = min(self.cfg.chunk_size, max(seq_len, 1)), self.head_dim, self.head_dim
        return 2.0 * self.n_heads * (2 * C * K + C * (K + V) + 3 * K * V + C * V)
