"""Top-1 Chunk's in-chunk attention as a Triton kernel (the CUDA path, ``impl="fast"``).

The MoBA form (Lu et al. 2025, arXiv 2505.18522; the grouping as in MoBA, Lu et al. 2025, arXiv
2502.13189): queries are grouped by (batch * head, selected chunk) into tiles of ``tile_rows`` slots
(``ops.top1.tile.tile_layout``, the CPU path's layout); one program per tile loads its chunk's keys
once and runs a causal softmax attention for its queries, flash style (key blocks with an online
softmax), returning each query's output and log-sum-exp. The backward recomputes the probabilities
from the log-sum-exp; dq goes to each query's row (a query sits in one tile), dk and dv are added
into fp32 buffers atomically (several tiles read one chunk).

Every ``tl.dot`` is at least 16 x 16 x 16 (tile rows, key block and head dim are padded to powers of
two >= 16), what the GPU compiler requires. The same autograd contract as the CPU Function
(``ops.top1.tile._TileAttention``): a gradient for the log-sum-exp (``dlse``: Exact's selector, the
merge with the own chunk) and for a straight-through gate of value 1 (``dgate_t = dO_t . o_t``).

Imported only on the fast path (a CUDA input, or the interpreter test tier); needs Triton only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.top1.tile import TileLayout

Tensor = torch.Tensor
NO_ROW = -1


@triton.jit
def _tile_fwd(
    Q,
    K,
    V,
    O,  # noqa: E741 - the kernel's pointer names (Q, K, V, O)
    LSE,
    ROW,
    ITEM,
    POS,
    GROUP,
    scale,
    Tk,
    n_chunks,
    H,
    sk_b,
    sk_h,
    sk_t,
    sv_b,
    sv_h,
    sv_t,
    C: tl.constexpr,
    D: tl.constexpr,
    BQ: tl.constexpr,
    BK: tl.constexpr,
    BD: tl.constexpr,
    PREC: tl.constexpr,
):
    tile = tl.program_id(0)
    group = tl.load(GROUP + tile).to(tl.int64)
    bh = group // n_chunks
    start = (group % n_chunks) * C
    b, h = bh // H, bh % H
    slot = tile * BQ + tl.arange(0, BQ)
    row = tl.load(ROW + slot).to(tl.int64)  # -1: a padding slot
    pos = tl.load(POS + slot)
    valid = row >= 0
    d = tl.arange(0, BD)
    q = tl.load(Q + row[:, None] * D + d[None, :], mask=valid[:, None] & (d[None, :] < D), other=0.0)
    m = tl.full([BQ], float("-inf"), dtype=tl.float32)
    acc = tl.zeros([BQ], dtype=tl.float32)
    o = tl.zeros([BQ, BD], dtype=tl.float32)
    for j in range(0, C, BK):
        kj = j + tl.arange(0, BK)
        kpos = start + kj
        kin = (kj < C) & (kpos < Tk)
        kmask = kin[:, None] & (d[None, :] < D)
        k = tl.load(K + b * sk_b + h * sk_h + kpos[:, None] * sk_t + d[None, :], mask=kmask, other=0.0)
        v = tl.load(V + b * sv_b + h * sv_h + kpos[:, None] * sv_t + d[None, :], mask=kmask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC).to(tl.float32) * scale
        seen = kin[None, :] & ((kpos[None, :] <= pos[:, None]) | ~valid[:, None])  # padding sees the chunk
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block before a row's first key
        r = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        acc = acc * r + tl.sum(p, 1)
        o = o * r[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC).to(tl.float32)
        m = m_new
    o = o / acc[:, None]
    tl.store(O + row[:, None] * D + d[None, :], o.to(O.dtype.element_ty), mask=valid[:, None] & (d[None, :] < D))
    item = tl.load(ITEM + slot).to(tl.int64)
    tl.store(LSE + item, m + tl.log(acc), mask=valid)


@triton.jit
def _tile_bwd(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    DK,
    DV,
    ROW,
    ITEM,
    POS,
    GROUP,
    scale,
    Tk,
    n_chunks,
    H,
    sk_b,
    sk_h,
    sk_t,
    sv_b,
    sv_h,
    sv_t,
    C: tl.constexpr,
    D: tl.constexpr,
    BQ: tl.constexpr,
    BK: tl.constexpr,
    BD: tl.constexpr,
    PREC: tl.constexpr,
):
    tile = tl.program_id(0)
    group = tl.load(GROUP + tile).to(tl.int64)
    bh = group // n_chunks
    start = (group % n_chunks) * C
    b, h = bh // H, bh % H
    slot = tile * BQ + tl.arange(0, BQ)
    row = tl.load(ROW + slot).to(tl.int64)
    pos = tl.load(POS + slot)
    valid = row >= 0
    item = tl.load(ITEM + slot, mask=valid, other=0).to(tl.int64)
    d = tl.arange(0, BD)
    qmask = valid[:, None] & (d[None, :] < D)
    q = tl.load(Q + row[:, None] * D + d[None, :], mask=qmask, other=0.0)
    do = tl.load(DO + row[:, None] * D + d[None, :], mask=qmask, other=0.0)  # padding rows: dO = 0
    lse = tl.load(LSE + item, mask=valid, other=0.0)
    delta = tl.load(DELTA + item, mask=valid, other=0.0)  # dO . o - dlse
    dq = tl.zeros([BQ, BD], dtype=tl.float32)
    for j in range(0, C, BK):
        kj = j + tl.arange(0, BK)
        kpos = start + kj
        kin = (kj < C) & (kpos < Tk)
        kmask = kin[:, None] & (d[None, :] < D)
        k = tl.load(K + b * sk_b + h * sk_h + kpos[:, None] * sk_t + d[None, :], mask=kmask, other=0.0)
        v = tl.load(V + b * sv_b + h * sv_h + kpos[:, None] * sv_t + d[None, :], mask=kmask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC).to(tl.float32) * scale
        seen = kin[None, :] & (kpos[None, :] <= pos[:, None]) & valid[:, None]
        p = tl.where(seen, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC).to(tl.float32)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC).to(tl.float32)
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC).to(tl.float32) * scale
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC).to(tl.float32)
        out = (bh * Tk + kpos)[:, None] * D + d[None, :]
        tl.atomic_add(DK + out, dk, mask=kmask)
        tl.atomic_add(DV + out, dv, mask=kmask)
    tl.store(DQ + row[:, None] * D + d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=qmask)


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


def kernel_tile_rows(tile_rows: int) -> int:
    """Query slots per tile the kernel takes: a power of two in [16, 128] (``tl.dot`` needs >= 16 rows)."""
    return min(128, _pow2(tile_rows))


def _slots(layout: TileLayout, q_pos: Tensor, index: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Per tile slot: the query's row in ``q_rows`` (-1: padding), its item ``bh * Tq + t`` and position."""
    n = layout.tile_group.numel() * layout.tile_rows
    dev = layout.order.device
    rows_of_items = layout.order if index is None else index[layout.order]
    row = torch.full((n,), NO_ROW, dtype=torch.int32, device=dev).index_copy_(0, layout.dest, rows_of_items.int())
    item = torch.zeros(n, dtype=torch.int32, device=dev).index_copy_(0, layout.dest, layout.order.int())
    pos = torch.zeros(n, dtype=torch.int32, device=dev).index_copy_(0, layout.dest, q_pos[layout.order % layout.Tq].int())
    return row, item, pos


