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
Projections, heads (head_dim 64) and RoPE as in Transformer++. Ties select the lowest chunk index.

``impl="ref"``: dense T x T oracle. ``"chunked"``: selection blockwise (Exact) or on chunk means
(Approx), attention in tiles of queries grouped by selected chunk. ``"fast"``: the CUDA path
(``basecap.kernels.top1_cuda``). Decoding keeps the KV cache plus (Approx) running per-chunk key sums.
Equations and costs: docs/top1.md.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from ..ops.top1 import (NEG_INF, SEL_DTYPE, approx_attention, approx_select, attend_selected, candidate_lse,
                        exact_select, merge_softmax, st_gate)
from .base import State
from .top1_element import SelectionConfig, SelectionMixer


class Top1ChunkConfig(SelectionConfig):
    name: Literal["top1_chunk"] = "top1_chunk"
    selection: Literal["exact", "approx"] = "exact"
    chunk_len: int = Field(128, gt=0, description="C: positions per selectable chunk (paper: 128)")
    own_chunk: Literal["candidate", "always"] = "candidate"
    selector_grad: Literal["straight_through", "none"] = "straight_through"
    chunk_size: int = Field(32, gt=0, description="queries per tile of the chunked/fast forms (rows of Exact's selection blocks: 4x); results do not depend on it")


def chunk_ref(q, k, v, q_pos, scale: float, cfg: Top1ChunkConfig) -> torch.Tensor:
    """Dense oracle: builds the [Tq, n_chunks, Tk] membership mask and every score explicitly."""
    C, Tk = cfg.chunk_len, k.shape[2]
    n_chunks = -(-Tk // C)
    kpos, j = torch.arange(Tk, device=q.device), torch.arange(n_chunks, device=q.device)
    own = q_pos // C
    vis = kpos[None, :] <= q_pos[:, None]  # [Tq, Tk]
    M = vis[:, None, :] & ((kpos // C)[None, :] == j[:, None])[None]  # [Tq, n_chunks, Tk]
    cand = j[None, :] <= own[:, None] if cfg.own_chunk == "candidate" else j[None, :] < own[:, None]
    valid = cand.any(-1)  # [Tq]
    s = (q.float() @ k.float().transpose(-1, -2)) * scale  # [B, H, Tq, Tk]
    q64, k64 = q.to(SEL_DTYPE), k.to(SEL_DTYPE)
    if cfg.selection == "exact":
        s64 = (q64 @ k64.transpose(-1, -2)) * scale
        score = s64[:, :, :, None, :].masked_fill(~M, NEG_INF).logsumexp(-1)  # l_tj
    else:
        n = M.sum(-1)  # [Tq, n_chunks]
        kbar = torch.einsum("tji,bhid->bhtjd", M.to(SEL_DTYPE), k64) / n.clamp(min=1)[..., None]
        score = (q64[:, :, :, None, :] * kbar).sum(-1) * scale + n.clamp(min=1).to(SEL_DTYPE).log()
    score = score.masked_fill(~cand, NEG_INF)
    sel = score.detach().argmax(-1)  # [B, H, Tq], first maximum
    A = M[torch.arange(len(q_pos), device=q.device), sel] & valid[:, None]  # keys of the selected chunk
    if cfg.own_chunk == "always":
        A = A | M[torch.arange(len(q_pos), device=q.device), own]
    o = torch.softmax(s.masked_fill(~A, NEG_INF), dim=-1) @ v.float()
    if cfg.selector_grad == "straight_through":
        if cfg.selection == "exact":
            l32 = torch.where(M, s[:, :, :, None, :], NEG_INF).logsumexp(-1)
            l_cand = torch.where(valid[:, None], l32.masked_fill(~cand, NEG_INF), 0.0)
            log_p = l32.gather(-1, sel[..., None])[..., 0] - l_cand.logsumexp(-1)
        else:
            log_p = torch.log_softmax(torch.where(valid[:, None], score, 0.0), -1).gather(-1, sel[..., None])[..., 0]
        o = o * st_gate(torch.where(valid, log_p, 0.0).float())[..., None]
    return o.to(v.dtype)


class Top1Chunk(SelectionMixer):
    config_class = Top1ChunkConfig
    impls = ("ref", "chunked")
    test_variants = [
        {"head_dim": 8, "chunk_len": 8},
        {"head_dim": 8, "chunk_len": 8, "selection": "approx"},
        {"head_dim": 8, "chunk_len": 8, "own_chunk": "always"},
        {"head_dim": 8, "chunk_len": 8, "selection": "approx", "own_chunk": "always"},
        {"head_dim": 8, "chunk_len": 5, "selector_grad": "none"},
        {"head_dim": 8, "chunk_len": 6, "selection": "approx", "position": "none", "temperature": 0.5},
    ]

    def _mix(self, q, k, v, q_pos, impl, state, new_state):
        cfg = self.cfg
        if impl == "ref":
            return chunk_ref(q, k, v, q_pos, self.scale, cfg)
        C, own, scale, block, Q = cfg.chunk_len, cfg.own_chunk, self.scale, self._block(impl, 4 * cfg.chunk_size), cfg.chunk_size
        kernel = None
        if impl == "fast":
            from ..kernels.top1_cuda import sdpa_tile_attention as kernel
        gate = cfg.selector_grad == "straight_through" and torch.is_grad_enabled()
        B, H, T, _ = q.shape
        if cfg.selection == "approx" and gate and own == "candidate" and kernel is None and state is None:
            return approx_attention(q, k, v, q_pos, scale, C, Q)  # the training hot path, fused
        if cfg.selection == "approx":
            offset = int(q_pos[0])
            prev = None if state is None else state["ksum"]
            sel, gate_t, sums = approx_select(q, k[:, :, offset:], prev, q_pos, scale, C, own)
            if new_state is not None:
                new_state["ksum"] = sums
        else:
            sel, L = exact_select(q, k, q_pos, scale, C, own, block)
            sel = torch.where(torch.isfinite(L), sel, -1)
        need_lse = own == "always" or (gate and cfg.selection == "exact")
        fused = gate and cfg.selection == "approx" and own == "candidate"  # the tile pass carries the gate
        o, lse = attend_selected(q, k, v, sel, q_pos, scale, C, Q, kernel, need_lse, gate_t if fused else None)
        if gate and cfg.selection == "exact":  # P_sel / stopgrad(P_sel): value 1, gradient d log P_sel
            gate_t = st_gate(torch.where(sel >= 0, lse - candidate_lse(q, k, L, q_pos, scale, C, own, block), 0.0))
        if own == "always":
            own_sel = (q_pos // C).expand(B, H, T)
            o_own, lse_own = attend_selected(q, k, v, own_sel, q_pos, scale, C, Q, kernel, True)
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
