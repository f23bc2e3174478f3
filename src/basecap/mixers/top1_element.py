"""Top-1 Element selection attention (Lu et al. 2025, "How Does Sequence Modeling Architecture
Influence Base Capabilities of Pre-trained Language Models?", arXiv 2505.18522, section 5).

Each query outputs the value at its single highest-scoring visible position,
``o_t = v_{argmax_{i <= t} s_ti}`` with ``s_ti = q_t . k_i / (sqrt(D) * temperature)``; ties go to
the lowest index. The argmax has no gradient, so training uses an estimator (``estimator``):
``straight_through`` (default): weights ``y = onehot(argmax) + p - stopgrad(p)``, ``p = softmax(s)``,
i.e. soft-attention gradients for q and k; ``prob_ratio``: ``o_t = (p_i* / stopgrad(p_i*)) v_i*``.
Projections, heads (head_dim 64) and RoPE as in Transformer++ (the ``attention`` mixer).

``impl="ref"``: dense T x T fp32 scores (the oracle, ``ops/top1/naive.py``). ``"chunked"``: blockwise over query blocks of
``chunk_size`` rows with a hand-written backward (memory O(chunk_size * T)). ``"fast"``: the same
on CUDA with larger blocks (``basecap.kernels.top1_cuda``). See docs/top1.md.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from ..ops.top1 import append_time, element_ref, top1_element
from .attention import apply_rope, rope_tables
from .base import Impl, Mixer, MixerConfig, State

log = logging.getLogger(__name__)


class SelectionConfig(MixerConfig):
    """Fields shared by the Top-1 mixers (projections and scores as in Transformer++)."""

    name: str
    head_dim: int = Field(64, gt=0)
    n_heads: int | None = Field(None, gt=0, description="default: d_model // head_dim")
    position: Literal["rope", "none"] = "rope"
    rope_theta: float = Field(10000.0, gt=0)
    temperature: float = Field(1.0, gt=0, description="scores are divided by it (selection and softmax)")
    impl: Impl = "auto"
    chunk_size: int = Field(64, gt=0, description="query rows per block/tile of the chunked and fast forms; results do not depend on it")


class Top1ElementConfig(SelectionConfig):
    name: Literal["top1_element"] = "top1_element"
    estimator: Literal["straight_through", "prob_ratio"] = "straight_through"


class SelectionMixer(Mixer):
    """Shared machinery of the Top-1 mixers: q/k/v/o projections, RoPE, KV cache, impl choice."""

    def __init__(self, d_model: int, cfg: SelectionConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        self.n_heads = cfg.n_heads or max(1, d_model // cfg.head_dim)
        self.head_dim = cfg.head_dim
        inner = self.n_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=False)
        self.k_proj = nn.Linear(d_model, inner, bias=False)
        self.v_proj = nn.Linear(d_model, inner, bias=False)
        self.o_proj = nn.Linear(inner, d_model, bias=False)
        self._logged_impl = None

    @property
    def scale(self) -> float:
        return 1.0 / (math.sqrt(self.head_dim) * self.cfg.temperature)

    def _qkv(self, x: torch.Tensor, offset: int):
        B, T, _ = x.shape
        shape = (B, T, self.n_heads, self.head_dim)
        q, k, v = (p(x).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))  # [B, H, T, D]
        if self.cfg.position == "rope":
            cos, sin = rope_tables(torch.arange(offset, offset + T, device=x.device), self.head_dim, self.cfg.rope_theta)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k.contiguous(), v.contiguous()  # k, v: [B, H, T, D] blocks for the cache and chunk gathers

    def _impl(self, x: torch.Tensor) -> str:
        impl = self.cfg.impl
        if impl == "auto":
            impl = "fast" if x.is_cuda else "chunked"
        if impl == "fast" and not x.is_cuda:
            raise ValueError(f"{self.cfg.name}: impl='fast' is the CUDA path; use 'chunked' or 'auto' on {x.device}")
        if impl != self._logged_impl:
            log.info("%s layer %d: impl=%s", self.cfg.name, self.layer_idx, impl)
            self._logged_impl = impl
        return impl

    def _block(self, impl: str, rows: int) -> int:
        """Query rows per block of the quadratic loops: ``rows`` on CPU, at least FAST_BLOCK on CUDA."""
        if impl == "fast":
            from ..kernels.top1_cuda import FAST_BLOCK

            return max(rows, FAST_BLOCK)
        return rows

    def forward(self, x: torch.Tensor, state: State | None = None):
        B, T, _ = x.shape
        offset = 0 if state is None else int(state["pos"])
        q, k, v = self._qkv(x, offset)
        new_state = None
        if state is not None:
            new_state = {"k": append_time(state["k"], k), "v": append_time(state["v"], v), "pos": offset + T}
            k, v = new_state["k"], new_state["v"]
        q_pos = torch.arange(offset, offset + T, device=x.device)
        o = self._mix(q, k, v, q_pos, self._impl(x), state, new_state)
        y = o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y), new_state

    def _mix(self, q, k, v, q_pos, impl, state, new_state) -> torch.Tensor:
        raise NotImplementedError

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        empty = torch.zeros(batch, self.n_heads, 0, self.head_dim, device=device, dtype=dtype)
        return {"k": empty, "v": empty.clone(), "pos": 0}

    def state_size(self, seq_len: int) -> int:
        return 2 * self.n_heads * self.head_dim * seq_len * 4


class Top1Element(SelectionMixer):
    config_class = Top1ElementConfig
    impls = ("ref", "chunked")
    test_variants = [
        {"head_dim": 8},
        {"head_dim": 8, "estimator": "prob_ratio"},
        {"head_dim": 8, "position": "none", "temperature": 0.5},
    ]

    def _mix(self, q, k, v, q_pos, impl, state, new_state):
        if impl == "ref":
            return element_ref(q, k, v, q_pos, self.scale, self.cfg.estimator)
        return top1_element(q, k, v, q_pos, self.scale, self._block(impl, self.cfg.chunk_size), self.cfg.estimator)

    def flops_per_token(self, seq_len: int) -> float:
        # scores q.k over the (T+1)/2 visible keys on average; the output is a gather
        return 2 * self.n_heads * self.head_dim * (seq_len + 1) / 2
