"""Math of the Top-1 selection mixers (Lu et al. 2025, "How Does Sequence Modeling Architecture
Influence Base Capabilities of Pre-trained Language Models?", arXiv 2505.18522, section 5).

- ``element``: blockwise Top-1 Element attention (value at the argmax score) and its estimators
- ``selection``: Top-1 Chunk's Exact and Approx chunk selection, with their selector gradients
- ``tile``: causal attention inside each query's selected chunk, queries grouped into tiles
- ``fused``: the Approx training form (selection + tile attention) in one autograd Function
- ``cache``: the growable KV cache of decoding
- ``naive``: the dense references (the oracle)
- ``common``: constants, ``ChunkSettings`` and small helpers

Derivations and cost accounting: docs/top1.md.
"""

from .cache import append_time
from .common import NEG_INF, SEL_DTYPE, ChunkSettings, TileKernel, merge_softmax, st_gate
from .element import top1_element
from .fused import approx_attention
from .naive import chunk_ref, element_ref
from .selection import approx_select, candidate_lse, exact_select
from .tile import attend_selected, tile_attention

__all__ = [
    "NEG_INF",
    "SEL_DTYPE",
    "ChunkSettings",
    "TileKernel",
    "append_time",
    "approx_attention",
    "approx_select",
    "attend_selected",
    "candidate_lse",
    "chunk_ref",
    "element_ref",
    "exact_select",
    "merge_softmax",
    "st_gate",
    "tile_attention",
    "top1_element",
]
