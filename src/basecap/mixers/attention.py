"""Softmax attention: Transformer (Vaswani et al. 2017) and Transformer++ (Touvron et al. 2023).

Switches (paper section 4 ablations): position encoding ``none | absolute | rope | alibi``
(ALiBi: Press et al. 2022), sliding ``window`` (0 = full causal), score source ``qk`` or
``random_constant`` (Synthesizer-random, Tay et al. 2021: a trainable input-independent T x T
score table per head), and a softmax ``temperature`` (scores are divided by it).

``impl = "ref"`` builds the full score matrix in fp32 (the oracle); ``"fast"``/``"chunked"``/
``"auto"`` use ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from .base import LINEAR, WINDOWED, Mixer, MixerConfig, State
from .kit.heads import empty_kv, merge_heads, n_heads_for, qkvo_projections, split_heads
from .kit.rope import rope_qk


class AttentionConfig(MixerConfig):
    name: Literal["attention"] = "attention"
    head_dim: int = Field(64, gt=0)
    n_heads: int | None = Field(None, gt=0, description="default: d_model // head_dim")
    position: Literal["none", "absolute", "rope", "alibi"] = "rope"
    rope_theta: float = Field(10000.0, gt=0)
    window: int = Field(0, ge=0, description="0 = full causal attention; W > 0 = each query sees its last W keys")
    score: Literal["qk", "random_constant"] = "qk"
    temperature: float = Field(1.0, gt=0)
    impl: Literal["ref", "fast", "auto"] = "auto"

    @model_validator(mode="after")
    def _check(self):
        if self.score == "random_constant" and self.position in ("rope", "alibi"):
            raise ValueError("score='random_constant' ignores q.k, so position must be 'none' or 'absolute'")
        return self

    def wants_absolute_positions(self) -> bool:
        return self.position == "absolute"


def alibi_slopes(n_heads: int) -> torch.Tensor:
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        s = pow2(n_heads)
    else:
        m = 2 ** math.floor(math.log2(n_heads))
        s = pow2(m) + pow2(2 * m)[0::2][: n_heads - m]
    return torch.tensor(s, dtype=torch.float32)


class Attention(Mixer):
    config_class = AttentionConfig
    cfg: AttentionConfig
    slopes: torch.Tensor  # ALiBi's buffer (position "alibi" only)
    impls = ("ref", "fast")
    out_projections = ("o_proj",)
    match_field = None
    compiles = True
    test_variants = [
        {"head_dim": 8, **switches}
        for switches in (
            {},
            {"position": "absolute"},
            {"position": "none", "temperature": 0.5},
            {"position": "alibi"},
            {"window": 5},
            {"window": 7, "position": "alibi"},
            {"position": "none", "score": "random_constant"},
        )
    ]

    def __init__(self, d_model: int, cfg: AttentionConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        self.n_heads = n_heads_for(d_model, cfg.head_dim, cfg.n_heads)
        self.head_dim = cfg.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = qkvo_projections(d_model, self.n_heads, self.head_dim)
        if cfg.score == "random_constant":
            self.score_table = nn.Parameter(torch.randn(self.n_heads, max_seq_len, max_seq_len) * 0.02)
        if cfg.position == "alibi":
            self.register_buffer("slopes", alibi_slopes(self.n_heads), persistent=False)

    # ---- helpers -------------------------------------------------------------------------
    def _qkv(self, x: torch.Tensor, offset: int):
        q, k, v = split_heads(x, (self.q_proj, self.k_proj, self.v_proj), self.n_heads, self.head_dim)  # [B, H, T, D]
        if self.cfg.position == "rope":
            q, k = rope_qk(q, k, offset, self.cfg.rope_theta)
        return q, k, v

    def _bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Additive score bias [H or 1, Tq, Tk] (causal or window mask, ALiBi)."""
        cfg = self.cfg
        rel = q_pos[:, None] - k_pos[None, :]  # [Tq, Tk]
        visible = rel >= 0
        if cfg.window:
            visible = visible & (rel < cfg.window)
        bias = torch.zeros(rel.shape, device=q_pos.device).masked_fill(~visible, float("-inf"))[None]
        if cfg.position == "alibi":
            bias = bias - self.slopes[:, None, None] * rel.clamp(min=0)[None].float() / cfg.temperature
        return bias

    def _attend(self, q, k, v, q_pos, k_pos) -> torch.Tensor:
        cfg = self.cfg
        scale = 1.0 / (math.sqrt(self.head_dim) * cfg.temperature)
        if cfg.score == "random_constant":
            if int(q_pos[-1]) >= self.max_seq_len:
                raise ValueError(f"random_constant scores are defined up to max_seq_len={self.max_seq_len}")
            s = self.score_table[:, q_pos][:, :, k_pos] / cfg.temperature  # [H, Tq, Tk]
            s = s[None] + self._bias(q_pos, k_pos)
            return torch.softmax(s.float(), dim=-1).to(v.dtype) @ v
        plain_causal = cfg.position != "alibi" and not cfg.window and q.shape[2] == k.shape[2]
        if cfg.impl == "ref":
            s = (q.float() @ k.float().transpose(-1, -2)) * scale + self._bias(q_pos, k_pos)
            return (torch.softmax(s, dim=-1) @ v.float()).to(v.dtype)
        if plain_causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        if cfg.window and q.shape[2] >= 2 * cfg.window:
            return self._attend_blocked(q, k, v, scale)
        # a 4-D mask [1, H or 1, Tq, Tk]: PyTorch's fused CPU kernel takes 2-D or 4-D masks only, and a 3-D one falls back
        # to the unfused math path (LOG.md, round 13: ALiBi's whole 1k-context runs took 2-2.6x as long with it)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self._bias(q_pos, k_pos)[None].to(q.dtype), scale=scale)

    def _attend_blocked(self, q, k, v, scale: float) -> torch.Tensor:
        """Sliding-window attention in O(T W): queries in blocks of W, each block against its own
        2W - 1 keys (the block and the W - 1 before it), instead of a T x T masked score matrix.

        The queries are the last Tq of the Tk keys (a cache prefix may precede them). Within every
        block, query i sees window keys i .. i + W - 1, so one [W, 2W - 1] mask (and ALiBi bias) serves
        all blocks; keys before position 0 are zero padding, masked in the first block.
        """
        cfg, W = self.cfg, self.cfg.window
        B, H, Tq, D = q.shape
        Tk = k.shape[2]
        n = -(-Tq // W)
        L = 2 * W - 1
        have = min(Tk, Tq + W - 1)  # keys any query can see: the last Tq + W - 1
        lead = Tq + W - 1 - have  # zero keys in front (no cache, or a short one)
        tail = n * W - Tq  # zero queries and keys behind, to fill the last block

        def pad(x, front, back):
            return F.pad(x, (0, 0, front, back))

        kb = pad(k[:, :, Tk - have :], lead, tail).unfold(2, L, W).transpose(-1, -2)  # [B, H, n, L, D]
        vb = pad(v[:, :, Tk - have :], lead, tail).unfold(2, L, W).transpose(-1, -2)
        qb = pad(q, 0, tail).view(B, H, n, W, D)
        i = torch.arange(W, device=q.device)[:, None]
        j = torch.arange(L, device=q.device)[None, :]
        rel = i + W - 1 - j  # query position minus key position
        visible = (rel >= 0) & (rel < W)
        visible = visible & (torch.arange(n, device=q.device)[:, None, None] * W + j >= lead)  # [n, W, L]
        bias = torch.zeros(visible.shape, device=q.device).masked_fill(~visible, float("-inf"))
        if cfg.position == "alibi":
            bias = bias[None] - self.slopes[:, None, None, None] * rel.clamp(min=0).float() / cfg.temperature  # [H, n, W, L]
        y = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=bias.to(q.dtype), scale=scale)
        return y.reshape(B, H, n * W, D)[:, :, :Tq]

    # ---- contract --------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, state: State | None = None):
        T = x.shape[1]
        offset = 0 if state is None else int(state["pos"])
        q, k, v = self._qkv(x, offset)
        new_state = None
        if state is not None:
            k_all = torch.cat([cast(torch.Tensor, state["k"]), k], dim=2)
            v_all = torch.cat([cast(torch.Tensor, state["v"]), v], dim=2)
            start = int(state["start"])  # absolute position of the first cached key
        else:
            k_all, v_all, start = k, v, 0
        q_pos = torch.arange(offset, offset + T, device=x.device)
        k_pos = torch.arange(start, start + k_all.shape[2], device=x.device)
        y = self._attend(q, k_all, v_all, q_pos, k_pos)
        if state is not None:
            if self.cfg.window and k_all.shape[2] > self.cfg.window:
                drop = k_all.shape[2] - self.cfg.window
                k_all, v_all, start = k_all[:, :, drop:], v_all[:, :, drop:], start + drop
            new_state = {"k": k_all, "v": v_all, "pos": offset + T, "start": start}
        return self.o_proj(merge_heads(y)), new_state

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        k, v = empty_kv(batch, self.n_heads, self.head_dim, device, dtype)
        return {"k": k, "v": v, "pos": 0, "start": 0}

    def state_size(self, seq_len: int) -> int:
        kept = min(seq_len, self.cfg.window) if self.cfg.window else seq_len
        return 2 * self.n_heads * self.head_dim * kept * 4

    def flops_per_token(self, seq_len: int) -> float:
        # q.k and p.v: 2 matmuls x 2 flops x H*D per visible key; a causal query sees (T+1)/2 keys on average
        avg_ctx = (seq_len + 1) / 2 if not self.cfg.window else min(self.cfg.window, (seq_len + 1) / 2)
        return 4 * self.n_heads * self.head_dim * avg_ctx

    def cost(self, seq_len: int) -> str:
        cost = super().cost(seq_len)
        return WINDOWED if cost == LINEAR and self.cfg.window else cost

    def chunk_size(self) -> int | None:
        # a window makes the KV cache a constant-size state, which the plan counts once per 64 tokens of training
        # (docs/scaling.md's default chunk, kept so that plans do not move); full attention keeps none
        return 64 if self.cfg.window else None
