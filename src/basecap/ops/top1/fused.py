"""The training form of Top-1 Chunk Approx (own chunk a candidate, straight-through selector gate)
in one autograd Function: selection, tiled in-chunk attention, and one backward."""

from __future__ import annotations

from dataclasses import replace

import torch

from .common import ChunkSettings, Tensor
from .selection import ApproxPick, approx_backward, approx_forward
from .tile import query_rows, rows_as_bhtd, tile_backward, tile_forward, tile_layout


class _ApproxAttention(torch.autograd.Function):
    """The backward accumulates the selector gradient and the attention gradient into the same
    dq, dk (no second pair of [T, D] gradient buffers)."""

    @staticmethod
    def forward(ctx, q, k, v, q_pos, cfg: ChunkSettings):
        B, H, T, D = q.shape
        sel, sums, _ = approx_forward(q, k, None, q_pos, cfg)
        layout = tile_layout(sel, k.shape[2], cfg.chunk_len, cfg.tile_rows)
        queries = query_rows(q, q_pos)
        o, _ = tile_forward(queries, k, v, layout, cfg.scale)
        ctx.save_for_backward(q, k, v, q_pos, queries.index, sel, sums.to(q.dtype))
        ctx.layout, ctx.cfg = layout, cfg
        return rows_as_bhtd(o, queries.index, B, H, T)

    @staticmethod
    def backward(ctx, do):
        q, k, v, q_pos, index, sel, sums = ctx.saved_tensors
        layout, cfg = ctx.layout, ctx.cfg
        B, H, T, D = q.shape
        queries = query_rows(q, q_pos)
        do_rows = do.transpose(1, 2).reshape(-1, D) if index is not None else do.reshape(-1, D)
        dq, dk, dv, dgate = tile_backward(queries, k, v, layout, cfg.scale, do_rows, None, True)
        dq = rows_as_bhtd(dq, index, B, H, T)
        assert dgate is not None  # want_dgate
        approx_backward(q, k, q_pos, ApproxPick(sel, sums, None), dgate.view(B, H, T), cfg, dq, dk)
        return dq, dk, dv, None, None


def approx_attention(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, cfg: ChunkSettings) -> Tensor:
    """Top-1 Chunk Approx training forward: no cache, own chunk a candidate, straight-through gate."""
    if cfg.own_chunk != "candidate":
        raise ValueError("approx_attention is the own_chunk='candidate' form; use approx_select + attend_selected")
    tile_rows = max(1, min(cfg.tile_rows, q.shape[2]))
    return _ApproxAttention.apply(q, k, v, q_pos, replace(cfg, tile_rows=tile_rows))
