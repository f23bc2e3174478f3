"""Chunk selection of Top-1 Chunk: Exact (the chunk of largest attention mass) and Approx (first-order
approximation from chunk key means), each with the gradient of its selector probability."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .common import NEG_INF, SEL_DTYPE, ChunkSettings, Tensor, causal_mask


class ApproxPick(NamedTuple):
    """The result of the Approx selection."""

    sel: Tensor  # [B, H, Tq] selected chunk per query (-1: no candidate)
    sums: Tensor  # [B, H, n_chunks, D] per-chunk key sums (float64 from the forward)
    carry: Tensor | None  # [B, H, D] sum of the first query's chunk before it (None at a chunk boundary)


def candidates(q_pos: Tensor, n_chunks: int, C: int, own: str) -> Tensor:
    """[Tq, n_chunks] bool: chunks a query may select. ``own='candidate'``: every chunk up to its own;
    ``'always'``: only the chunks before its own (the own chunk is attended anyway)."""
    j = torch.arange(n_chunks, device=q_pos.device)[None, :]
    c = (q_pos // C)[:, None]
    return j <= c if own == "candidate" else j < c


def _chunk_aligned_blocks(offset: int, Tq: int, C: int, R: int) -> list[tuple[int, int]]:
    """Query ranges [s, e) cut at chunk boundaries, R chunks each (T / (R C) + 1 ranges)."""
    out, s = [], 0
    while s < Tq:
        e = min(Tq, ((offset + s) // C + R) * C - offset)
        out.append((s, e))
        s = e
    return out


def _within_chunk_cumsum(
    x: Tensor, offset: int, C: int, carry: Tensor | None = None, reverse: bool = False, dtype: torch.dtype | None = None
) -> Tensor:
    """Cumulative sums of ``x [B, H, b, D]`` (positions offset..offset+b-1) restarting at every chunk;
    ``carry [B, H, D]`` is the sum of the first chunk's earlier positions. ``reverse``: suffix sums."""
    B, H, b, D = x.shape
    r = offset % C
    nb = -(-(r + b) // C)
    y = (x if nb * C == b else F.pad(x, (0, 0, r, nb * C - r - b))).reshape(B, H, nb, C, D)
    y = y if dtype is None else y.to(dtype)  # converting first: cumsum(dtype=float64) of float32 is 2x slower
    if reverse:  # suffix sums = chunk total - prefix + own term (no flipped copies)
        c = y.cumsum(3)
        y = c[:, :, :, -1:].sub(c).add_(y)
    else:
        y = y.cumsum(3)
    y = y.view(B, H, nb * C, D)[:, :, r : r + b]
    if carry is not None and r:
        y[:, :, : C - r] += carry[:, :, None]  # the first chunk's positions before offset
    return y


def approx_forward(q: Tensor, k: Tensor, prev_sums: Tensor | None, q_pos: Tensor, cfg: ChunkSettings) -> ApproxPick:
    """Approx selection in blocks of ``cfg.select_chunks`` chunks of queries (only O(R C n_chunks)
    scores at a time).

    a_tj = q_t . kbar_tj * scale + log n_tj, kbar_tj the mean of the n_tj keys of chunk j visible to t
    (n = C for the complete chunks j < c(t); the running prefix over t % C + 1 keys for the own chunk
    j = c(t)). Float64, ties to the lowest index."""
    C, scale = cfg.chunk_len, cfg.scale
    B, H, Tq, D = q.shape
    offset = int(q_pos[0])
    sums = q.new_zeros(B, H, -(-(offset + Tq) // C), D, dtype=SEL_DTYPE)
    carry = None
    if prev_sums is not None and prev_sums.shape[2]:
        sums[:, :, : prev_sums.shape[2]] = prev_sums
        carry = prev_sums[:, :, offset // C] if offset % C else None
    sel = torch.empty(B, H, Tq, dtype=torch.long, device=q.device)
    for s, e in _chunk_aligned_blocks(offset, Tq, C, cfg.select_chunks):
        pos = q_pos[s:e]
        c = torch.div(pos, C, rounding_mode="floor")
        c0, c1 = (offset + s) // C, (offset + e - 1) // C
        prefix = _within_chunk_cumsum(k[:, :, s:e], offset + s, C, carry if s == 0 else None, dtype=SEL_DTYPE)
        last = torch.clamp(torch.arange(c0 + 1, c1 + 2, device=q.device) * C - offset - s, max=e - s) - 1
        sums[:, :, c0 : c1 + 1] = prefix[:, :, last]  # running chunk totals
        qb = q[:, :, s:e].to(SEL_DTYPE) * scale  # not in place: for a float64 q, .to() returns q itself
        best = qb.new_full((B, H, e - s), NEG_INF)
        j = torch.zeros(B, H, e - s, dtype=torch.long, device=q.device)
        if c1 > 0:  # complete chunks j < c(t)
            a = (qb @ sums[:, :, :c1].transpose(-1, -2)).masked_fill_(torch.arange(c1, device=q.device) >= c[:, None], NEG_INF)
            best, j = a.max(-1)
        if cfg.own_chunk == "candidate":
            n = (pos % C + 1).to(SEL_DTYPE)
            a_own = (qb * prefix).sum(-1) / n + n.log()
            sel[:, :, s:e] = torch.where(a_own > best / C + math.log(C), c, j)
        else:
            sel[:, :, s:e] = torch.where(torch.isfinite(best), j, -1)
    return ApproxPick(sel, sums, carry)


def approx_backward(q: Tensor, k: Tensor, q_pos: Tensor, pick: ApproxPick, g: Tensor, cfg: ChunkSettings, dq: Tensor, dk: Tensor) -> None:
    """Adds the gradient of sum_t g_t log P_t,sel (P = softmax of a over the candidates) to dq, dk."""
    C, scale, sums, sel = cfg.chunk_len, cfg.scale, pick.sums, pick.sel
    cand_own = cfg.own_chunk == "candidate"
    offset = int(q_pos[0])
    g = torch.where(sel >= 0, g, 0.0)
    dsums = torch.zeros_like(sums)
    for s, e in _chunk_aligned_blocks(offset, q.shape[2], C, cfg.select_chunks):
        pos = q_pos[s:e]
        c = torch.div(pos, C, rounding_mode="floor")[:, None]
        ncols = int(c[-1]) + 1 if cand_own else int(c[-1])
        if ncols <= 1:
            continue  # one candidate at most: d log P / d a = 0
        qb, gb = q[:, :, s:e] * scale, g[:, :, s:e, None]
        a = (qb @ sums[:, :, :ncols].transpose(-1, -2)) / C + math.log(C)
        col = torch.arange(ncols, device=q.device)
        if cand_own:
            prefix = _within_chunk_cumsum(k[:, :, s:e], offset + s, C, pick.carry if s == 0 else None)
            n = (pos % C + 1).to(q.dtype)[:, None]
            a.scatter_(-1, c.expand(*a.shape[:2], -1, 1), (qb * prefix).sum(-1, keepdim=True) / n + n.log())
        allowed = col <= c if cand_own else col < c
        a.masked_fill_(~allowed, NEG_INF).masked_fill_(~allowed.any(-1, keepdim=True), 0.0)  # no candidate: g = 0
        da = torch.softmax(a, dim=-1).mul_(-gb).scatter_add_(-1, sel[:, :, s:e, None].clamp(min=0), gb)  # (onehot - p) g
        if cand_own:
            own_col = c.expand(*a.shape[:2], -1, 1)
            down = da.gather(-1, own_col) / n
            da.scatter_(-1, own_col, 0.0)
            dq[:, :, s:e] += down * prefix * scale
            dk[:, :, s:e] += _within_chunk_cumsum(down * qb, offset + s, C, reverse=True)  # a key feeds later prefixes
        da /= C
        dq[:, :, s:e] += (da @ sums[:, :, :ncols]) * scale
        dsums[:, :, :ncols] += da.transpose(-1, -2) @ qb
    for s, e in _chunk_aligned_blocks(offset, q.shape[2], C, cfg.select_chunks):  # each key also feeds its chunk's sum
        dk[:, :, s:e] += dsums.index_select(2, torch.div(q_pos[s:e], C, rounding_mode="floor"))


class _ApproxSelect(torch.autograd.Function):
    """Approx selection (``approx_forward``) returning ``sel``, the straight-through gate
    P_t,sel / stopgrad(P_t,sel) (value 1) and the float64 per-chunk key sums (the decode state)."""

    @staticmethod
    def forward(ctx, q, k, prev_sums, q_pos, cfg):
        sel, sums, carry = approx_forward(q, k, prev_sums, q_pos, cfg)
        ctx.save_for_backward(q, k, sums.to(q.dtype), sel, q_pos)
        ctx.cfg = cfg
        ctx.carry = None if carry is None else carry.to(q.dtype)
        ctx.mark_non_differentiable(sel, sums)
        return sel, torch.ones_like(q[..., 0]), sums

    @staticmethod
    def backward(ctx, _dsel, g, _dsums):
        q, k, sums, sel, q_pos = ctx.saved_tensors
        dq, dk = torch.zeros_like(q), torch.zeros_like(k)
        approx_backward(q, k, q_pos, ApproxPick(sel, sums, ctx.carry), g, ctx.cfg, dq, dk)
        return dq, dk, None, None, None


def approx_select(q: Tensor, k: Tensor, prev_sums: Tensor | None, q_pos: Tensor, cfg: ChunkSettings) -> tuple[Tensor, Tensor, Tensor]:
    """Approx selection for queries ``q`` whose own keys ``k`` (same positions ``q_pos``) are new;
    ``prev_sums`` are the float64 per-chunk key sums of the earlier positions (None at the start).
    Returns ``(sel, gate, sums)``; the gate's gradient reaches q and k (not ``prev_sums``)."""
    return _ApproxSelect.apply(q, k, prev_sums, q_pos, cfg)


@torch.no_grad()
def exact_select(q: Tensor, k: Tensor, q_pos: Tensor, cfg: ChunkSettings) -> tuple[Tensor, Tensor]:
    """Exact selection: l_tj = logsumexp of the visible scores in chunk j; pick argmax_j over candidates.

    Returns ``sel [B, H, Tq]`` (long) and ``cand_lse [B, H, Tq]`` = logsumexp_j l_tj over the candidates
    (float64; -inf when there is none). Works on query blocks: memory O(select_rows * Tk)."""
    C, rows = cfg.chunk_len, cfg.select_rows
    B, H, Tq, D = q.shape
    sel = torch.empty(B, H, Tq, dtype=torch.long, device=q.device)
    cand_lse = torch.empty(B, H, Tq, dtype=SEL_DTYPE, device=q.device)
    for s in range(0, Tq, rows):
        pos = q_pos[s : s + rows]
        end = int(pos[-1]) + 1
        nb = -(-end // C)
        sc = (q[:, :, s : s + rows].to(SEL_DTYPE) @ k[:, :, :end].to(SEL_DTYPE).transpose(-1, -2)) * cfg.scale
        sc = sc.masked_fill(~causal_mask(pos, end), NEG_INF)
        lj = F.pad(sc, (0, nb * C - end), value=NEG_INF).unflatten(-1, (nb, C)).logsumexp(-1)  # [B, H, b, nb]
        lj = lj.masked_fill(~candidates(pos, nb, C, cfg.own_chunk), NEG_INF)
        sel[:, :, s : s + rows] = lj.argmax(-1)
        cand_lse[:, :, s : s + rows] = lj.logsumexp(-1)
    return sel, cand_lse


class _CandidateLSE(torch.autograd.Function):
    """The logsumexp of the scores of all candidate keys (value precomputed by ``exact_select``);
    the backward recomputes the probabilities blockwise: d lse_t / ds_ti = p_ti."""

    @staticmethod
    def forward(ctx, q, k, cand_lse, q_pos, cfg):
        ctx.save_for_backward(q, k, cand_lse, q_pos)
        ctx.cfg = cfg
        return cand_lse.clone()

    @staticmethod
    def backward(ctx, g):
        q, k, cand_lse, q_pos = ctx.saved_tensors
        cfg = ctx.cfg
        scale, C, rows = cfg.scale, cfg.chunk_len, cfg.select_rows
        ok = torch.isfinite(cand_lse)
        g, cand_lse = torch.where(ok, g, 0.0), torch.where(ok, cand_lse, 0.0)
        dq, dk = torch.zeros_like(q), torch.zeros_like(k)
        for s in range(0, q.shape[2], rows):
            pos = q_pos[s : s + rows]
            end = int(pos[-1]) + 1
            qb, kb = q[:, :, s : s + rows], k[:, :, :end]
            vis = causal_mask(pos, end)
            if cfg.own_chunk == "always":
                vis = vis & (torch.arange(end, device=q.device)[None, :] < (pos // C * C)[:, None])
            sc = (qb @ kb.transpose(-1, -2)) * scale
            p = torch.exp(sc - cand_lse[:, :, s : s + rows, None]).masked_fill(~vis, 0.0) * g[:, :, s : s + rows, None]
            dq[:, :, s : s + rows] = (p @ kb) * scale
            dk[:, :, :end] += (p.transpose(-1, -2) @ qb) * scale
        return dq, dk, None, None, None


def candidate_lse(q: Tensor, k: Tensor, cand_lse: Tensor, q_pos: Tensor, cfg: ChunkSettings) -> Tensor:
    """``cand_lse`` from ``exact_select`` as a differentiable function of q and k."""
    return _CandidateLSE.apply(q, k, cand_lse.to(q.dtype), q_pos, cfg)
