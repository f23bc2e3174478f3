"""The base of the Top-1 selection mixers (Lu et al. 2025, arXiv 2505.18522, section 5): config
fields, q/k/v/o projections with RoPE as in Transformer++, the KV cache, and the row blocks of the
CPU and CUDA forms. A subclass implements ``_mix``: q, k, v (cache included) -> per-head output."""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
from pydantic import Field

from ...ops.top1 import append_time
from ..base import Impl, Mixer, MixerConfig, State
from .heads import empty_kv, merge_heads, n_heads_for, qkvo_projections, split_heads
from .rope import rope_qk


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


class SelectionMixer(Mixer):
    """Projections, RoPE, KV cache and form choice of the Top-1 mixers."""

    fast_kernels = "top1_cuda"
    cfg: SelectionConfig

    def __init__(self, d_model: int, cfg: SelectionConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        self.n_heads = n_heads_for(d_model, cfg.head_dim, cfg.n_heads)
        self.head_dim = cfg.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = qkvo_projections(d_model, self.n_heads, self.head_dim)

    @property
    def scale(self) -> float:
        return 1.0 / (math.sqrt(self.head_dim) * self.cfg.temperature)

    def _qkv(self, x: torch.Tensor, offset: int):
        q, k, v = split_heads(x, (self.q_proj, self.k_proj, self.v_proj), self.n_heads, self.head_dim)  # [B, H, T, D]
        if self.cfg.position == "rope":
            q, k = rope_qk(q, k, offset, self.cfg.rope_theta)
        return q, k.contiguous(), v.contiguous()  # k, v: [B, H, T, D] blocks for the cache and chunk gathers

    def _block_rows(self, impl: str, rows: int) -> int:
        """Query rows per block of the quadratic loops: ``rows`` on CPU, at least FAST_BLOCK on CUDA."""
        if impl == "fast":
            from ...kernels.top1_cuda import FAST_BLOCK

            return max(rows, FAST_BLOCK)
        return rows

    def forward(self, x: torch.Tensor, state: State | None = None):
        offset = 0 if state is None else int(state["pos"])
        q_pos = torch.arange(offset, offset + x.shape[1], device=x.device)
        q, k, v = self._qkv(x, offset)
        new_state = None
        if state is not None:  # the cache grows without copying and without altering ``state``
            k_prev, v_prev = cast(torch.Tensor, state["k"]), cast(torch.Tensor, state["v"])
            new_state = {"k": append_time(k_prev, k), "v": append_time(v_prev, v), "pos": offset + x.shape[1]}
            k, v = new_state["k"], new_state["v"]
        o = self._mix(q, k, v, q_pos, self.resolve_impl(x), state, new_state)
        return self.o_proj(merge_heads(o)), new_state

    def _mix(self, q, k, v, q_pos, impl, state, new_state) -> torch.Tensor:
        raise NotImplementedError

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        k, v = empty_kv(batch, self.n_heads, self.head_dim, device, dtype)
        return {"k": k, "v": v, "pos": 0}

    def state_size(self, seq_len: int) -> int:
        return 2 * self.n_heads * self.head_dim * seq_len * 4
