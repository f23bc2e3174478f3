"""Kimi Delta Attention, KDA (Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention
Architecture", arXiv 2510.26692).

A gated delta rule whose forget gate is per key channel: Gated DeltaNet's scalar alpha_t per head
becomes a vector alpha_t in (0, 1)^K. Per head: q, k, v through causal short convolutions + SiLU,
q and k L2-normalised, beta_t = sigmoid(w_beta . x_t), the log decay

    g_t = log alpha_t = -exp(A_log) * softplus(W_f_b W_f_a x_t + dt_bias)    [K], low-rank W_f

and, with the state S stored key x value,

    S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T     o_t = S_t^T q_t / sqrt(K)

then a sigmoid-gated RMSNorm, RMSNorm(o_t) * sigmoid(W_g_b W_g_a x_t) (low-rank gate), and the
output projection. Defaults follow the paper and fla's KimiDeltaAttention layer: value dim = key dim,
low-rank gate and decay projections of rank = the value head dim, short conv size 4, A ~ U(1, 16)
per head, dt ~ logU(1e-3, 0.1) per channel; head_dim 64 as basecap's other mixers (the paper: 128).

``impl="ref"`` runs the step-by-step recurrence (:func:`kda_recurrent`), ``"chunked"`` the chunked
UT-transform form (:func:`kda_chunked`), ``"fast"`` (CUDA only) fla's ``chunk_kda`` through
``kernels/fla.py``; ``"auto"`` is "fast" on CUDA when fla imports, else "chunked" (docs/kernels.md).
Derivation of the chunked form: docs/mixers/kda.md.
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..ops.delta_rule import l2_normalize
from ..ops.norm import RMSNorm
from ..ops.short_conv import ShortConv
from .base import Mixer, MixerConfig, State
from .kit.delta import DeltaRuleState, delta_flops
from .kit.heads import n_heads_for
from .kit.recurrent import check_ranges, conv_or_silu, init_A_log, init_dt_bias, keep_init


def kda_recurrent(q, k, v, beta, g, scale: float | None = None, state=None):
    """Step-by-step recurrence in fp32 (the oracle): q, k, g ``[B, H, T, K]``, v ``[B, H, T, V]``, beta
    ``[B, H, T]``, state ``[B, H, K, V]``. Returns ``(o [B, H, T, V], S [B, H, K, V])``."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    q, k, v, beta, alpha = q.float() * scale, k.float(), v.float(), beta.float(), g.float().exp()
    S = q.new_zeros(B, H, K, V) if state is None else state.float()
    outs = []
    for q_t, k_t, v_t, b_t, a_t in zip(q.unbind(2), k.unbind(2), v.unbind(2), beta.unbind(2), alpha.unbind(2)):
        S = a_t[..., :, None] * S  # Diag(alpha_t) S: key channel d keeps alpha_t[d] of its row
        pred = (k_t[..., None, :] @ S).squeeze(-2)  # what the memory returns for k_t, [B, H, V]
        S = S + k_t[..., :, None] * (b_t[..., None] * (v_t - pred))[..., None, :]
        outs.append((q_t[..., None, :] @ S).squeeze(-2))
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, V).float()
    return o, S


def sub_block(C: int) -> int:
    """The sub-block of :func:`decayed_scores` for chunks of C steps: the power of two nearest below sqrt(C),
    which balances its two costs, ~C c K (pairwise inside sub-blocks) and ~C (C / c) K (the references)."""
    return 1 << (max(C, 1).bit_length() - 1) // 2


