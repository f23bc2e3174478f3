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
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
SEL_DTYPE = torch.float64
NEG_INF = float("-inf")
TILE_BATCH_ELEMS = 2**17  # scores per tile batch of the CPU path (512 KB: temporaries stay in cache)
SELECT_BLOCK = 512  # queries per block of the Approx selection


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


def _within_chunk_cumsum(x: Tensor, offset: int, C: int, carry: Tensor | None = None, reverse: bool = False,
                         dtype: torch.dtype | None = None) -> Tensor:
    """Cumulative sums of ``x [B, H, b, D]`` (positions offset..offset+b-1) restarting at every chunk;
    ``carry [B, H, D]`` is the sum of the first chunk's earlier positions. ``reverse``: suffix sums."""
    B, H, b, D = x.shape
    r = offset % C
    nb = -(-(r + b) // C)
    y = (x if nb * C == b else F.pad(x, (0, 0, r, nb * C - r - b))).reshape(B, H, nb, C, D)
    y = y.flip(3).cumsum(3, dtype=dtype).flip(3) if reverse else y.cumsum(3, dtype=dtype)
    y = y.view(B, H, nb * C, D)[:, :, r : r + b]
    if carry is not None and r:
        y[:, :, : C - r] += carry[:, :, None]  # the first chunk's positions before offset
    return y


def _approx_forward(q, k, prev_sums, q_pos, scale: float, C: int, own: str, R: int):
    """Approx selection in blocks of ``R`` chunks of queries (only O(R C n_chunks) scores at a time).

    a_tj = q_t . kbar_tj * scale + log n_tj, kbar_tj the mean of the n_tj keys of chunk j visible to t
    (n = C for the complete chunks j < c(t); the running prefix over t % C + 1 keys for the own chunk
    j = c(t)). Float64, ties to the lowest index. Returns ``sel`` (-1: no candidate), the float64
    per-chunk key sums and the carried partial sum of the chunk in progress (None at a boundary)."""
    B, H, Tq, D = q.shape
    offset = int(q_pos[0])
    sums = q.new_zeros(B, H, -(-(offset + Tq) // C), D, dtype=SEL_DTYPE)
    carry = None
    if prev_sums is not None and prev_sums.shape[2]:
        sums[:, :, : prev_sums.shape[2]] = prev_sums
        carry = prev_sums[:, :, offset // C] if offset % C else None
    sel = torch.empty(B, H, Tq, dtype=torch.long, device=q.device)
    for s, e in _chunk_aligned_blocks(offset, Tq, C, R):
        pos = q_pos[s:e]
        c = torch.div(pos, C, rounding_mode="floor")
        c0, c1 = (offset + s) // C, (offset + e - 1) // C
        prefix = _within_chunk_cumsum(k[:, :, s:e], offset + s, C, carry if s == 0 else None, dtype=SEL_DTYPE)
        last = torch.clamp(torch.arange(c0 + 1, c1 + 2, device=q.device) * C - offset - s, max=e - s) - 1
        sums[:, :, c0 : c1 + 1] = prefix[:, :, last]  # running chunk totals
        qb = q[:, :, s:e].to(SEL_DTYPE).mul_(scale)
        best = qb.new_full((B, H, e - s), NEG_INF)
        j = torch.zeros(B, H, e - s, dtype=torch.long, device=q.device)
        if c1 > 0:  # complete chunks j < c(t)
            a = (qb @ sums[:, :, :c1].transpose(-1, -2)).masked_fill_(torch.arange(c1, device=q.device) >= c[:, None], NEG_INF)
            best, j = a.max(-1)
        if own == "candidate":
            n = (pos % C + 1).to(SEL_DTYPE)
            a_own = (qb * prefix).sum(-1) / n + n.log()
            sel[:, :, s:e] = torch.where(a_own > best / C + math.log(C), c, j)
        else:
            sel[:, :, s:e] = torch.where(torch.isfinite(best), j, -1)
    return sel, sums, carry


def _approx_backward(q, k, sums, carry, sel, q_pos, g, scale: float, C: int, own: str, R: int, dq, dk):
    """Adds the gradient of sum_t g_t log P_t,sel (P = softmax of a over the candidates) to dq, dk."""
    cand_own = own == "candidate"
    offset = int(q_pos[0])
    g = torch.where(sel >= 0, g, 0.0)
    dsums = torch.zeros_like(sums)
    for s, e in _chunk_aligned_blocks(offset, q.shape[2], C, R):
        pos = q_pos[s:e]
        c = torch.div(pos, C, rounding_mode="floor")[:, None]
        ncols = int(c[-1]) + 1 if cand_own else int(c[-1])
        if ncols <= 1:
            continue  # one candidate at most: d log P / d a = 0
        qb, gb = q[:, :, s:e] * scale, g[:, :, s:e, None]
        a = (qb @ sums[:, :, :ncols].transpose(-1, -2)) / C + math.log(C)
        col = torch.arange(ncols, device=q.device)
        if cand_own:
            prefix = _within_chunk_cumsum(k[:, :, s:e], offset + s, C, carry if s == 0 else None)
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
    for s, e in _chunk_aligned_blocks(offset, q.shape[2], C, R):  # each key also feeds its chunk's sum
        dk[:, :, s:e] += dsums.index_select(2, torch.div(q_pos[s:e], C, rounding_mode="floor"))


class _ApproxSelect(torch.autograd.Function):
    """Approx selection (``_approx_forward``) returning ``sel``, the straight-through gate
    P_t,sel / stopgrad(P_t,sel) (value 1) and the float64 per-chunk key sums (the decode state)."""

    @staticmethod
    def forward(ctx, q, k, prev_sums, q_pos, scale, C, own, R):
        sel, sums, carry = _approx_forward(q, k, prev_sums, q_pos, scale, C, own, R)
        ctx.save_for_backward(q, k, sums.to(q.dtype), sel, q_pos)
        ctx.args = (scale, C, own, R)
        ctx.carry = None if carry is None else carry.to(q.dtype)
        ctx.mark_non_differentiable(sel, sums)
        return sel, torch.ones_like(q[..., 0]), sums

    @staticmethod
    def backward(ctx, _dsel, g, _dsums):
        q, k, sums, sel, q_pos = ctx.saved_tensors
        dq, dk = torch.zeros_like(q), torch.zeros_like(k)
        _approx_backward(q, k, sums, ctx.carry, sel, q_pos, g, *ctx.args, dq, dk)
        return dq, dk, None, None, None, None, None, None


def approx_select(q: Tensor, k: Tensor, prev_sums: Tensor | None, q_pos: Tensor, scale: float, C: int,
                  own: str) -> tuple[Tensor, Tensor, Tensor]:
    """Approx selection for queries ``q`` whose own keys ``k`` (same positions ``q_pos``) are new;
    ``prev_sums`` are the float64 per-chunk key sums of the earlier positions (None at the start).
    Returns ``(sel, gate, sums)``; the gate's gradient reaches q and k (not ``prev_sums``)."""
    return _ApproxSelect.apply(q, k, prev_sums, q_pos, scale, C, own, max(1, SELECT_BLOCK // C))


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
class TileLayout(NamedTuple):
    """Queries grouped by (batch*head, chunk) and cut into tiles of Q slots (see ``tile_layout``)."""

    order: Tensor  # [n_items] flat query ids (bh * Tq + t), grouped by chunk
    dest: Tensor  # [n_items] flat slot tile * Q + slot of each item of ``order`` (strictly increasing)
    tile_group: Tensor  # [n_tiles] bh * n_chunks + chunk of each tile
    n_chunks: int
    Q: int
    C: int
    Tq: int
    Tk: int


def tile_layout(sel: Tensor, Tk: int, C: int, Q: int) -> TileLayout:
    """``sel [B, H, Tq]`` chunk ids (-1 = none). Each (bh, chunk) group gets ceil(count / Q) tiles,
    so n_tiles <= n_items / Q + n_groups (at most one partly filled tile per group)."""
    B, H, Tq = sel.shape
    n_chunks = -(-Tk // C)
    bh = torch.arange(B * H, device=sel.device)[:, None]
    flat = sel.reshape(B * H, Tq)
    groups = torch.where(flat >= 0, bh * n_chunks + flat, -1).reshape(-1)
    items = (groups >= 0).nonzero().squeeze(1)
    g, perm = torch.sort(groups[items], stable=True)
    counts = torch.bincount(g, minlength=B * H * n_chunks)
    tiles = (counts + Q - 1) // Q
    tile_start = tiles.cumsum(0) - tiles
    rank = torch.arange(g.numel(), device=g.device) - (counts.cumsum(0) - counts)[g]
    tile_group = torch.zeros(int(tiles.sum()), dtype=torch.long, device=g.device)
    tile_group.scatter_(0, tile_start[g] + torch.div(rank, Q, rounding_mode="floor"), g)
    return TileLayout(items[perm], tile_start[g] * Q + rank, tile_group, n_chunks, Q, C, Tq, Tk)


def _tile_key_rows(L: TileLayout, tiles: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For tiles ``tiles`` (their group ids): bh, key positions [n, C] and key indices clamped to Tk."""
    kpos = (tiles % L.n_chunks)[:, None] * L.C + torch.arange(L.C, device=tiles.device)  # [n, C]
    return torch.div(tiles, L.n_chunks, rounding_mode="floor"), kpos, kpos.clamp(max=L.Tk - 1)


def _tile_keys(L: TileLayout, tiles: Tensor, q_pos_of_slots: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Key rows (bh, clamped key index) of each tile and the causal mask [n, Q, C] of its slots."""
    bh, kpos, kidx = _tile_key_rows(L, tiles)
    mask = (kpos[:, None, :] <= q_pos_of_slots.view(len(tiles), L.Q)[:, :, None]) & (kpos < L.Tk)[:, None, :]
    return bh, kidx, mask


def _rows(x: Tensor, bh: Tensor, idx: Tensor) -> Tensor:
    """x [B, H, T, D] -> x.flatten(0, 1)[bh[:, None], idx] as [N, C, D], without copying x."""
    if x.is_contiguous():
        T = x.shape[2]
        rows = (bh[:, None] * T + idx).reshape(-1)
        return x.reshape(-1, x.shape[-1]).index_select(0, rows).view(idx.shape[0], idx.shape[1], x.shape[-1])
    return x.flatten(0, 1)[bh[:, None], idx]


def _slot_positions(L: TileLayout, q_pos: Tensor, items: Tensor, slots: Tensor, n_slots: int) -> Tensor:
    # padding slots get an "infinite" position: they see their whole chunk (no all-masked rows), are dropped
    big = torch.full((n_slots,), torch.iinfo(torch.long).max, dtype=torch.long, device=q_pos.device)
    return big.index_copy(0, slots, q_pos[items % L.Tq])


class _TileBatches:
    """Iterates the tile batches of a layout: their tiles, items, slots, source rows and causal bias."""

    def __init__(self, L: TileLayout, k: Tensor, q_pos: Tensor, tb: int, rows: Tensor | None):
        self.L, self.tb, self.rows = L, tb, rows
        n_tiles = L.tile_group.numel()
        self.bounds = torch.searchsorted(L.dest, torch.arange(0, n_tiles + tb, tb, device=k.device) * L.Q).tolist()
        self.starts = list(range(0, n_tiles, tb))
        # additive causal bias by number of visible keys: row l = [0] * l + [-inf] * (C - l)
        hidden = torch.arange(L.C, device=k.device)[None, :] >= torch.arange(L.C + 1, device=k.device)[:, None]
        self.bias = torch.zeros(L.C + 1, L.C, dtype=k.dtype, device=k.device).masked_fill_(hidden, NEG_INF)
        # slot -> source query row; padding slots read row 0, see their whole chunk, and are never written back
        self.valid = torch.zeros(n_tiles * L.Q, dtype=k.dtype, device=k.device).index_fill_(0, L.dest, 1.0)
        self.src = torch.zeros(n_tiles * L.Q, dtype=torch.long, device=k.device).index_copy_(0, L.dest, L.order)
        # keys visible to each slot in its tile's chunk (padding slots: all of them)
        start = ((L.tile_group % L.n_chunks) * L.C).repeat_interleave(L.Q)
        visible = torch.where(self.valid > 0, (q_pos[self.src % L.Tq] - start).clamp(max=L.C - 1) + 1, L.C)
        self.visible = torch.minimum(visible, (L.Tk - start).clamp(max=L.C))
        self.all_valid = L.order.numel() == k.shape[0] * k.shape[1] * L.Tq  # every query is in a tile

    def chunks(self, x: Tensor) -> Tensor | None:
        """x [B, H, Tk, D] as [BH * n_chunks, C * D] (2-D: a chunk gather is a block copy); None for a
        non-contiguous view (a decode cache), whose rows are gathered instead of copying the cache."""
        if not x.is_contiguous():
            return None
        B, H, Tk, D = x.shape
        pad = self.L.n_chunks * self.L.C - Tk
        return (F.pad(x, (0, 0, 0, pad)) if pad else x).view(B * H * self.L.n_chunks, self.L.C * D)

    def __iter__(self):
        L = self.L
        for b, t0 in enumerate(self.starts):
            tiles = L.tile_group[t0 : t0 + self.tb]
            items, slots = L.order[self.bounds[b] : self.bounds[b + 1]], L.dest[self.bounds[b] : self.bounds[b + 1]] - t0 * L.Q
            sl = slice(t0 * L.Q, (t0 + len(tiles)) * L.Q)
            bias = self.bias.index_select(0, self.visible[sl]).view(len(tiles), L.Q, L.C)
            src = self.src[sl]
            if self.rows is None:
                yield tiles, items, items, slots, src, src, self.valid[sl, None], bias
            else:
                yield tiles, items, self.rows[items], slots, src, self.rows[src], self.valid[sl, None], bias

    def gather(self, xc: Tensor | None, x: Tensor, tiles: Tensor) -> Tensor:
        if xc is not None:
            return xc.index_select(0, tiles).view(len(tiles), self.L.C, -1)
        bh, _, kidx = _tile_key_rows(self.L, tiles)
        return x.flatten(0, 1)[bh[:, None], kidx]


def _tile_forward(q_rows, k, v, q_pos, L: TileLayout, scale: float, tb: int, rows):
    """In-chunk attention, ``tb`` tiles at a time. Queries and outputs are rows of ``q_rows``/``o``:
    item ``bh * Tq + t`` is row ``rows[item]`` (identity when None), so a [B, T, H, D] layout needs no
    copy. Returns ``o`` (0 for unselected queries) and ``lse [BH*Tq]`` (-inf there)."""
    D, Q = q_rows.shape[1], L.Q
    batches = _TileBatches(L, k, q_pos, tb, rows)
    o = q_rows.new_empty(q_rows.shape) if batches.all_valid else q_rows.new_zeros(q_rows.shape)
    lse = q_rows.new_full((k.shape[0] * k.shape[1] * L.Tq,), NEG_INF)
    kc, vc = batches.chunks(k), batches.chunks(v)
    for tiles, items, item_rows, slots, _, src_rows, _, bias in batches:
        qt = q_rows.index_select(0, src_rows).mul_(scale).view(len(tiles), Q, D)
        s = torch.bmm(qt, batches.gather(kc, k, tiles).transpose(1, 2)).add_(bias)
        p = torch.softmax(s, dim=-1)
        ot = torch.bmm(p, batches.gather(vc, v, tiles)).view(-1, D)
        o.index_copy_(0, item_rows, ot.index_select(0, slots))
        m = s.amax(-1).sub_(p.amax(-1).log_())  # lse = max - log(max p)
        lse.index_copy_(0, items, m.view(-1).index_select(0, slots))
    return o, lse


def _tile_backward(q_rows, k, v, q_pos, rows, L: TileLayout, scale: float, tb: int, do, dlse, want_dgate: bool):
    """Recomputes the [Q, C] probabilities per tile batch (nothing [T, D]-sized is kept from the
    forward but the inputs; dO . o = sum_i p_i dO . v_i needs no output). Returns dq (rows), dk, dv and, if asked, dgate_t = dO_t . o_t
    (the gradient of a straight-through factor of value 1 on the output)."""
    B, H, Tk, D = k.shape
    Q = L.Q
    batches = _TileBatches(L, k, q_pos, tb, rows)
    kc, vc = batches.chunks(k), batches.chunks(v)
    dkc = k.new_zeros(B * H * L.n_chunks, L.C * D)
    dvc = torch.zeros_like(dkc)
    dq = torch.empty_like(q_rows) if batches.all_valid else torch.zeros_like(q_rows)
    dgate = q_rows.new_zeros(B * H * L.Tq) if want_dgate else None
    for tiles, items, item_rows, slots, src, src_rows, valid, bias in batches:
        n = len(tiles)
        qt = q_rows.index_select(0, src_rows).mul_(scale).view(n, Q, D)
        dot = do.index_select(0, src_rows).mul_(valid).view(n, Q, D)  # padding rows: dO = 0
        kt, vt = batches.gather(kc, k, tiles), batches.gather(vc, v, tiles)
        p = torch.softmax(torch.bmm(qt, kt.transpose(1, 2)).add_(bias), dim=-1)
        dp = torch.bmm(dot, vt.transpose(1, 2))  # dO_t . v_i
        dt = (p * dp).sum(-1, keepdim=True)  # dO_t . o_t = sum_i p_ti dO_t . v_i
        if dgate is not None:
            dgate.index_copy_(0, items, dt.view(-1).index_select(0, slots))
        if dlse is not None:
            dt.sub_(dlse.index_select(0, src).mul_(valid[:, 0]).view(n, Q, 1))
        ds = dp.sub_(dt).mul_(p)  # dL/ds = p (dO.v - dO.o + dL/dlse)
        dvc.index_add_(0, tiles, torch.bmm(p.transpose(1, 2), dot).view(n, -1))
        dkc.index_add_(0, tiles, torch.bmm(ds.transpose(1, 2), qt).view(n, -1))
        dq.index_copy_(0, item_rows, torch.bmm(ds, kt).view(-1, D).index_select(0, slots))
    return dq.mul_(scale), dkc.view(B, H, -1, D)[:, :, :Tk], dvc.view(B, H, -1, D)[:, :, :Tk], dgate


def _query_rows(q: Tensor) -> tuple[Tensor, Tensor | None]:
    """q [B, H, T, D] as 2-D rows without copying when its memory is [B, T, H, D] (the projection
    layout), with the row of each item ``bh * T + t``; else a [B*H*T, D] reshape (rows None)."""
    B, H, T, D = q.shape
    q_bthd = q.transpose(1, 2)
    if not q_bthd.is_contiguous():
        return q.reshape(B * H * T, D), None
    b, h, t = (torch.arange(n, device=q.device) for n in (B, H, T))
    return q_bthd.view(-1, D), ((b[:, None, None] * T + t[None, None, :]) * H + h[None, :, None]).reshape(-1)


def _rows_as_bhtd(x: Tensor, rows: Tensor | None, B: int, H: int, T: int) -> Tensor:
    return x.view(B, H, T, -1) if rows is None else x.view(B, T, H, -1).transpose(1, 2)


class _TileAttention(torch.autograd.Function):
    """``_tile_forward`` / ``_tile_backward`` (flash style: recomputes the tile scores and output).
    ``gate [BH*Tq]`` (optional) is a straight-through factor of value 1: it does not scale o, and
    receives dO_t . o_t."""

    @staticmethod
    def forward(ctx, q_rows, k, v, gate, q_pos, L: TileLayout, scale, tb, rows):
        o, lse = _tile_forward(q_rows, k, v, q_pos, L, scale, tb, rows)
        ctx.save_for_backward(q_rows, k, v, q_pos, rows)
        ctx.args, ctx.has_gate = (L, scale, tb), gate is not None
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q_rows, k, v, q_pos, rows = ctx.saved_tensors
        dq, dk, dv, dgate = _tile_backward(q_rows, k, v, q_pos, rows, *ctx.args, do, dlse, ctx.has_gate)
        return dq, dk, dv, dgate, None, None, None, None, None


class _ApproxAttention(torch.autograd.Function):
    """Training form of Top-1 Chunk Approx (own chunk a candidate, straight-through selector gate)
    in one Function: selection, tiled in-chunk attention, and one backward that accumulates both
    gradients into the same dq, dk (no second pair of [T, D] gradient buffers)."""

    @staticmethod
    def forward(ctx, q, k, v, q_pos, scale, C, Q, R, tb):
        B, H, T, D = q.shape
        sel, sums, _ = _approx_forward(q, k, None, q_pos, scale, C, "candidate", R)
        L = tile_layout(sel, k.shape[2], C, Q)
        q_rows, rows = _query_rows(q)
        o, _ = _tile_forward(q_rows, k, v, q_pos, L, scale, tb, rows)
        ctx.save_for_backward(q, k, v, q_pos, rows, sel, sums.to(q.dtype))
        ctx.args = (L, scale, C, R, tb)
        return _rows_as_bhtd(o, rows, B, H, T)

    @staticmethod
    def backward(ctx, do):
        q, k, v, q_pos, rows, sel, sums = ctx.saved_tensors
        L, scale, C, R, tb = ctx.args
        B, H, T, D = q.shape
        q_rows = _query_rows(q)[0]
        do_rows = do.transpose(1, 2).reshape(-1, D) if rows is not None else do.reshape(-1, D)
        dq, dk, dv, dgate = _tile_backward(q_rows, k, v, q_pos, rows, L, scale, tb, do_rows, None, True)
        dq = _rows_as_bhtd(dq, rows, B, H, T)
        _approx_backward(q, k, sums, None, sel, q_pos, dgate.view(B, H, T), scale, C, "candidate", R, dq, dk)
        return dq, dk, dv, None, None, None, None, None, None


def approx_attention(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, scale: float, C: int, Q: int) -> Tensor:
    """Top-1 Chunk Approx training forward (no cache; own chunk a candidate; straight-through gate)."""
    Q = max(1, min(Q, q.shape[2]))
    return _ApproxAttention.apply(q, k, v, q_pos, scale, C, Q, max(1, SELECT_BLOCK // C), max(1, TILE_BATCH_ELEMS // (Q * C)))


TileKernel = Callable[[Tensor, Tensor, Tensor, Tensor, float, bool], tuple[Tensor, Tensor | None]]


def tile_attention(qt: Tensor, kt: Tensor, vt: Tensor, mask: Tensor, scale: float, need_lse: bool) -> tuple[Tensor, Tensor | None]:
    """Plain autograd softmax attention per tile: ``qt [N, Q, D]``, ``kt, vt [N, C, D]``, ``mask [N, Q, C]``."""
    s = torch.bmm(qt * scale, kt.transpose(1, 2)).masked_fill(~mask, NEG_INF)
    lse = s.logsumexp(-1) if need_lse else None
    return torch.bmm(torch.softmax(s, dim=-1), vt), lse


def attend_selected(q: Tensor, k: Tensor, v: Tensor, sel: Tensor, q_pos: Tensor, scale: float, C: int, Q: int,
                    kernel: TileKernel | None = None, need_lse: bool = True, gate: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Causal softmax attention of each query inside one chunk, ``sel [B, H, Tq]`` (-1 = none: output 0,
    lse -inf). Queries are grouped by (batch, head, chunk) into tiles of Q; each tile gathers its chunk's
    keys once, so the work is batched [Q x C] matmuls, O(Tq * C * D), with no loop over heads or chunks.

    ``kernel=None``: the hand-written tile-batched autograd Function (CPU path). Otherwise every tile
    is gathered at once and ``kernel`` (e.g. ``tile_attention``, or SDPA on CUDA) runs under autograd.
    ``gate [B, H, Tq]``: a straight-through factor (value 1) applied to the output."""
    B, H, Tq, D = q.shape
    Q = max(1, min(Q, Tq))  # a tile never needs more slots than there are queries
    L = tile_layout(sel, k.shape[2], C, Q)
    if kernel is None:
        g = None if gate is None else gate.reshape(-1)
        q_rows, rows = _query_rows(q)
        o, lse = _TileAttention.apply(q_rows, k, v, g, q_pos, L, scale, max(1, TILE_BATCH_ELEMS // (Q * C)), rows)
        return _rows_as_bhtd(o, rows, B, H, Tq), lse.view(B, H, Tq)
    q_flat = q.reshape(B * H * Tq, D)
    n = L.tile_group.numel() * Q
    bh, kidx, mask = _tile_keys(L, L.tile_group, _slot_positions(L, q_pos, L.order, L.dest, n))
    qt = q.new_zeros(n, D).index_copy(0, L.dest, q_flat.index_select(0, L.order)).view(-1, Q, D)
    ot, lse_t = kernel(qt, _rows(k, bh, kidx), _rows(v, bh, kidx), mask, scale, need_lse)
    o = q.new_zeros(B * H * Tq, D).index_copy(0, L.order, ot.reshape(n, D).index_select(0, L.dest))
    lse = None
    if need_lse:
        lse = torch.full((B * H * Tq,), NEG_INF, dtype=lse_t.dtype, device=q.device)
        lse = lse.index_copy(0, L.order, lse_t.reshape(n).index_select(0, L.dest)).view(B, H, Tq)
    o = o.view(B, H, Tq, D)
    return (o if gate is None else o * gate[..., None]), lse


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
