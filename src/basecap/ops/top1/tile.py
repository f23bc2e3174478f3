"""Attention inside the selected chunk: each query attends causally to the keys of one chunk.

Queries are grouped by (batch * head, chunk) into tiles of ``tile_rows`` (Q) slots; each tile gathers
its chunk's keys once, so the work is [Q x C] attention blocks, O(Tq C D), with no loop over heads or
chunks. Queries that selected an earlier chunk see all of its keys (no mask); those that selected
their own chunk are grouped apart, into the first tiles, the only ones with a causal mask.

The CPU path (``tile_forward`` / ``tile_backward``) runs a batch of tiles at a time through PyTorch's
CPU flash-attention kernels (one fused softmax pass forward, one backward pass that recomputes the
probabilities from the saved logsumexp: no [Q, C] probabilities are kept). A ``TileKernel`` (plain
autograd softmax, or SDPA on CUDA) can run all tiles at once instead.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .common import NEG_INF, TILE_BATCH_ELEMS, ChunkSettings, Tensor

# PyTorch's CPU flash attention (the kernels of F.scaled_dot_product_attention on CPU), called directly
# so that the backward gets the forward's logsumexp instead of re-running the forward under autograd.
# q [N, 1, Q, D], k, v [N, 1, C, D], additive mask [N, 1, Q, C] or None -> (o [N, 1, Q, D], lse [N, 1, Q])
_flash_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
# (dO, q, k, v, o, lse, dropout, causal, mask, scale) -> dq, dk, dv; ds = p (dO.v - rowsum(dO * o))
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class TileLayout(NamedTuple):
    """Queries grouped by (own or earlier chunk, batch*head, chunk) and cut into tiles of ``tile_rows``
    slots (``tile_layout``). The own-chunk tiles come first: tiles ``[0, n_masked)``."""

    order: Tensor  # [n_items] flat query ids (bh * Tq + t), grouped by tile
    dest: Tensor  # [n_items] flat slot tile * tile_rows + slot of each item of ``order`` (strictly increasing)
    tile_group: Tensor  # [n_tiles] bh * n_chunks + chunk of each tile
    n_masked: int  # tiles of queries in their own chunk (causal mask); the others see whole chunks
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
    index: Tensor | None  # row of each item bh * Tq + t (None: the identity)
    pos: Tensor  # [Tq] absolute positions


def tile_layout(sel: Tensor, q_pos: Tensor, Tk: int, C: int, Q: int) -> TileLayout:
    """``sel [B, H, Tq]`` chunk ids (-1 = none). Each (own, bh, chunk) group gets ceil(count / Q) tiles,
    so n_tiles <= n_items / Q + 2 * n_chunks * B * H (at most one partly filled tile per group)."""
    B, H, Tq = sel.shape
    n_chunks = -(-Tk // C)
    n_groups = B * H * n_chunks
    flat = sel.reshape(B * H, Tq)
    earlier = flat < torch.div(q_pos, C, rounding_mode="floor")  # a complete earlier chunk: no mask
    bh = torch.arange(B * H, device=sel.device)[:, None]
    groups = (bh * n_chunks + flat + earlier * n_groups).reshape(-1)
    if bool((flat >= 0).all()):
        items = None
        g, perm = torch.sort(groups, stable=True)
    else:
        items = (flat.reshape(-1) >= 0).nonzero().squeeze(1)
        g, perm = torch.sort(groups[items], stable=True)
    counts = torch.bincount(g, minlength=2 * n_groups)
    tiles = (counts + Q - 1) // Q
    tile_start = tiles.cumsum(0) - tiles
    rank = torch.arange(g.numel(), device=g.device) - (counts.cumsum(0) - counts)[g]
    tile_group = torch.zeros(int(tiles.sum()), dtype=torch.long, device=g.device)
    tile_group.scatter_(0, tile_start[g] + torch.div(rank, Q, rounding_mode="floor"), g % n_groups)
    order = perm if items is None else items[perm]
    return TileLayout(order, tile_start[g] * Q + rank, tile_group, int(tiles[:n_groups].sum()), n_chunks, Q, C, Tq, Tk)


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


class _Batch(NamedTuple):
    """One step of the CPU loops: a run of tiles of the same kind (all masked or none)."""

    tiles: Tensor  # [n] group ids of the tiles
    slots: slice  # their slots, tile_first * Q .. tile_end * Q
    src: Tensor  # [n * Q] flat query id of each slot (padding slots: 0)
    dst: Tensor  # [n * Q] the same, with padding slots sent to the spare id BH * Tq
    src_rows: Tensor  # [n * Q] its row in ``queries.x``
    dst_rows: Tensor  # [n * Q] row written by each slot (padding slots: the spare row R)
    valid: Tensor  # [n * Q, 1] 1 for real slots, 0 for padding
    mask: Tensor | None  # [n, 1, Q, C] additive causal mask (own-chunk tiles only)


class _TileBatches:
    """Iterates the tile batches of a layout; gathers the keys and values of their chunks."""

    def __init__(self, layout: TileLayout, k: Tensor, queries: QueryRows):
        L, tb = layout, layout.tiles_per_batch
        self.layout = L
        Q, C = L.tile_rows, L.chunk_len
        n_tiles = L.tile_group.numel()
        self.starts = list(range(0, L.n_masked, tb)) + list(range(L.n_masked, n_tiles, tb))
        ends = self.starts[1:] + [n_tiles]
        self.ends = [min(e, L.n_masked) if s < L.n_masked else e for s, e in zip(self.starts, ends)]
        # slot -> source query row; padding slots read row 0, see their whole chunk, and are never written back
        self.valid = torch.zeros(n_tiles * Q, 1, dtype=k.dtype, device=k.device).index_fill_(0, L.dest, 1.0)
        self.src = src = torch.zeros(n_tiles * Q, dtype=torch.long, device=k.device).index_copy_(0, L.dest, L.order)
        self.src_rows = src if queries.index is None else queries.index[src]
        real = self.valid[:, 0] > 0
        self.dst = torch.where(real, src, k.shape[0] * k.shape[1] * L.Tq)
        self.dst_rows = torch.where(real, self.src_rows, queries.x.shape[0])
        self.bias = None
        if L.n_masked:  # keys visible to each slot of the own-chunk tiles (padding slots: all of them)
            n = L.n_masked * Q
            start = ((L.tile_group[: L.n_masked] % L.n_chunks) * C).repeat_interleave(Q)
            own = self.valid[:n, 0] > 0
            visible = torch.where(own, (queries.pos[src[:n] % L.Tq] - start).clamp(max=C - 1) + 1, C)
            self.visible = torch.minimum(visible, (L.Tk - start).clamp(max=C))
            hidden = torch.arange(C, device=k.device)[None, :] >= torch.arange(C + 1, device=k.device)[:, None]
            self.bias = torch.zeros(C + 1, C, dtype=k.dtype, device=k.device).masked_fill_(hidden, NEG_INF)

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
        L, Q, C = self.layout, self.layout.tile_rows, self.layout.chunk_len
        for t0, t1 in zip(self.starts, self.ends):
            sl = slice(t0 * Q, t1 * Q)
            mask = None
            if t0 < L.n_masked:
                mask = self.bias.index_select(0, self.visible[sl]).view(t1 - t0, 1, Q, C)
            yield _Batch(L.tile_group[t0:t1], sl, self.src[sl], self.dst[sl], self.src_rows[sl], self.dst_rows[sl],
                         self.valid[sl], mask)

    def gather(self, xc: Tensor | None, x: Tensor, tiles: Tensor) -> Tensor:
        """The chunks of ``tiles`` as [n, 1, C, D]."""
        if xc is not None:
            return xc.index_select(0, tiles).view(len(tiles), 1, self.layout.chunk_len, -1)
        bh, _, kidx = _tile_key_rows(self.layout, tiles)
        return x.flatten(0, 1)[bh[:, None], kidx][:, None]


def tile_forward(queries: QueryRows, k: Tensor, v: Tensor, layout: TileLayout, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """In-chunk attention, a batch of tiles at a time. Queries and outputs are rows of ``queries.x``/``o``:
    item ``bh * Tq + t`` is row ``queries.index[item]`` (identity when None), so a [B, T, H, D] layout
    needs no copy. Returns ``o`` (0 for unselected queries), ``lse [BH*Tq]`` (-inf there) and the
    logsumexp of every tile slot (what ``tile_backward`` needs)."""
    q_rows = queries.x
    R, D = q_rows.shape
    Q = layout.tile_rows
    batches = _TileBatches(layout, k, queries)
    o = q_rows.new_zeros(R + 1, D)  # row R takes the padding slots
    lse_slots = q_rows.new_empty(layout.tile_group.numel() * Q)
    kc, vc = batches.chunks(k), batches.chunks(v)
    for b in batches:
        n = len(b.tiles)
        qt = q_rows.index_select(0, b.src_rows).view(n, 1, Q, D)
        ot, lt = _flash_forward(qt, batches.gather(kc, k, b.tiles), batches.gather(vc, v, b.tiles), attn_mask=b.mask,
                                scale=scale)
        o.index_add_(0, b.dst_rows, ot.view(-1, D))  # each row is written once: a scatter (faster than index_copy_)
        lse_slots[b.slots] = lt.view(-1)
    lse = q_rows.new_full((k.shape[0] * k.shape[1] * layout.Tq,), NEG_INF)
    lse.index_copy_(0, layout.order, lse_slots.index_select(0, layout.dest))
    return o[:R], lse, lse_slots


def tile_backward(queries: QueryRows, k: Tensor, v: Tensor, layout: TileLayout, scale: float, o: Tensor,
                  lse_slots: Tensor, do: Tensor, dlse: Tensor | None, want_dgate: bool
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The flash backward per tile batch from the saved output rows ``o`` and slot logsumexps. Returns
    dq (rows), dk, dv and, if asked, dgate_t = dO_t . o_t (the gradient of a straight-through factor of
    value 1 on the output). A logsumexp gradient ``dlse`` enters as one more feature column:
    ``rowsum(dO' * o') = dO . o - dlse`` with ``dO' = [dO, 1]``, ``o' = [o, -dlse]`` and zero in q, k, v."""
    q_rows = queries.x
    B, H, Tk, D = k.shape
    Q, C = layout.tile_rows, layout.chunk_len
    batches = _TileBatches(layout, k, queries)
    kc, vc = batches.chunks(k), batches.chunks(v)
    dkc = k.new_zeros(B * H * layout.n_chunks, C * D)
    dvc = torch.zeros_like(dkc)
    dq = q_rows.new_zeros(q_rows.shape[0] + 1, D)  # row R takes the padding slots
    dgate = q_rows.new_zeros(B * H * layout.Tq + 1) if want_dgate else None  # + the padding slots' spare
    lse_slots = lse_slots.view(-1, 1, Q)
    for b in batches:
        n = len(b.tiles)
        t0 = b.slots.start // Q
        qt = q_rows.index_select(0, b.src_rows).view(n, 1, Q, D)
        kt, vt = batches.gather(kc, k, b.tiles), batches.gather(vc, v, b.tiles)
        dot = do.index_select(0, b.src_rows).mul_(b.valid).view(n, 1, Q, D)  # padding slots: dO = 0
        ot = o.index_select(0, b.src_rows).view(n, 1, Q, D)
        if dgate is not None:
            dgate.index_add_(0, b.dst, (dot * ot).sum(-1).view(-1))
        if dlse is not None:
            d_l = dlse.index_select(0, b.src).view(n, 1, Q, 1).mul(b.valid.view(n, 1, Q, 1))
            qt, kt, vt = (F.pad(x, (0, 1)) for x in (qt, kt, vt))
            dot, ot = F.pad(dot, (0, 1), value=1.0), torch.cat([ot, -d_l], -1)
        dqt, dkt, dvt = _flash_backward(dot, qt, kt, vt, ot, lse_slots[t0 : t0 + n], 0.0, False, attn_mask=b.mask,
                                        scale=scale)
        dkc.index_add_(0, b.tiles, dkt[..., :D].reshape(n, -1))
        dvc.index_add_(0, b.tiles, dvt[..., :D].reshape(n, -1))
        dq.index_add_(0, b.dst_rows, dqt[..., :D].reshape(-1, D))
    return dq[:-1], dkc.view(B, H, -1, D)[:, :, :Tk], dvc.view(B, H, -1, D)[:, :, :Tk], None if dgate is None else dgate[:-1]


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
    """``tile_forward`` / ``tile_backward``. ``gate [BH*Tq]`` (optional) is a straight-through factor of
    value 1: it does not scale o, and receives dO_t . o_t."""

    @staticmethod
    def forward(ctx, q_rows, k, v, gate, q_pos, layout: TileLayout, scale, index):
        o, lse, lse_slots = tile_forward(QueryRows(q_rows, index, q_pos), k, v, layout, scale)
        ctx.save_for_backward(q_rows, k, v, q_pos, index, o, lse_slots)
        ctx.layout, ctx.scale, ctx.has_gate = layout, scale, gate is not None
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q_rows, k, v, q_pos, index, o, lse_slots = ctx.saved_tensors
        queries = QueryRows(q_rows, index, q_pos)
        dq, dk, dv, dgate = tile_backward(queries, k, v, ctx.layout, ctx.scale, o, lse_slots, do, dlse, ctx.has_gate)
        return dq, dk, dv, dgate, None, None, None, None