def decayed_scores(a: torch.Tensor, b: torch.Tensor, G: torch.Tensor, sub: int) -> torch.Tensor:
    """``[..., C, C, R]`` with ``[t, s, r] = sum_d a[t, d, r] b[s, d] exp(G[t, d] - G[s, d])`` for s <= t, zero
    above; ``a [..., C, K, R]`` holds R left operands side by side (they share the decay weights), b and G
    ``[..., C, K]``, G non-increasing along C (a cumulative log decay).

    Every exponent taken is <= 0: inside a sub-block of ``sub`` steps the per-channel differences are
    formed pair by pair (masked before ``exp``); for a query sub-block i and the keys before it, the
    decay is split at r = the last step before block i, exp(G_t - G_r) exp(G_r - G_s), both <= 1, and
    the block is one matrix product."""
    C, K, R = a.shape[-3:]
    c = min(sub, C)
    pad = (-C) % c
    if pad:  # zero rows; G carries its last value, so it stays non-increasing
        a, b = F.pad(a, (0, 0, 0, 0, 0, pad)), F.pad(b, (0, 0, 0, pad))
        G = torch.cat([G, G[..., -1:, :].expand(*G.shape[:-2], pad, K)], dim=-2)
    n, Cp = (C + pad) // c, C + pad
    a_, b_, G_ = a.unflatten(-3, (n, c)), b.unflatten(-2, (n, c)), G.unflatten(-2, (n, c))  # [..., n, c, K(, R)]
    keep = torch.ones(c, c, dtype=torch.bool, device=a.device).tril()
    E = (G_[..., :, None, :] - G_[..., None, :, :]).masked_fill(~keep[..., None], float("-inf")).exp()  # [..., n, c, c, K]
    diag = (E * b_[..., None, :, :]) @ a_  # [..., n, c, c, R]
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    out = (diag[..., :, :, None, :, :] * eye[:, None, :, None, None]).reshape(*diag.shape[:-4], n, c, Cp, R)  # block diagonal
    if n > 1:
        G_ref = G_[..., :-1, -1:, :]  # [..., n-1, 1, K]: the log decay at the end of block i-1, for query block i
        a_off = a_[..., 1:, :, :, :] * (G_[..., 1:, :, :] - G_ref).exp()[..., None]  # [..., n-1, c, K, R]
        before = torch.arange(Cp, device=a.device) < torch.arange(1, n, device=a.device)[:, None] * c  # [n-1, Cp]
        e = (G_ref - G[..., None, :, :]).masked_fill(~before[..., None], float("-inf")).exp()  # [..., n-1, Cp, K]
        off = torch.einsum("...tkr,...sk->...tsr", a_off, b[..., None, :, :] * e)  # [..., n-1, c, Cp, R]
        out = out + torch.cat([torch.zeros_like(off[..., :1, :, :, :]), off], dim=-4)
    return out.reshape(*out.shape[:-4], Cp, Cp, R)[..., :C, :C, :]


def kda_chunked(q, k, v, beta, g, scale: float | None = None, state=None, chunk_size: int = 16):
    """Chunked (UT transform) KDA; same contract as :func:`kda_recurrent`, computed in fp32 (or wider).

    Padded steps have k = v = beta = g = 0, so they leave the state unchanged."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    dtype = torch.promote_types(q.dtype, torch.float32)
    scale = K**-0.5 if scale is None else scale
    C = max(1, min(chunk_size, T))
    pad = (-T) % C
    N = (T + pad) // C
    q = F.pad(q.to(dtype) * scale, (0, 0, 0, pad)).view(B, H, N, C, K)
    k = F.pad(k.to(dtype), (0, 0, 0, pad)).view(B, H, N, C, K)
    v = F.pad(v.to(dtype), (0, 0, 0, pad)).view(B, H, N, C, V)
    beta = F.pad(beta.to(dtype), (0, pad)).view(B, H, N, C, 1)
    G = F.pad(g.to(dtype), (0, 0, 0, pad)).view(B, H, N, C, K).cumsum(-2)  # log decay from the chunk start through t

    # u = (I + A)^{-1} diag(beta) (v - (k * gamma) S0),  A[t, s] = beta_t sum_d k_t k_s exp(G_t - G_s), s < t,
    # and the intra-chunk scores P[t, s] = sum_d q_t k_s exp(G_t - G_s), s <= t: one call, shared decay weights
    kk, P = decayed_scores(torch.stack([k, q], dim=-1), k, G, sub_block(C)).unbind(-1)
    L = beta * kk.tril(-1) + torch.eye(C, dtype=dtype, device=q.device)
    T_ut = torch.linalg.solve_triangular(L, torch.diag_embed(beta.squeeze(-1)), upper=False, unitriangular=True)
    gam = G.exp()  # per-channel decay from the chunk start through t
    u_free, w = T_ut @ v, T_ut @ (k * gam)  # u = u_free - w @ S0
    q_s = q * gam  # reads the chunk-start state
    k_to_end = (k * (G[..., -1:, :] - G).exp()).transpose(-1, -2)  # k_s decayed from s to the chunk end, [B,H,N,K,C]
    chunk_decay = G[..., -1, :].exp()[..., None]  # [B, H, N, K, 1]

    S = q.new_zeros(B, H, K, V) if state is None else state.to(dtype)
    outs = []
    per_chunk = zip(u_free.unbind(2), w.unbind(2), q_s.unbind(2), P.unbind(2), k_to_end.unbind(2), chunk_decay.unbind(2))
    for u_n, w_n, q_n, P_n, kT_n, dec_n in per_chunk:
        u = u_n - w_n @ S  # [B, H, C, V]
        outs.append(q_n @ S + P_n @ u)
        S = S * dec_n + kT_n @ u
    o = torch.stack(outs, dim=2).reshape(B, H, N * C, V)[:, :, :T]
    return o, S


def run_kda(impl: str, q, k, v, beta, g, state: State | None, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``o [B, H, T, V]`` and the final state in the form ``impl`` ("ref", "fast" or "chunked"), continuing
    from ``state["S"]`` when a decode state is given."""
    S0 = None if state is None else cast(torch.Tensor, state["S"])
    if impl == "ref":
        return kda_recurrent(q, k, v, beta, g, state=S0)
    if impl == "fast":
        from ..kernels.fla import kda

        return kda(q, k, v, beta, g, state=S0)
    return kda_chunked(q, k, v, beta, g, state=S0, chunk_size=chunk_size)