def _launch_args(k: Tensor, v: Tensor, layout: TileLayout, scale: float) -> tuple[list, dict]:
    D = k.shape[-1]
    args = [scale, layout.Tk, layout.n_chunks, k.shape[1], *k.stride()[:3], *v.stride()[:3]]
    # fp32 operands: exact products unless torch itself allows TF32 matmuls (as the reference would use)
    prec = "tf32" if k.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"
    meta = dict(C=layout.chunk_len, D=D, BQ=layout.tile_rows, BK=min(64, _pow2(layout.chunk_len)), BD=_pow2(D), PREC=prec)
    return args, meta


def _kv(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class TritonTileAttention(torch.autograd.Function):
    """``ops.top1.tile._TileAttention``'s contract on the Triton kernels: ``q_rows [R, D]`` (item
    ``bh * Tq + t`` is row ``index[item]``, identity when None), ``k, v [B, H, Tk, D]`` (any strides
    but the last), ``gate`` an optional straight-through factor. Returns ``o`` (rows as q, 0 where
    unselected) and ``lse [B*H*Tq]`` (-inf where unselected), both in the queries' dtype (k and v are
    cast to it)."""

    @staticmethod
    def forward(ctx, q_rows, k, v, gate, q_pos, layout: TileLayout, scale, index):
        if layout.tile_rows != kernel_tile_rows(layout.tile_rows):
            raise ValueError(f"tile_rows {layout.tile_rows}: the kernel needs a power of two in [16, 128]")
        ctx.kv_dtypes = k.dtype, v.dtype
        dtype = q_rows.dtype  # tl.dot takes operands of one dtype
        k, v, q_rows = _kv(k.to(dtype)), _kv(v.to(dtype)), q_rows.contiguous()
        B, H = k.shape[:2]
        row, item, pos = _slots(layout, q_pos, index)
        o = torch.zeros_like(q_rows)
        lse = torch.full((B * H * layout.Tq,), float("-inf"), dtype=torch.float32, device=q_rows.device)
        n_tiles = layout.tile_group.numel()
        if n_tiles:
            args, meta = _launch_args(k, v, layout, scale)
            _tile_fwd[(n_tiles,)](q_rows, k, v, o, lse, row, item, pos, layout.tile_group, *args, **meta)
        ctx.save_for_backward(q_rows, k, v, o, lse, row, item, pos, index)
        ctx.layout, ctx.scale, ctx.has_gate = layout, scale, gate is not None
        return o, lse.to(dtype)  # in the queries' dtype, as the CPU Function's (the backward keeps fp32)

    @staticmethod
    def backward(ctx, do, dlse):
        q_rows, k, v, o, lse, row, item, pos, index = ctx.saved_tensors
        layout = ctx.layout
        B, H, Tk, D = k.shape
        do = torch.zeros_like(o) if do is None else do.contiguous()
        rows = slice(None) if index is None else index  # item -> row
        dot = (o.float() * do.float()).sum(-1)[rows]  # [B*H*Tq] dO_t . o_t, per item
        delta = dot if dlse is None else dot - torch.where(torch.isfinite(lse), dlse.float(), 0.0)
        dq = torch.zeros_like(q_rows)
        dk = torch.zeros(B * H * Tk, D, dtype=torch.float32, device=k.device)
        dv = torch.zeros_like(dk)
        n_tiles = layout.tile_group.numel()
        if n_tiles:
            args, meta = _launch_args(k, v, layout, ctx.scale)
            _tile_bwd[(n_tiles,)](q_rows, k, v, do, lse, delta.contiguous(), dq, dk, dv, row, item, pos, layout.tile_group, *args, **meta)
        dgate = dot.to(q_rows.dtype) if ctx.has_gate else None
        dk_dtype, dv_dtype = ctx.kv_dtypes
        return (dq, dk.view(B, H, Tk, D).to(dk_dtype), dv.view(B, H, Tk, D).to(dv_dtype), dgate, None, None, None, None)


def tile_attention_rows(q_rows, k, v, gate, q_pos, layout, scale, index):
    """``TritonTileAttention.apply``: the ``ChunkSettings.tile_fn`` of the kernel path."""
    return TritonTileAttention.apply(q_rows, k, v, gate, q_pos, layout, scale, index)
