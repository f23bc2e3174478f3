"""Based (Arora et al. 2024, "Simple linear attention language models balance the
recall-throughput tradeoff", arXiv 2402.18668): Taylor linear attention + sliding-window attention.

Linear branch (per head, feature_dim d = 16, value dim d_model / n_heads, no positions):
phi(x) = [1, x / d^(1/4), vec(x x^T) / (sqrt(2) sqrt(d))], so phi(q).phi(k) = 1 + s + s^2/2 with
s = q.k / sqrt(d), the 2nd-order Taylor expansion of exp(s); outputs are normalised,
o_t = sum_s phi(q_t).phi(k_s) v_s / (sum_s phi(q_t).phi(k_s) + eps). The state holds
KV = sum_s phi(k_s) v_s^T and z = sum_s phi(k_s) with 1 + d + d^2 features, as in the original code.

Window branch: softmax attention with RoPE in which each query sees its last ``window`` keys
(itself included), head_dim 64.

``branches="both"`` (default) runs both branches in every layer on their own projections and sums
them through one output projection; ``"linear"`` / ``"window"`` keep one branch, so the paper's
alternating hybrid is a ``layer_mixers`` pattern (see docs/mixers/delta.md). ``impl="ref"``:
step-by-step linear attention and dense masked softmax in fp32; ``"chunked"``: chunked linear
attention (ops/linear_attn.py) and block-local window attention; ``"fast"`` (CUDA only): the linear
branch through fla's ``parallel_based`` (``kernels/fla.py``) when no state is passed (prefill and
decode keep the chunked form: the kernel has no state), the window branch as "chunked"; ``"auto"``
is "fast" on CUDA when fla imports, else "chunked" (docs/kernels.md).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from ..ops.linear_attn import taylor_features, taylor_linear_attn_chunked
from .base import LINEAR, WINDOWED, Mixer, MixerConfig, State
from .kit.rope import rope_qk


class BasedConfig(MixerConfig):
    name: Literal["based"] = "based"
    branches: Literal["both", "linear", "window"] = "both"
    feature_dim: int = Field(16, gt=0, description="q/k dim per linear-attention head before the feature map")
    n_heads: int = Field(16, gt=0, description="linear-attention heads (= key/value heads); value dim d_model / n_heads")
    window: int = Field(64, gt=0, description="each query attends to its last `window` keys, itself included")
    head_dim: int = Field(64, gt=0, description="window-attention head dim; heads = d_model // head_dim")
    rope_theta: float = Field(10000.0, gt=0)
    eps: float = Field(1e-12, gt=0)
    chunk_size: int = Field(64, gt=0)
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"

    @field_validator("head_dim")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError("must be even (RoPE rotates pairs of dimensions)")
        return v


def taylor_attn_recurrent(q, k, v, kv=None, z=None, eps: float = 1e-12):
    """Reference, one step at a time in fp32: returns normalised ``o`` and the new ``(kv, z)``.

    Written as o_t = v_t + sum_{s<t} w_ts (v_s - v_t) / sum_{s<=t} w_ts (w_ts = phi(q_t).phi(k_s)),
    which equals the normalised sum; leaving out the s = t term makes a lone key give exactly v_t.
    """
    qf, kf, v = taylor_features(q.float()), taylor_features(k.float()), v.float()
    B, H, T, Fd = qf.shape
    KV = qf.new_zeros(B, H, Fd, v.shape[-1]) if kv is None else kv.float()
    Z = qf.new_zeros(B, H, Fd) if z is None else z.float()
    outs = []
    for q_t, k_t, v_t in zip(qf.unbind(2), kf.unbind(2), v.unbind(2)):
        num = (q_t[..., None, :] @ KV).squeeze(-2) - (q_t * Z).sum(-1, keepdim=True) * v_t
        KV = KV + k_t[..., :, None] * v_t[..., None, :]
        Z = Z + k_t
        outs.append(v_t + num / ((q_t * Z).sum(-1, keepdim=True) + eps))
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1])
    return o, KV, Z


def window_attention_dense(q, k, v, window: int, k_prev=None, v_prev=None) -> torch.Tensor:
    """Reference: full masked softmax in fp32 over ``cat(prev, k)``; q ``[B, H, T, D]``."""
    if k_prev is not None:
        k, v = torch.cat([k_prev, k], dim=2), torch.cat([v_prev, v], dim=2)
    T, L = q.shape[2], k.shape[2]
    rel = torch.arange(L - T, L, device=q.device)[:, None] - torch.arange(L, device=q.device)[None, :]
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill((rel < 0) | (rel >= window), float("-inf"))
    return (torch.softmax(s, dim=-1) @ v.float()).to(v.dtype)


def window_attention_blocked(q, k, v, window: int, k_prev=None, v_prev=None) -> torch.Tensor:
    """Block-local form: query block n (``window`` queries) attends to key blocks n-1 and n.

    ``k_prev``/``v_prev`` hold up to ``window - 1`` keys that precede the first query.
    """
    B, H, T, D = q.shape
    W = window
    P = 0 if k_prev is None else k_prev.shape[2]
    pad = (-T) % W
    N = (T + pad) // W

    def keys(x, prev):
        parts = [x.new_zeros(B, H, W - P, D)] + ([prev] if P else []) + [x, x.new_zeros(B, H, pad, D)]
        blocks = torch.cat(parts, dim=2).view(B, H, N + 1, W, D)
        return torch.cat([blocks[:, :, :-1], blocks[:, :, 1:]], dim=3)  # [B, H, N, 2W, D]

    kb, vb = keys(k, k_prev), keys(v, v_prev)
    qb = torch.cat([q, q.new_zeros(B, H, pad, D)], dim=2).view(B, H, N, W, D)
    i = torch.arange(W, device=q.device)[:, None]
    j = torch.arange(2 * W, device=q.device)[None, :]
    in_window = (j > i) & (j <= i + W)  # key j of the 2W is at distance W + i - j from query i
    real = (torch.arange((N + 1) * W, device=q.device) >= W - P).view(N + 1, W)
    real = torch.cat([real[:-1], real[1:]], dim=-1)  # [N, 2W]; only the front padding is masked
    mask = in_window[None] & real[:, None, :]  # [N, W, 2W]
    o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)
    return o.reshape(B, H, N * W, D)[:, :, :T]


class Based(Mixer):
    config_class = BasedConfig
    cfg: BasedConfig
    impls = ("ref", "chunked")
    out_projections = ("o_proj",)
    match_field = None
    compiles = True
    test_variants = [
        {"n_heads": 4, "feature_dim": 4, "head_dim": 8, "window": 5},
        {"n_heads": 4, "feature_dim": 4, "branches": "linear"},
        {"head_dim": 8, "window": 7, "branches": "window"},
    ]
    fast_kernels = "fla"

    def __init__(self, d_model: int, cfg: BasedConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        self.use_linear = cfg.branches in ("both", "linear")
        self.use_window = cfg.branches in ("both", "window")
        inner = 0
        if self.use_linear:
            if d_model % cfg.n_heads:
                raise ValueError(f"based: d_model={d_model} must be divisible by n_heads={cfg.n_heads}")
            self.n_heads, self.feature_dim, self.value_dim = cfg.n_heads, cfg.feature_dim, d_model // cfg.n_heads
            self.n_features = 1 + cfg.feature_dim + cfg.feature_dim**2
            self.q_proj = nn.Linear(d_model, cfg.n_heads * cfg.feature_dim, bias=False)
            self.k_proj = nn.Linear(d_model, cfg.n_heads * cfg.feature_dim, bias=False)
            self.v_proj = nn.Linear(d_model, d_model, bias=False)
            inner += d_model
        if self.use_window:
            self.w_heads, self.w_dim = max(1, d_model // cfg.head_dim), cfg.head_dim
            self.wqkv_proj = nn.Linear(d_model, 3 * self.w_heads * self.w_dim, bias=False)
            inner += self.w_heads * self.w_dim
        self.o_proj = nn.Linear(inner, d_model, bias=False)

    # ---- branches ----------------------------------------------------------------------------
    def _linear(self, x, state, new_state, impl):
        B, T, _ = x.shape
        H, Fd, V = self.n_heads, self.feature_dim, self.value_dim
        q = self.q_proj(x).view(B, T, H, Fd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, H, Fd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, H, V).transpose(1, 2)
        kv0, z0 = (None, None) if state is None else (state["kv"], state["z"])
        if impl == "ref":
            o, kv, z = taylor_attn_recurrent(q, k, v, kv0, z0, self.cfg.eps)
        elif impl == "fast" and state is None:
            from ..kernels.fla import based_linear

            o = based_linear(q, k, v)
        else:
            v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # last column -> normaliser
            S0 = None if kv0 is None or z0 is None else torch.cat([kv0, z0[..., None]], dim=-1)
            o, S = taylor_linear_attn_chunked(q, k, v1, self.cfg.chunk_size, S0)
            o, kv, z = o[..., :V] / (o[..., V:] + self.cfg.eps), S[..., :V], S[..., V]
        if state is not None:
            new_state["kv"], new_state["z"] = kv, z
        return o.transpose(1, 2).reshape(B, T, H * V).to(x.dtype)

    def _window(self, x, state, new_state):
        B, T, _ = x.shape
        H, D, W = self.w_heads, self.w_dim, self.cfg.window
        q, k, v = self.wqkv_proj(x).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # 3 x [B, H, T, D]
        offset = 0 if state is None else int(state["pos"])
        q, k = rope_qk(q, k, offset, self.cfg.rope_theta)
        k_prev, v_prev = (None, None) if state is None else (state["k"], state["v"])
        attend = window_attention_dense if self.cfg.impl == "ref" else window_attention_blocked
        o = attend(q, k, v, W, k_prev, v_prev)
        if state is not None:
            k_all = k if k_prev is None else torch.cat([k_prev, k], dim=2)
            v_all = v if v_prev is None else torch.cat([v_prev, v], dim=2)
            keep = min(W - 1, k_all.shape[2])  # the next query sees itself plus W - 1 older keys
            new_state["k"], new_state["v"] = k_all[:, :, k_all.shape[2] - keep :], v_all[:, :, v_all.shape[2] - keep :]
        return o.transpose(1, 2).reshape(B, T, H * D)

    # ---- contract ----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, state: State | None = None):
        new_state: dict = {}
        parts = []
        impl = self.resolve_impl(x)
        if self.use_linear:
            parts.append(self._linear(x, state, new_state, impl))
        if self.use_window:
            parts.append(self._window(x, state, new_state))
        y = self.o_proj(torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0])
        if state is None:
            return y, None
        new_state["pos"] = int(state["pos"]) + x.shape[1]
        return y, new_state

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        state: State = {"pos": 0}
        if self.use_linear:
            state["kv"] = torch.zeros(batch, self.n_heads, self.n_features, self.value_dim, device=device)
            state["z"] = torch.zeros(batch, self.n_heads, self.n_features, device=device)
        if self.use_window:
            state["k"] = torch.zeros(batch, self.w_heads, 0, self.w_dim, device=device, dtype=dtype)
            state["v"] = torch.zeros(batch, self.w_heads, 0, self.w_dim, device=device, dtype=dtype)
        return state

    def state_size(self, seq_len: int) -> int:
        size = 0
        if self.use_linear:
            size += self.n_heads * self.n_features * (self.value_dim + 1) * 4
        if self.use_window:
            size += 2 * self.w_heads * self.w_dim * min(seq_len, self.cfg.window - 1) * 4
        return size

    def flops_per_token(self, seq_len: int) -> float:
        flops = 0.0
        if self.use_linear:
            # chunked: intra-chunk kernel scores and mixing (C keys), KV build and read (F x (V+1))
            C, Fd, V = min(self.cfg.chunk_size, max(seq_len, 1)), self.feature_dim, self.value_dim + 1
            flops += 2.0 * self.n_heads * (C * (Fd + V) + 2 * self.n_features * V)
        if self.use_window:
            # block-local form scores 2W keys per query (half of them masked)
            flops += 4.0 * self.w_heads * self.w_dim * 2 * self.cfg.window
        return flops

    def cost(self, seq_len: int) -> str:
        cost = super().cost(seq_len)
        return WINDOWED if cost == LINEAR and self.cfg.window else cost