class KDAConfig(MixerConfig):
    name: Literal["kda"] = "kda"
    head_dim: int = Field(64, gt=0, description="key dim per head")
    n_heads: int | None = Field(None, gt=0, description="default: d_model // head_dim")
    expand_v: float = Field(1.0, gt=0, description="value dim per head = expand_v * head_dim")
    gate_rank: int | None = Field(None, gt=0, description="rank of the decay and output-gate projections; default the value dim per head")
    short_conv: bool = True
    conv_size: int = Field(4, ge=1)
    chunk_size: int = Field(16, gt=0, description="chunk of the chunked CPU form (fla's kernel uses its own 64)")
    norm_eps: float = Field(1e-5, gt=0)
    dt_min: float = Field(1e-3, gt=0)
    dt_max: float = Field(0.1, gt=0)
    A_init_range: tuple[float, float] = (1.0, 16.0)
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"

    @model_validator(mode="after")
    def _check(self):
        if not 0 < self.A_init_range[0] <= self.A_init_range[1]:
            raise ValueError("A_init_range must satisfy 0 < low <= high")
        head_v = self.expand_v * self.head_dim
        if not math.isclose(head_v, round(head_v), abs_tol=1e-6):
            raise ValueError(f"expand_v: expand_v * head_dim must be a whole number, got {self.expand_v} * {self.head_dim} = {head_v}")
        return check_ranges(self, ("dt_min", "dt_max"))


class KDA(DeltaRuleState, Mixer):
    config_class = KDAConfig
    cfg: KDAConfig
    impls = ("ref", "chunked")
    test_variants = [
        {"head_dim": 8},
        {"head_dim": 8, "short_conv": False},
        {"head_dim": 8, "n_heads": 2, "expand_v": 1.5, "gate_rank": 4},
    ]
    fast_kernels = "fla"
    out_projections = ("o_proj",)
    match_field = None
    compiles = True

    def __init__(self, d_model: int, cfg: KDAConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        H = self.n_heads = n_heads_for(d_model, cfg.head_dim, cfg.n_heads)
        K = self.head_k = cfg.head_dim
        V = self.head_v = round(cfg.expand_v * K)
        R = cfg.gate_rank or V
        self.qkv_proj = nn.Linear(d_model, H * (2 * K + V), bias=False)
        # depthwise, so one conv over [q, k, v] = three separate ones
        self.conv = ShortConv(H * (2 * K + V), cfg.conv_size) if cfg.short_conv else None
        self.b_proj = nn.Linear(d_model, H, bias=False)  # beta
        self.f_a_proj = nn.Linear(d_model, R, bias=False)  # decay input, low rank: d_model -> R -> H K
        self.f_b_proj = nn.Linear(R, H * K, bias=False)
        self.A_log = nn.Parameter(init_A_log(H, *cfg.A_init_range))
        self.dt_bias = nn.Parameter(init_dt_bias(H * K, cfg.dt_min, cfg.dt_max))
        keep_init(self.A_log, self.dt_bias)
        self.g_a_proj = nn.Linear(d_model, R, bias=False)  # output gate, low rank: d_model -> R -> H V
        self.g_b_proj = nn.Linear(R, H * V, bias=False)
        self.o_norm = RMSNorm(V, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(H * V, d_model, bias=False)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """g_t = log alpha_t <= 0 per key channel, ``[B, H, T, K]`` in fp32."""
        B, T, _ = x.shape
        H, K = self.n_heads, self.head_k
        f = self.f_b_proj(self.f_a_proj(x)).float().view(B, T, H, K) + self.dt_bias.float().view(H, K)
        g = -self.A_log.float().exp()[:, None] * F.softplus(f)
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
        o, S = run_kda(self.resolve_impl(x), q, k, v, beta, self.log_decay(x), state, self.cfg.chunk_size)
        gate = self.g_b_proj(self.g_a_proj(x)).view(B, T, H, V)
        o = (self.o_norm(o.transpose(1, 2).to(x.dtype)) * torch.sigmoid(gate)).reshape(B, T, H * V)
        return self.o_proj(o), (None if state is None else {"S": S, **conv_state_new})

    def flops_per_token(self, seq_len: int) -> float:
        # the chunked delta rule (kit/delta.py; its k.k and q.k products are decayed_scores' matrix products),
        # plus the per-channel decay weights, one multiply each as Gated DeltaNet counts its own: pairwise
        # inside a sub-block and applied to k (2 c K), the references of the earlier sub-blocks (2 K each),
        # k and q to their block's reference (2 K), q, k and k to the chunk end (3 K)
        C = min(self.cfg.chunk_size, max(seq_len, 1))
        c = min(sub_block(C), C)
        H, K = self.n_heads, self.head_k
        return delta_flops(H, C, K, self.head_v) + 2.0 * H * (2 * c * K + 2 * math.ceil(C / c) * K + 5 * K)
