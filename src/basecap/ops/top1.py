"""Shared math of the Top-1 selection mixers (Lu et al. 2025, "How Does Sequence Modeling
Architecture Influence Base Capabilities of Pre-trained Language Models?", arXiv 2505.18522):
blockwise Top-1 Element attention, Exact / Approx chunk selection, attention inside the selected
chunk (queries grouped into tiles by the chunk they selected), and a growable KV cache.

Layout everywhere: ``q [B, H, Tq, D]``, ``k, v [B, H, Tk, D]``; query ``t`` sits at absolute position
``q_pos[t]`` and sees keys ``0..q_pos[t]``. Selection scores are computed in float64 by every impl,
so ref, chunked and fast forms choose the same position/chunk (ties: lowest index). Derivations and
cost accounting: docs/top1.md.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
SEL_DTYPE = torch.float64
NEG_INF = float("-inf")


# ---- Top-1 Element -------------------------------------------------------------------------
class _Top1Element(torch.autograd.Function):
    """o_t = v_{argmax_i s_ti}; backward by the straight-through soft or probability-ratio estimator.

    Forward and backward loop over query blocks of ``block`` rows (full rows of visible keys), so
    memory is O(block * Tk), never Tq x Tk."""

    @staticmethod
    def forward(ctx, q, k, v, q_pos, scale, block, estimator):
        B, H, Tq, D = q.shape
        idx = torch.empty(B, H, Tq, dtype=torch.long, device=q.device)
        lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)
        for s in range(0, Tq, block):
            pos = q_pos[s : s + block]
            end = int(pos[-1]) + 1
            sc = (q[:, :, s : s + block].to(SEL_DTYPE) @ k[:, :, :end].to(SEL_DTYPE).transpose(-1, -2)) * scale
            sc = sc.masked_fill(_causal(pos, end).logical_not(), NEG_INF)
            idx[:, :, s : s + block] = sc.argmax(-1)
            lse[:, :, s : s + block] = sc.logsumexp(-1).float()
        out = v.gather(2, idx[..., None].expand(-1, -1, -1, v.shape[-1]))
        ctx.save_for_backward(q, k, v, q_pos, idx, lse)
        ctx.scale, ctx.block, ctx.estimator = scale, block, estimator
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, q_pos, idx, lse = ctx.saved_tensors
        scale, block = ctx.scale, ctx.block
        dq, dk = torch.zeros_like(q), torch.zeros_like(k)
        # both estimators pass dO straight to the selected value
        dv = torch.zeros_like(v).scatter_add_(2, idx[..., None].expand(-1, -1, -1, v.shape[-1]), dout.to(v.dtype))
        for s in range(0, q.shape[2], block):
            pos = q_pos[s : s + block]
            end = int(pos[-1]) + 1
            qb, kb, do = q[:, :, s : s + block], k[:, :, :end], dout[:, :, s : s + block]
            sc = (qb @ kb.transpose(-1, -2)) * scale
            p = torch.exp(sc - lse[:, :, s : s + block, None]).masked_fill(_causal(pos, end).logical_not(), 0.0)
            dp = do @ v[:, :, :end].transpose(-1, -2)  # dL/dp_ti = dO_t . v_i
            if ctx.estimator == "straight_through":  # soft-attention score gradient
                ds = p * (dp - (p * dp).sum(-1, keepdim=True))
            else:  # d log p_{i*} / ds_tj = 1[j = i*] - p_tj, times g_t = dO_t . v_{i*}
                sel = idx[:, :, s : s + block, None]
                g = dp.gather(-1, sel)
                ds = (-p * g).scatter_add(-1, sel, g)
            dq[:, :, s : s + block] = (ds @ kb) * scale
            dk[:, :, :end] += (ds.transpose(-1, -2) @ qb) * scale
        return dq, dk, dv, None, None, None, None


def top1_element(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, scale: float, block: int, estimator: str) -> Tensor:
    """Blockwise Top-1 Element attention; ``estimator`` is ``straight_through`` or ``prob_ratio``."""
    return _Top1Element.apply(q, k, v, q_pos, scale, block, estimator)


def _causal(pos: Tensor, end: int) -> Tensor:
    return torch.arange(end, device=pos.device)[None, :] <= pos[:, None]  # [Tq, end]


# ---- chunk selection -----------------------------------------------------------------------
def chunk_key_sums(k: Tensor, prev_sums: Tensor | None, offset: int, C: int) -> tuple[Tensor, Tensor]:
    """Running key sums for Approx selection.

    ``k [B, H, T, D]`` are keys at positions ``offset..offset+T-1``; ``prev_sums [B, H, ceil(offset/C), D]``
    the per-chunk sums of the earlier keys (last one partial when ``offset % C``). Returns
    ``prefix [B, H, T, D]`` (sum of the own chunk's keys up to and including t) and the updated
    per-chunk sums ``[B, H, ceil((offset+T)/C), D]``. Work O(T + ceil((offset+T)/C))."""
    B, H, T, D = k.shape
    r, first = offset % C, offset // C
    n_new = -(-(r + T) // C)
    x = F.pad(k, (0, 0, r, n_new * C - r - T))
    if r:  # the chunk in progress starts with the sum of its cached keys
        x = x + F.pad(prev_sums[:, :, first : first + 1], (0, 0, 0, n_new * C - 1))
    x = x.view(B, H, n_new, C, D).cumsum(3)
    prefix = x.view(B, H, n_new * C, D)[:, :, r : r + T]
    sums = x[:, :, :, -1]
    if prev_sums is not None and first:
        sums = torch.cat([prev_sums[:, :, :first], sums], dim=2)
    return prefix, sums


def candidates(q_pos: Tensor, n_chunks: int, C: int, own: str) -> Tensor:
    """[Tq, n_chunks] bool: chunks a query may select. ``own='candidate'``: every chunk up to its own;
    ``'always'``: only the chunks before its own (the own chunk is attended anyway)."""
    j = torch.arange(n_chunks, device=q_pos.device)[None, :]
    c = (q_pos // C)[:, None]
    return j <= c if own == "candidate" else j < c


def approx_scores(q: Tensor, prefix: Tensor, sums: Tensor, q_pos: Tensor, scale: float, C: int, own: str) -> Tensor:
    """a_tj = q_t . kbar_tj * scale + log n_tj over candidate chunks (-inf elsewhere), in q's dtype.

    kbar_tj is the mean of the n_tj keys of chunk j visible to t (n = C for earlier chunks)."""
    n_chunks = sums.shape[2]
    c = q_pos // C
    n_own = (q_pos % C + 1).to(q.dtype)
    a = (q @ sums.transpose(-1, -2)) * (scale / C) + math.log(C)  # complete chunks
    a_own = (q * prefix).sum(-1) * scale / n_own + n_own.log()  # the chunk in progress
    is_own = torch.arange(n_chunks, device=q.device)[None, :] == c[:, None]
    a = torch.where(is_own, a_own[..., None], a)
    return a.masked_fill(~candidates(q_pos, n_chunks, C, own), NEG_INF)


@torch.no_grad()
def exact_select(q: Tensor, k: Tensor, q_pos: Tensor, scale: float, C: int, own: str, block: int) -> tuple[Tensor, Tensor]:
    """Exact selection: l_tj = logsumexp of the visible scores in chunk j; pick argmax_j over candidates.

    Returns ``sel [B, H, Tq]`` (long) and ``L [B, H, Tq]`` = logsumexp_j l_tj over candidates
    (float64; -inf when there is none). Works on query blocks: memory O(block * Tk)."""
    B, H, Tq, D = q.shape
    sel = torch.empty(B, H, Tq, dtype=torch.long, device=q.device)
    L = torch.empty(B, H, Tq, dtype=SEL_DTYPE, device=q.device)
    for s in range(0, Tq, block):
        pos = q_pos[s : s + block]
        end = int(pos[-1]) + 1
        nb = -(-end // C)
        sc = (q[:, :, s : s + block].to(SEL_DTYPE) @ k[:, :, :end].to(SEL_DTYPE).transpose(-1, -2)) * scale
        sc = sc.masked_fill(~_causal(pos, end), NEG_INF)
        lj = F.pad(sc, (0, nb * C - end), value=NEG_INF).unflatten(-1, (nb, C)).logsumexp(-1)  # [B, H, b, nb]
        lj = lj.masked_fill(~candidates(pos, nb, C, own), NEG_INF)
        sel[:, :, s : s + block] = lj.argmax(-1)
        L[:, :, s : s + block] = lj.logsumexp(-1)
    return sel, L


class _CandidateLSE(torch.autograd.Function):
    """L_t = logsumexp of the scores of all candidate keys (value precomputed by ``exact_select``);
    the backward recomputes the probabilities blockwise: dL_t/ds_ti = p_ti."""

    @staticmethod
    def forward(ctx, q, k, L, q_pos, scale, C, own, block):
        ctx.save_for_backward(q, k, L, q_pos)
        ctx.scale, ctx.C, ctx.own, ctx.block = scale, C, own, block
        return L.clone()

    @staticmethod
    def backward(ctx, g):
        q, k, L, q_pos = ctx.saved_tensors
        scale, C, block = ctx.scale, ctx.C, ctx.block
        ok = torch.isfinite(L)
        g, L = torch.where(ok, g, 0.0), torch.where(ok, L, 0.0)
        dq, dk = torch.zeros_like(q), torch.zeros_like(k)
        for s in range(0, q.shape[2], block):
            pos = q_pos[s : s + block]
            end = int(pos[-1]) + 1
            qb, kb = q[:, :, s : s + block], k[:, :, :end]
            vis = _causal(pos, end)
            if ctx.own == "always":
                vis = vis & (torch.arange(end, device=q.device)[None, :] < (pos // C * C)[:, None])
            sc = (qb @ kb.transpose(-1, -2)) * scale
            p = torch.exp(sc - L[:, :, s : s + block, None]).masked_fill(~vis, 0.0) * g[:, :, s : s + block, None]
            dq[:, :, s : s + block] = (p @ kb) * scale
            dk[:, :, :end] += (p.transpose(-1, -2) @ qb) * scale
        return dq, dk, None, None, None, None, None, None


def candidate_lse(q: Tensor, k: Tensor, L: Tensor, q_pos: Tensor, scale: float, C: int, own: str, block: int) -> Tensor:
    return _CandidateLSE.apply(q, k, L.to(q.dtype), q_pos, scale, C, own, block)


# ---- attention inside the selected chunk ---------------------------------------------------
TileKernel = Callable[[Tensor, Tensor, Tensor, Tensor, float, bool], tuple[Tensor, Tensor | None]]


def tile_attention(qt: Tensor, kt: Tensor, vt: Tensor, mask: Tensor, scale: float, need_lse: bool) -> tuple[Tensor, Tensor | None]:
    """Softmax attention per tile: ``qt [N, Q, D]``, ``kt, vt [N, C, D]``, ``mask [N, Q, C]``."""
    s = torch.bmm(qt * scale, kt.transpose(1, 2)).masked_fill(~mask, NEG_INF)
    lse = s.logsumexp(-1) if need_lse else None
    return torch.bmm(torch.softmax(s, dim=-1), vt), lse


def group_into_tiles(groups: Tensor, n_groups: int, Q: int) -> tuple[Tensor, Tensor, Tensor]:
    """Sort items by group and cut each group into tiles of Q slots.

    ``groups [N]`` in ``[0, n_groups)`` or -1 (item skipped). Returns ``order`` (item ids, grouped),
    ``dest`` (flat slot ``tile * Q + slot`` of each item of ``order``) and ``tile_group [n_tiles]``.
    At most one partly filled tile per group: n_tiles <= N / Q + n_groups."""
    items = (groups >= 0).nonzero().squeeze(1)
    g, perm = torch.sort(groups[items], stable=True)
    order = items[perm]
    counts = torch.bincount(g, minlength=n_groups)
    tiles = (counts + Q - 1) // Q
    tile_start = tiles.cumsum(0) - tiles
    seg_start = counts.cumsum(0) - counts
    rank = torch.arange(g.numel(), device=g.device) - seg_start[g]
    tile = tile_start[g] + torch.div(rank, Q, rounding_mode="floor")
    tile_group = torch.zeros(int(tiles.sum()), dtype=torch.long, device=g.device).scatter_(0, tile, g)
    return order, tile * Q + rank % Q, tile_group


def _rows(x: Tensor, bh: Tensor, idx: Tensor) -> Tensor:
    """x [B, H, T, D] -> x.flatten(0, 1)[bh[:, None], idx] as [N, C, D], without copying x."""
    if x.is_contiguous():
        T = x.shape[2]
        return x.reshape(-1, x.shape[-1]).index_select(0, (bh[:, None] * T + idx).reshape(-1)).view(idx.shape[0], idx.shape[1], x.shape[-1])
    return x.flatten(0, 1)[bh[:, None], idx]


def attend_selected(q: Tensor, k: Tensor, v: Tensor, sel: Tensor, q_pos: Tensor, scale: float, C: int, Q: int,
                    need_lse: bool = False, kernel: TileKernel = tile_attention) -> tuple[Tensor, Tensor | None]:
    """Causal softmax attention of each query inside one chunk, ``sel [B, H, Tq]`` (-1 = none: output 0,
    lse -inf). Queries are grouped by (batch, head, chunk) into tiles of Q; each tile gathers its
    chunk's keys once, so the work is a batched [Q x C] matmul: O(Tq * C * D), no loop."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    n_chunks = -(-Tk // C)
    BH = B * H
    bh_of = torch.arange(BH, device=q.device)[:, None]
    groups = torch.where(sel.reshape(BH, Tq) >= 0, bh_of * n_chunks + sel.reshape(BH, Tq), -1).reshape(-1)
    order, dest, tile_group = group_into_tiles(groups, BH * n_chunks, Q)
    n_tiles = tile_group.numel()
    q_flat = q.reshape(BH * Tq, D)
    qt = q.new_zeros(n_tiles * Q, D).index_copy(0, dest, q_flat.index_select(0, order)).view(n_tiles, Q, D)
    # padding slots get position +inf-like: they see their whole chunk (no all-masked rows), are dropped
    big = torch.iinfo(torch.long).max
    qpos_t = torch.full((n_tiles * Q,), big, dtype=torch.long, device=q.device)
    qpos_t = qpos_t.index_copy(0, dest, q_pos.repeat(BH).index_select(0, order)).view(n_tiles, Q)
    kpos = (tile_group % n_chunks)[:, None] * C + torch.arange(C, device=q.device)  # [n_tiles, C]
    bh = torch.div(tile_group, n_chunks, rounding_mode="floor")
    kidx = kpos.clamp(max=Tk - 1)
    kt, vt = _rows(k, bh, kidx), _rows(v, bh, kidx)
    mask = (kpos[:, None, :] <= qpos_t[:, :, None]) & (kpos < Tk)[:, None, :]
    ot, lse_t = kernel(qt, kt, vt, mask, scale, need_lse)
    o = q.new_zeros(BH * Tq, D).index_copy(0, order, ot.reshape(-1, D).index_select(0, dest)).view(B, H, Tq, D)
    lse = None
    if need_lse:
        lse = torch.full((BH * Tq,), NEG_INF, dtype=lse_t.dtype, device=q.device)
        lse = lse.index_copy(0, order, lse_t.reshape(-1).index_select(0, dest)).view(B, H, Tq)
    return o, lse


def merge_softmax(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor) -> Tensor:
    """One softmax over the union of two disjoint key sets, from each set's output and logsumexp."""
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b


def st_gate(log_p: Tensor) -> Tensor:
    """Straight-through gate P/stopgrad(P) = exp(log P - stopgrad(log P)): exactly 1 forward."""
    return torch.exp(log_p - log_p.detach())


# ---- KV cache --------------------------------------------------------------------------------
def append_time(cache: Tensor, new: Tensor) -> Tensor:
    """``cat([cache, new], dim=2)`` without copying the cache when possible.

    The result is a view of a buffer with spare room. The first caller to extend a given length
    writes in place past its end (no existing state sees those slots); a second caller extending
    the same old state (branching) gets a fresh copy, so no returned state is ever altered. With
    autograd recording, a plain ``cat``."""
    n, m = cache.shape[2], new.shape[2]
    if torch.is_grad_enabled() and (cache.requires_grad or new.requires_grad):
        return torch.cat([cache, new], dim=2)
    base = cache._base
    if (base is not None and getattr(base, "_top1_filled", -1) == n and base.shape[2] >= n + m
            and base.dtype == new.dtype and base[:, :, :n].stride() == cache.stride()
            and base.data_ptr() == cache.data_ptr()):
        base[:, :, n : n + m] = new
        base._top1_filled = n + m
        return base[:, :, : n + m]
    B, H, _, D = new.shape
    base = new.new_empty(B, H, max(64, 2 * (n + m)), D)
    base[:, :, :n] = cache
    base[:, :, n : n + m] = new
    base._top1_filled = n + m
    return base[:, :, : n + m]
