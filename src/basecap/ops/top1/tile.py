"""Attention inside the selected chunk: each query attends causally to the keys of one chunk.

Queries are grouped by (batch * head, chunk) into tiles of ``tile_rows`` (Q) slots; each tile gathers
its chunk's keys once, so the work is batched [Q x C] matmuls, O(Tq C D), with no loop over heads
or chunks. The CPU path is a hand-written autograd Function that runs a few tiles at a time and
recomputes the tile scores in backward (flash style); a ``TileKernel`` (plain autograd softmax,
or SDPA on CUDA) can run all tiles at once instead.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .common import NEG_INF, TILE_BATCH_ELEMS, ChunkSettings, Tensor


class TileLayout(NamedTuple):
    """Queries grouped by (batch*head, chunk) and cut into tiles of ``tile_rows`` slots (``tile_layout``)."""

    order: Tensor  # [n_items] flat query ids (bh * Tq + t), grouped by chunk
    dest: Tensor  # [n_items] flat slot tile * tile_rows + slot of each item of ``order`` (strictly increasing)
    tile_group: Tensor  # [n_tiles] bh * n_chunks + chunk of each tile
    n_chunks: int
    tile_rows: int  # Q
    chunk_len: int  # C
    Tq: int
    Tk: int

    @property
    def tiles_per_batch(self) -> int:
        """Tiles per step of the CPU loops (about ``TILE_BATCH_ELEMS`` scores at a time)."""
        return max(1, TILE_BATCH_ELEMS // (self.tile_rows * self.chunk_len))


class QueryRows(NamedTuple):
    """The queries of the tile attention as 2-D rows."""

    x: Tensor  # [B*H*Tq, D] rows
    index: Tensor | None  # type: ignore[assignment]  # row of each item bh * Tq + t (None: the identity); shadows tuple.index
    pos: Tensor  # [Tq] absolute positions


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


def _tile_key_rows(layout: TileLayout, tiles: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For tiles ``tiles`` (their group ids): bh, key positions [n, C] and key indices clamped to Tk."""
    C = layout.chunk_len
    kpos = (tiles % layout.n_chunks)[:, None] * C + torch.arange(C, device=tiles.device)  # [n, C]
    return torch.div(tiles, layout.n_chunks, rounding_mode="floor"), kpos, kpos.clamp(max=layout.Tk - 1)