def tile_attention(qt: Tensor, kt: Tensor, vt: Tensor, mask: Tensor, scale: float, need_lse: bool) -> tuple[Tensor, Tensor | None]:
    """Plain autograd softmax attention per tile: ``qt [N, Q, D]``, ``kt, vt [N, C, D]``, ``mask [N, Q, C]``."""
    s = torch.bmm(qt * scale, kt.transpose(1, 2)).masked_fill(~mask, NEG_INF)
    lse = s.logsumexp(-1) if need_lse else None
    return torch.bmm(torch.softmax(s, dim=-1), vt), lse


def attend_selected(q: Tensor, k: Tensor, v: Tensor, sel: Tensor, q_pos: Tensor, cfg: ChunkSettings,
                    need_lse: bool = True, gate: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Causal softmax attention of each query inside one chunk, ``sel [B, H, Tq]`` (-1 = none: output 0,
    lse -inf), in tiles of ``cfg.tile_rows`` queries.

    ``cfg.tile_kernel=None``: the hand-written tile-batched autograd Function (CPU path). Otherwise every
    tile is gathered at once and the kernel (e.g. ``tile_attention``, or SDPA on CUDA) runs under
    autograd. ``gate [B, H, Tq]``: a straight-through factor (value 1) applied to the output."""
    B, H, Tq, D = q.shape
    Q = max(1, min(cfg.tile_rows, Tq))  # a tile never needs more slots than there are queries
    layout = tile_layout(sel, q_pos, k.shape[2], cfg.chunk_len, Q)
    if cfg.tile_kernel is None:
        g = None if gate is None else gate.reshape(-1)
        queries = query_rows(q, q_pos)
        o, lse = _TileAttention.apply(queries.x, k, v, g, q_pos, layout, cfg.scale, queries.index)
        return rows_as_bhtd(o, queries.index, B, H, Tq), lse.view(B, H, Tq)
    q_flat = q.reshape(B * H * Tq, D)
    n = layout.tile_group.numel() * Q
    bh, kidx, mask = _tile_keys(layout, layout.tile_group, _slot_positions(layout, q_pos, layout.order, layout.dest, n))
    qt = q.new_zeros(n, D).index_copy(0, layout.dest, q_flat.index_select(0, layout.order)).view(-1, Q, D)
    ot, lse_t = cfg.tile_kernel(qt, _rows(k, bh, kidx), _rows(v, bh, kidx), mask, cfg.scale, need_lse)
    o = q.new_zeros(B * H * Tq, D).index_copy(0, layout.order, ot.reshape(n, D).index_select(0, layout.dest))
    lse = None
    if need_lse:
        lse = torch.full((B * H * Tq,), NEG_INF, dtype=lse_t.dtype, device=q.device)
        lse = lse.index_copy(0, layout.order, lse_t.reshape(n).index_select(0, layout.dest)).view(B, H, Tq)
    o = o.view(B, H, Tq, D)
    return (o if gate is None else o * gate[..., None]), lse
