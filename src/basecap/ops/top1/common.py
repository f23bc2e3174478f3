"""Constants, settings and small helpers shared by the Top-1 ops.

Layout everywhere: ``q [B, H, Tq, D]``, ``k, v [B, H, Tk, D]``; query ``t`` sits at absolute position
``q_pos[t]`` and sees keys ``0..q_pos[t]``. Selection scores are computed in float64 by every form,
so the reference, chunked and fast forms choose the same position or chunk (ties: lowest index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

Tensor = torch.Tensor
SEL_DTYPE = torch.float64
NEG_INF = float("-inf")
TILE_BATCH_ELEMS = 2**17  # scores per tile batch of the CPU path (512 KB: temporaries stay in cache)
SELECT_BLOCK = 512  # queries per block of the Approx selection

# (qt [N, Q, D], kt [N, C, D], vt [N, C, D], mask [N, Q, C], scale, need_lse) -> (o [N, Q, D], lse [N, Q] or None)
TileKernel = Callable[[Tensor, Tensor, Tensor, Tensor, float, bool], tuple[Tensor, Tensor | None]]


@dataclass(frozen=True)
class ChunkSettings:
    """What the Top-1 Chunk ops need besides the tensors."""

    scale: float  # score scale, 1 / (sqrt(D) * temperature)
    chunk_len: int  # C: positions per selectable chunk
    own_chunk: str = "candidate"  # "candidate": the own chunk competes; "always": attended besides the pick
    tile_rows: int = 32  # Q: query slots per tile of the in-chunk attention
    select_rows: int = 128  # query rows per block of the Exact selection and of its logsumexp backward
    tile_kernel: TileKernel | None = None  # None: the tile-batched autograd Function; else run per tile under autograd
    # the tile-batched autograd Function's replacement with the same contract (``tile._TileAttention.apply``),
    # e.g. the Triton kernels of the CUDA path; None: the CPU Function. Tiles then keep ``tile_rows`` slots
    tile_fn: Callable | None = None

    @property
    def select_chunks(self) -> int:
        """Chunks of queries per block of the Approx selection."""
        return max(1, SELECT_BLOCK // self.chunk_len)


def causal_mask(pos: Tensor, end: int) -> Tensor:
    """``[len(pos), end]`` bool: key i is visible to the query at position ``pos[t]``."""
    return torch.arange(end, device=pos.device)[None, :] <= pos[:, None]


def merge_softmax(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor) -> Tensor:
    """One softmax over the union of two disjoint key sets, from each set's output and logsumexp."""
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b


def st_gate(log_p: Tensor) -> Tensor:
    """Straight-through gate P/stopgrad(P) = exp(log P - stopgrad(log P)): exactly 1 forward."""
    return torch.exp(log_p - log_p.detach())
