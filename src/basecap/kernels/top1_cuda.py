"""CUDA path (``impl="fast"``) of the Top-1 selection mixers (Lu et al. 2025, arXiv 2505.18522).

Gather + SDPA: queries are grouped into tiles by the chunk they selected
(``ops.top1.tile.attend_selected``) and each tile's in-chunk attention runs through
``F.scaled_dot_product_attention`` with a boolean mask (memory-efficient kernel: the [Q, C]
probabilities are never stored for backward). The quadratic loops (Exact selection, Top-1 Element)
reuse the blockwise code of ``ops.top1`` with larger query blocks. Imported only when
``impl="fast"`` is asked for or ``"auto"`` meets a CUDA tensor; no Triton.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from ..config_base import ConfigError
from ..ops.top1.common import NEG_INF

log = logging.getLogger(__name__)

# query rows per block of the quadratic loops on GPU (memory ~ FAST_BLOCK * T * B * H * 8 bytes)
FAST_BLOCK = 1024
_logged = False


def resolve_impl(name: str, impl: str, x: torch.Tensor) -> str:
    """``"fast"`` for a CUDA input when the config says "fast" or "auto" (the path needs no extra
    library); "auto" elsewhere is "chunked", and "fast" elsewhere is a configuration error."""
    global _logged
    if impl not in ("fast", "auto"):
        return impl
    if not x.is_cuda:
        if impl == "fast":
            raise ConfigError(f"{name}.impl: impl='fast' is the CUDA path; use 'chunked' or 'auto' on {x.device}")
        return "chunked"
    if not _logged:
        _logged = True
        log.info("impl=%r on CUDA: the Top-1 selection mixers run their CUDA path ('fast')", impl)
    return "fast"


def sdpa_tile_attention(qt: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, mask: torch.Tensor, scale: float,
                        need_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as ``ops.top1.tile.tile_attention``: ``qt [N, Q, D]``, ``kt, vt [N, C, D]``, ``mask [N, Q, C]``.
    SDPA does not return the logsumexp, so when it is needed (Exact's selector gradient, the forced
    own chunk) it is computed by one extra batched matmul."""
    o = F.scaled_dot_product_attention(qt[:, None], kt[:, None], vt[:, None], attn_mask=mask[:, None], scale=scale)[:, 0]
    lse = None
    if need_lse:
        s = torch.bmm(qt.float() * scale, kt.float().transpose(1, 2)).masked_fill(~mask, NEG_INF)
        lse = s.logsumexp(-1).to(qt.dtype)
    return o, lse
