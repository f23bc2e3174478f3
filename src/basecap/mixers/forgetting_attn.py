"""Forgetting Transformer, FoX (Lin, Nikishin, He & Courville, "Forgetting Transformer: Softmax Attention
with a Forget Gate", ICLR 2025): softmax attention over every past token whose logits carry a data-dependent
decay bias.

Per head h and token t a scalar forget gate f_t = sigmoid(w_f . x_t + b_f); query i attends key j <= i with

    logit_ij = q_i . k_j / sqrt(D) + sum_{l = j+1 .. i} log f_l,    o_i = sum_j softmax_j(logit_i) v_j

so the attention weight of a key is multiplied by the product of the gates since it (logit_ii has no decay).
Switches: ``position`` "none" (FoX's default: no position encoding) or "rope"; ``qk_norm_output_gate``: the
output gate and QK-norm of the paper's "Pro" block (its output norm and key/value shift are not included).

Decode state: the KV cache plus, per cached key, ``log_forget`` = sum of log f from just after that key to
the latest token; it grows with T like attention's cache. ``impl="ref"``: that recurrence, one token at a
time in fp32 (the oracle); ``"chunked"``: the parallel form, ``F.scaled_dot_product_attention`` with the
decay bias as a float mask, in fp32; ``"fast"`` (CUDA): fla's ``parallel_forgetting_attn`` when no state is
passed (the kernel takes no cache, so prefill and decode keep the chunked form); ``"auto"`` is "fast" on CUDA
when fla imports, else "chunked" (docs/kernels.md). Derivation: docs/mixers/forgetting_attn.md.
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from .base import Mixer, MixerConfig, State
from .kit.heads import empty_kv, merge_heads, n_heads_for, qkvo_projections, split_heads
from .kit.rope import rope_qk

QK_NORM_EPS = 1e-6  # the RMSNorm epsilon of the authors' QK-norm
# the masked form drops keys whose weights are provably below e^-40 of their row's total (far below fp32 rounding):
# their exp() results would be denormal floats, which made a CPU training step 1.4x as long (docs/mixers/forgetting_attn.md)
PRUNE_LOG_TOL = 40.0


class ForgettingAttnConfig(MixerConfig):
    name: Literal["forgetting_attn"] = "forgetting_attn"
    head_dim: int = Field(64, gt=0)
    n_heads: int | None = Field(None, gt=0, description="default: d_model // head_dim")
    position: Literal["none", "rope"] = Field("none", description="FoX needs no position encoding; 'rope' adds RoPE")
    rope_theta: float = Field(500000.0, gt=0, description="RoPE base of the authors' code (position='rope' only)")
    qk_norm_output_gate: bool = Field(False, description="the Pro block's QK-norm and sigmoid output gate")
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"


Cache = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # k, v [B, H, L, D]; log_forget [B, H, L]


def forgetting_attn_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_f: torch.Tensor, cache: Cache, scale: float
) -> tuple[torch.Tensor, Cache]:
    """The oracle, one token at a time in fp32: q, k, v ``[B, H, T, D]``, log_f ``[B, H, T]`` (log of the
    forget gates), ``cache`` (k, v, log_forget) of the L tokens before. Returns o ``[B, H, T, D]`` (fp32) and
    the cache of all L + T tokens. Each step first decays every cached key by the new gate, then appends the
    new key with no decay, then attends."""
    K, V, A = (c.float() for c in cache)
    outs = []
    for t in range(q.shape[2]):
        A = torch.cat([A + log_f[:, :, t, None].float(), A.new_zeros(A.shape[:2] + (1,))], dim=-1)  # [B, H, L + t + 1]
        K = torch.cat([K, k[:, :, t : t + 1].float()], dim=2)
        V = torch.cat([V, v[:, :, t : t + 1].float()], dim=2)
        s = (q[:, :, t : t + 1].float() @ K.transpose(-1, -2)) * scale + A[:, :, None, :]  # [B, H, 1, L + t + 1]
        outs.append(torch.softmax(s, dim=-1) @ V)
    return torch.cat(outs, dim=2), (K, V, A)


def forgetting_attn_masked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_f: torch.Tensor, cache: Cache | None, scale: float
) -> tuple[torch.Tensor, Cache | None]:
    """The parallel form: SDPA with the decay bias as a float mask ``[B, H, T, L + T]``, fp32 (autocast off:
    a 16-bit bias would round the decays). Same arguments and results as :func:`forgetting_attn_recurrent`;
    ``cache=None`` (training) returns no cache.

    With c_i = sum of the new log f up to new token i and p_j = -log_forget_j (cached key) or c_j (new key),
    logit bias_ij = c_i - p_j, zero on the diagonal; the new log_forget_j is c_last - p_j.

    Keys are dropped where bias_ij < -(2 U_i + log(L + T) + PRUNE_LOG_TOL), U_i = scale |q_i| max_j |k_j| bounding
    every |score| of row i: all of them together then carry less than e^-PRUNE_LOG_TOL of the row's weight."""
    T = q.shape[2]
    c = log_f.float().cumsum(-1)  # [B, H, T]
    if cache is None:
        p, K, V = c, k, v
    else:
        p = torch.cat([-cache[2].float(), c], dim=-1)  # [B, H, L + T]
        K, V = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    L = p.shape[-1] - T
    pos_k = torch.arange(L + T, device=q.device)
    visible = pos_k[None, :] <= L + torch.arange(T, device=q.device)[:, None]  # [T, L + T]
    bias = c[..., :, None] - p[..., None, :]  # [B, H, T, L + T]
    with torch.no_grad():
        U = scale * q.float().norm(dim=-1) * K.float().norm(dim=-1).amax(-1, keepdim=True)  # [B, H, T]
        floor = -(2 * U + math.log(L + T) + PRUNE_LOG_TOL)
        drop = ~visible | (bias < floor[..., None])
    bias = bias.masked_fill(drop, float("-inf"))
    with torch.autocast(q.device.type, enabled=False):
        o = F.scaled_dot_product_attention(q.float(), K.float(), V.float(), attn_mask=bias, scale=scale)
    return o, (None if cache is None else (K, V, c[..., -1:] - p))


