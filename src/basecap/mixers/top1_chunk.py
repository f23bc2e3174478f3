"""Top-1 Chunk selection attention, Exact and Approx (Lu et al. 2025, "How Does Sequence Modeling
Architecture Influence Base Capabilities of Pre-trained Language Models?", arXiv 2505.18522, sec. 5).

Positions are split into chunks of ``chunk_len`` (C, paper: 128). Each query selects one chunk and
runs causal softmax attention inside it.
- ``selection="exact"``: the chunk with the largest attention mass under full softmax,
  ``l_tj = logsumexp_{i in j, i <= t} s_ti``, ``j* = argmax_j l_tj`` (quadratic to select).
- ``selection="approx"``: first-order approximation, ``a_tj = q_t . kbar_tj + log n_tj`` with kbar the
  mean of the n_tj visible keys of chunk j (n = C except in the query's own, partial chunk).
Switches (our choices where the paper is silent): ``own_chunk`` = ``candidate`` (the own chunk is one of
the candidates, default) or ``always`` (attended in addition to a chunk selected among the earlier
ones); ``selector_grad`` = ``straight_through`` (the output is multiplied by P_j*/stopgrad(P_j*),
forward unchanged) or ``none``. P_tj, the selector probability, is ``exp(l_tj) / sum_j' exp(l_tj')`` for
Exact and ``softmax_j(a_tj)`` for Approx, over the candidates. ``temperature`` divides all scores.
Projections, heads (head_dim 64) and RoPE as in Transformer++ (``kit/selection.py``). Ties select
the lowest chunk index.

``impl="ref"``: dense T x T oracle (``ops/top1/naive.py``). ``"chunked"``: selection blockwise (Exact)
or on chunk means (Approx), attention in tiles of ``chunk_size`` queries grouped by selected chunk
(``ops/top1/``). ``"fast"``: the CUDA path (``basecap.kernels.top1_cuda``: the same selection, the
in-chunk attention on a Triton tile kernel, or gather + SDPA without Triton). Decoding keeps the KV
cache plus (Approx) running per-chunk key sums. Equations and costs: docs/top1.md.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from ..ops.top1 import (
    SEL_DTYPE,
    ChunkSettings,
    approx_attention,
    approx_select,
    attend_selected,
    candidate_lse,
    chunk_ref,
    exact_select,
    merge_softmax,
    st_gate,
)
from .base import QUADRATIC, State
from .kit.selection import SelectionConfig, SelectionMixer


class Top1ChunkConfig(SelectionConfig):
    name: Literal["top1_chunk"] = "top1_chunk"
    selection: Literal["exact", "approx"] = "exact"
    chunk_len: int = Field(128, gt=0, description="C: positions per selectable chunk (paper: 128)")
    own_chunk: Literal["candidate", "always"] = "candidate"
    selector_grad: Literal["straight_through", "none"] = "straight_through"
    chunk_size: int = Field(
        32, gt=0, description="queries per tile of the chunked/fast forms (rows of Exact's selection blocks: 4x); results do not depend on it"
    )


class Top1Chunk(SelectionMixer):
    config_class = Top1ChunkConfig
    cfg: Top1ChunkConfig
    impls = ("ref", "chunked")
    out_projections = ("o_proj",)
    match_field = None
    compiles = True
    # the selection mode changes the algorithm (docs/top1.md): Exact scores every visible key to choose a chunk;
    # Approx scores the T/C chunk means, then attends inside one chunk of C
    cost_modes = ("selection", {"exact": QUADRATIC, "approx": "O(T^2/C + T C) train, O(T/C + C) per decoded token"})
    test_variants = [
        {"head_dim": 8, "chunk_len": 8, **switches}
        for switches in (
            {},
            {"selection": "approx"},
            {"own_chunk": "always"},
            {"selection": "approx", "own_chunk": "always"},
            {"chunk_len": 5, "selector_grad": "none"},
            {"chunk_len": 6, "selection": "approx", "position": "none", "temperature": 0.5},
        )
    ]

    def _settings(self, impl: str, device: torch.device) -> ChunkSettings:
        cfg = self.cfg
        tiles: dict[str, Any] = {"tile_rows": cfg.chunk_size}
        if impl == "fast":
            from ..kernels.top1_cuda import tile_settings

            tiles = tile_settings(cfg.chunk_size, device)
        return ChunkSettings(self.scale, cfg.chunk_len, cfg.own_chunk, select_rows=self._block_rows(impl, 4 * cfg.chunk_size), **tiles)

    def _mix(self, q, k, v, q_pos, impl, state, new_state):
        cfg = self.cfg
        if impl == "ref":
            return chunk_ref(
                q, k, v, q_pos, self.scale, cfg.chunk_len, selection=cfg.selection, own_chunk=cfg.own_chunk, selector_grad=cfg.selector_grad
            )
        s = self._settings(impl, q.device)
        own, approx = cfg.own_chunk, cfg.selection == "approx"
        gate = cfg.selector_grad == "straight_through" and torch.is_grad_enabled()
        if approx and gate and own == "candidate" and impl == "chunked" and state is None:
            return approx_attention(q, k, v, q_pos, s)  # the training hot path, fused
        if approx:
            offset = int(q_pos[0])
            prev = None if state is None else state["ksum"]
            sel, gate_t, sums = approx_select(q, k[:, :, offset:], prev, q_pos, s)
            if new_state is not None:
                new_state["ksum"] = sums
        else:
            sel, cand_lse = exact_select(q, k, q_pos, s)
            sel = torch.where(torch.isfinite(cand_lse), sel, -1)
        need_lse = own == "always" or (gate and not approx)
        fused = gate and approx and own == "candidate"  # the tile pass carries the gate
        o, lse = attend_selected(q, k, v, sel, q_pos, s, need_lse, gate_t if fused else None)
        if gate and not approx:  # P_sel / stopgrad(P_sel): value 1, gradient d log P_sel
            assert lse is not None  # need_lse
            gate_t = st_gate(torch.where(sel >= 0, lse - candidate_lse(q, k, cand_lse, q_pos, s), 0.0))
        if own == "always":
            B, H, T, _ = q.shape
            o_own, lse_own = attend_selected(q, k, v, (q_pos // s.chunk_len).expand(B, H, T), q_pos, s, True)
            assert lse is not None and lse_own is not None  # need_lse
            o = merge_softmax(o, lse, o_own, lse_own)
        if gate and not fused:
            o = o * gate_t[..., None]
        return o

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        state = super().init_state(batch, device, dtype)
        if self.cfg.selection == "approx":
            state["ksum"] = torch.zeros(batch, self.n_heads, 0, self.head_dim, device=device, dtype=SEL_DTYPE)
        return state

    def state_size(self, seq_len: int) -> int:
        kv = super().state_size(seq_len)
        if self.cfg.selection == "approx":  # float64 running key sum per chunk
            kv += self.n_heads * self.head_dim * (-(-seq_len // self.cfg.chunk_len)) * 8
        return kv

    def flops_per_token(self, seq_len: int) -> float:
        H, D, C = self.n_heads, self.head_dim, self.cfg.chunk_len
        avg = (seq_len + 1) / 2
        if self.cfg.selection == "exact":
            select = 2 * H * D * avg  # every visible score, once
        else:
            select = 2 * H * D * (seq_len / C + 1) / 2  # q . kbar per visible chunk
        parts = 2 if self.cfg.own_chunk == "always" else 1
        return select + parts * 4 * H * D * min(C, avg)