def _tile_keys(layout: TileLayout, tiles: Tensor, q_pos_of_slots: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Key rows (bh, clamped key index) of each tile and the causal mask [n, Q, C] of its slots."""
    bh, kpos, kidx = _tile_key_rows(layout, tiles)
    slots = q_pos_of_slots.view(len(tiles), layout.tile_rows)
    mask = (kpos[:, None, :] <= slots[:, :, None]) & (kpos < layout.Tk)[:, None, :]
    return bh, kidx, mask


def _rows(x: Tensor, bh: Tensor, idx: Tensor) -> Tensor:
    """x [B, H, T, D] -> x.flatten(0, 1)[bh[:, None], idx] as [N, C, D], without copying x."""
    if x.is_contiguous():
        T = x.shape[2]
        rows = (bh[:, None] * T + idx).reshape(-1)
        return x.reshape(-1, x.shape[-1]).index_select(0, rows).view(idx.shape[0], idx.shape[1], x.shape[-1])
    return x.flatten(0, 1)[bh[:, None], idx]


def _slot_positions(layout: TileLayout, q_pos: Tensor, items: Tensor, slots: Tensor, n_slots: int) -> Tensor:
    # padding slots get an "infinite" position: they see their whole chunk (no all-masked rows), are dropped
    big = torch.full((n_slots,), torch.iinfo(torch.long).max, dtype=torch.long, device=q_pos.device)
    return big.index_copy(0, slots, q_pos[items % layout.Tq])


class _TileBatches:
    """Iterates the tile batches of a layout: their tiles, items, slots, source rows and causal bias."""

    def __init__(self, layout: TileLayout, k: Tensor, queries: QueryRows):
        L, tb = layout, layout.tiles_per_batch
        self.layout, self.tb, self.rows = L, tb, queries.index
        Q, C = L.tile_rows, L.chunk_len
        n_tiles = L.tile_group.numel()
        self.bounds = torch.searchsorted(L.dest, torch.arange(0, n_tiles + tb, tb, device=k.device) * Q).tolist()
        self.starts = list(range(0, n_tiles, tb))
        # additive causal bias by number of visible keys: row l = [0] * l + [-inf] * (C - l)
        hidden = torch.arange(C, device=k.device)[None, :] >= torch.arange(C + 1, device=k.device)[:, None]
        self.bias = torch.zeros(C + 1, C, dtype=k.dtype, device=k.device).masked_fill_(hidden, NEG_INF)
        # slot -> source query row; padding slots read row 0, see their whole chunk, and are never written back
        self.valid = torch.zeros(n_tiles * Q, dtype=k.dtype, device=k.device).index_fill_(0, L.dest, 1.0)
        self.src = torch.zeros(n_tiles * Q, dtype=torch.long, device=k.device).index_copy_(0, L.dest, L.order)
        # keys visible to each slot in its tile's chunk (padding slots: all of them)
        start = ((L.tile_group % L.n_chunks) * C).repeat_interleave(Q)
        visible = torch.where(self.valid > 0, (queries.pos[self.src % L.Tq] - start).clamp(max=C - 1) + 1, C)
        self.visible = torch.minimum(visible, (L.Tk - start).clamp(max=C))
        self.all_valid = L.order.numel() == k.shape[0] * k.shape[1] * L.Tq  # every query is in a tile

    def chunks(self, x: Tensor) -> Tensor | None:
        """x [B, H, Tk, D] as [BH * n_chunks, C * D] (2-D: a chunk gather is a block copy); None for a
        non-contiguous view (a decode cache), whose rows are gathered instead of copying the cache."""
        if not x.is_contiguous():
            return None
        B, H, Tk, D = x.shape
        L = self.layout
        pad = L.n_chunks * L.chunk_len - Tk
        return (F.pad(x, (0, 0, 0, pad)) if pad else x).view(B * H * L.n_chunks, L.chunk_len * D)

    def __iter__(self):
        L, Q = self.layout, self.layout.tile_rows
        for b, t0 in enumerate(self.starts):
            tiles = L.tile_group[t0 : t0 + self.tb]
            items, slots = L.order[self.bounds[b] : self.bounds[b + 1]], L.dest[self.bounds[b] : self.bounds[b + 1]] - t0 * Q
            sl = slice(t0 * Q, (t0 + len(tiles)) * Q)
            bias = self.bias.index_select(0, self.visible[sl]).view(len(tiles), Q, L.chunk_len)
            src = self.src[sl]
            if self.rows is None:
                yield tiles, items, items, slots, src, src, self.valid[sl, None], bias
            else:
                yield tiles, items, self.rows[items], slots, src, self.rows[src], self.valid[sl, None], bias

    def gather(self, xc: Tensor | None, x: Tensor, tiles: Tensor) -> Tensor:
        if xc is not None:
            return xc.index_select(0, tiles).view(len(tiles), self.layout.chunk_len, -1)
        bh, _, kidx = _tile_key_rows(self.layout, tiles)
        return x.flatten(0, 1)[bh[:, None], kidx]


def tile_forward(queries: QueryRows, k: Tensor, v: Tensor, layout: TileLayout, scale: float) -> tuple[Tensor, Tensor]:
    """In-chunk attention, a few tiles at a time. Queries and outputs are rows of ``queries.x``/``o``:
    item ``bh * Tq + t`` is row ``queries.index[item]`` (identity when None), so a [B, T, H, D] layout
    needs no copy. Returns ``o`` (0 for unselected queries) and ``lse [BH*Tq]`` (-inf there)."""
    q_rows = queries.x
    D, Q = q_rows.shape[1], layout.tile_rows
    batches = _TileBatches(layout, k, queries)
    o = q_rows.new_empty(q_rows.shape) if batches.all_valid else q_rows.new_zeros(q_rows.shape)
    lse = q_rows.new_full((k.shape[0] * k.shape[1] * layout.Tq,), NEG_INF)
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


def tile_backward(
    queries: QueryRows, k: Tensor, v: Tensor, layout: TileLayout, scale: float, do: Tensor, dlse: Tensor | None, want_dgate: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Recomputes the [Q, C] probabilities per tile batch (nothing [T, D]-sized is kept from the
    forward but the inputs; dO . o = sum_i p_i dO . v_i needs no output). Returns dq (rows), dk, dv
    and, if asked, dgate_t = dO_t . o_t (the gradient of a straight-through factor of value 1 on the
    output)."""
    q_rows = queries.x
    B, H, Tk, D = k.shape
    Q = layout.tile_rows
    batches = _TileBatches(layout, k, queries)
    kc, vc = batches.chunks(k), batches.chunks(v)
    dkc = k.new_zeros(B * H * layout.n_chunks, layout.chunk_len * D)
    dvc = torch.zeros_like(dkc)
    dq = torch.empty_like(q_rows) if batches.all_valid else torch.zeros_like(q_rows)
    dgate = q_rows.new_zeros(B * H * layout.Tq) if want_dgate else None
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


def query_rows(q: Tensor, q_pos: Tensor) -> QueryRows:
    """q [B, H, T, D] as 2-D rows without copying when its memory is [B, T, H, D] (the projection
    layout), with the row of each item ``bh * T + t``; else a [B*H*T, D] reshape (index None)."""
    B, H, T, D = q.shape
    q_bthd = q.transpose(1, 2)
    if not q_bthd.is_contiguous():
        return QueryRows(q.reshape(B * H * T, D), None, q_pos)
    b, h, t = (torch.arange(n, device=q.device) for n in (B, H, T))
    return QueryRows(q_bthd.view(-1, D), ((b[:, None, None] * T + t[None, None, :]) * H + h[None, :, None]).reshape(-1), q_pos)


def rows_as_bhtd(x: Tensor, index: Tensor | None, B: int, H: int, T: int) -> Tensor:
    return x.view(B, H, T, -1) if index is None else x.view(B, T, H, -1).transpose(1, 2)


class _TileAttention(torch.autograd.Function):
    """``tile_forward`` / ``tile_backward`` (flash style: recomputes the tile scores and output).
    ``gate [BH*Tq]`` (optional) is a straight-through factor of value 1: it does not scale o, and
    receives dO_t . o_t."""

    @staticmethod
    def forward(ctx, q_rows, k, v, gate, q_pos, layout: TileLayout, scale, index):
        o, lse = tile_forward(QueryRows(q_rows, index, q_pos), k, v, layout, scale)
        ctx.save_for_backward(q_rows, k, v, q_pos, index)
        ctx.layout, ctx.scale, ctx.has_gate = layout, scale, gate is not None
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q_rows, k, v, q_pos, index = ctx.saved_tensors
        queries = QueryRows(q_rows, index, q_pos)
        dq, dk, dv, dgate = tile_backward(queries, k, v, ctx.layout, ctx.scale, do, dlse, ctx.has_gate)
        return dq, dk, dv, dgate, None, None, None, None


def tile_attention(qt: Tensor, kt: Tensor, vt: Tensor, mask: Tensor, scale: float, need_lse: bool) -> tuple[Tensor, Tensor | None]:
    """Plain autograd softmax attention per tile: ``qt [N, Q, D]``, ``kt, vt [N, C, D]``, ``mask [N, Q, C]``."""
    s = torch.bmm(qt * scale, kt.transpose(1, 2)).masked_fill(~mask, NEG_INF)
    lse = s.logsumexp(-1) if need_lse else None
    return torch.bmm(torch.softmax(s, dim=-1), vt), lse


def attend_selected(
    q: Tensor, k: Tensor, v: Tensor, sel: Tensor, q_pos: Tensor, cfg: ChunkSettings, need_lse: bool = True, gate: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """Causal softmax attention of each query inside one chunk, ``sel [B, H, Tq]`` (-1 = none: output 0,
    lse -inf), in tiles of ``cfg.tile_rows`` queries.

    ``cfg.tile_kernel=None``: the hand-written tile-batched autograd Function (CPU path), or ``cfg.tile_fn``
    in its place (the Triton kernels of the CUDA path, same contract). Otherwise every
    tile is gathered at once and the kernel (e.g. ``tile_attention``, or SDPA on CUDA) runs under
    autograd. ``gate [B, H, Tq]``: a straight-through factor (value 1) applied to the output."""
    B, H, Tq, D = q.shape
    # a tile never needs more slots than there are queries (a kernel's tile_fn keeps its own size)
    Q = cfg.tile_rows if cfg.tile_fn is not None else max(1, min(cfg.tile_rows, Tq))
    layout = tile_layout(sel, k.shape[2], cfg.chunk_len, Q)
    if cfg.tile_kernel is None:
        g = None if gate is None else gate.reshape(-1)
        queries = query_rows(q, q_pos)
        fn = _TileAttention.apply if cfg.tile_fn is None else cfg.tile_fn
        o, lse = fn(queries.x, k, v, g, q_pos, layout, cfg.scale, queries.index)
        return rows_as_bhtd(o, queries.index, B, H, Tq), lse.view(B, H, Tq)
    q_flat = q.reshape(B * H * Tq, D)
    n = layout.tile_group.numel() * Q
    bh, kidx, mask = _tile_keys(layout, layout.tile_group, _slot_positions(layout, q_pos, layout.order, layout.dest, n))
    qt = q.new_zeros(n, D).index_copy(0, layout.dest, q_flat.index_select(0, layout.order)).view(-1, Q, D)
    ot, lse_t = cfg.tile_kernel(qt, _rows(k, bh, kidx), _rows(v, bh, kidx), mask, cfg.scale, need_lse)
    o = q.new_zeros(B * H * Tq, D).index_copy(0, layout.order, ot.reshape(n, D).index_select(0, layout.dest))
    lse = None
    if need_lse:
        assert lse_t is not None  # the kernel returns it when asked
        lse = torch.full((B * H * Tq,), NEG_INF, dtype=lse_t.dtype, device=q.device)
        lse = lse.index_copy(0, layout.order, lse_t.reshape(n).index_select(0, layout.dest)).view(B, H, Tq)
    o = o.view(B, H, Tq, D)
    return (o if gate is None else o * gate[..., None]), lse