class ForgettingAttn(Mixer):
    config_class = ForgettingAttnConfig
    cfg: ForgettingAttnConfig
    impls = ("ref", "chunked")
    fast_kernels = "fla"
    out_projections = ("o_proj",)  # g_proj (the output gate) gates o before o_proj, it writes nothing to the residual
    match_field = None
    compiles = True  # the masked form compiles with fullgraph=True (checked by hand, torch 2.13 on CPU)
    test_variants = [
        {"head_dim": 8, **switches}
        for switches in ({}, {"position": "rope"}, {"qk_norm_output_gate": True}, {"position": "rope", "qk_norm_output_gate": True})
    ]

    def __init__(self, d_model: int, cfg: ForgettingAttnConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        self.n_heads = n_heads_for(d_model, cfg.head_dim, cfg.n_heads)
        self.head_dim = cfg.head_dim
        H, D = self.n_heads, self.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = qkvo_projections(d_model, H, D)
        # the forget gate: one logit per head; the backbone's N(0, std) init sets the weight, and the bias starts at
        # zero as in the authors' code for the data-dependent gate (a parameter of its own: the backbone's Linears
        # have no biases)
        self.f_proj = nn.Linear(d_model, H, bias=False)
        self.f_bias = nn.Parameter(torch.zeros(H))
        if cfg.qk_norm_output_gate:
            # per-head RMSNorm gains, flat so that weight decay (two or more dims only) leaves them alone
            self.q_norm_weight = nn.Parameter(torch.ones(H * D))
            self.k_norm_weight = nn.Parameter(torch.ones(H * D))
            self.g_proj = nn.Linear(d_model, H * D, bias=False)

    def _qk_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm over each head's D dims with per-head gains: ``x [B, H, T, D]``."""
        return F.rms_norm(x, (self.head_dim,), eps=QK_NORM_EPS) * weight.view(self.n_heads, 1, self.head_dim).to(x.dtype)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """log f_t = logsigmoid(w_f . x_t + b_f) per head, ``[B, H, T]`` in fp32."""
        return F.logsigmoid(self.f_proj(x).float() + self.f_bias.float()).transpose(1, 2)

    def forward(self, x: torch.Tensor, state: State | None = None):
        cfg = self.cfg
        offset = 0 if state is None else int(state["pos"])
        q, k, v = split_heads(x, (self.q_proj, self.k_proj, self.v_proj), self.n_heads, self.head_dim)  # [B, H, T, D]
        if cfg.qk_norm_output_gate:
            q, k = self._qk_norm(q, self.q_norm_weight), self._qk_norm(k, self.k_norm_weight)
        if cfg.position == "rope":
            q, k = rope_qk(q, k, offset, cfg.rope_theta)
        log_f = self.log_decay(x)
        scale = self.head_dim**-0.5
        cache = None if state is None else cast(Cache, (state["k"], state["v"], state["log_forget"]))
        impl = self.resolve_impl(x)
        new_cache: Cache | None
        if impl == "ref":
            o, new_cache = forgetting_attn_recurrent(q, k, v, log_f, cache or self._empty(x), scale)
        elif impl == "fast" and cache is None:
            from ..kernels.fla import forgetting_attn

            o, new_cache = forgetting_attn(q, k, v, log_f, scale), None
        else:
            o, new_cache = forgetting_attn_masked(q, k, v, log_f, cache, scale)
        y = merge_heads(o.to(v.dtype))
        if cfg.qk_norm_output_gate:
            y = torch.sigmoid(self.g_proj(x)) * y
        new_state = None
        if state is not None:
            assert new_cache is not None
            K, V, A = new_cache
            new_state = {"k": K.to(v.dtype), "v": V.to(v.dtype), "log_forget": A, "pos": offset + x.shape[1]}
        return self.o_proj(y), new_state

    def _empty(self, x: torch.Tensor) -> Cache:
        k, v = empty_kv(x.shape[0], self.n_heads, self.head_dim, x.device, torch.float32)
        return k, v, k.new_zeros(x.shape[0], self.n_heads, 0)

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        k, v = empty_kv(batch, self.n_heads, self.head_dim, device, dtype)
        return {"k": k, "v": v, "log_forget": torch.zeros(batch, self.n_heads, 0, device=device), "pos": 0}

    def state_size(self, seq_len: int) -> int:
        # per cached token and head: a key and a value of D floats and one log_forget float
        return (2 * self.head_dim + 1) * self.n_heads * seq_len * 4

    def flops_per_token(self, seq_len: int) -> float:
        # q.k and p.v (2 matmuls x 2 flops x H*D) plus the decay bias (one add per score) per visible key, a
        # causal query seeing (T+1)/2 keys on average; the Pro extras add QK-norm (4 flops per element of q
        # and k) and the output gate (sigmoid and product) per token
        avg_ctx = (seq_len + 1) / 2
        H, D = self.n_heads, self.head_dim
        extras = 10 * H * D if self.cfg.qk_norm_output_gate else 0
        return (4 * H * D + H) * avg_ctx + extras
