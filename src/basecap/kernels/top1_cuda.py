"""CUDA path (``impl="fast"``) of the Top-1 selection mixers (Lu et al. 2025, arXiv 2505.18522).

Top-1 Chunk's in-chunk attention runs on one of two tile backends, chosen once per process:
- ``"triton"`` (when Triton imports): ``kernels.top1_triton``, a Triton kernel over the CPU path's tile
  layout (queries grouped by the chunk they selected, MoBA style), forward and backward, with the
  log-sum-exp and its gradient (Exact's selector, the merge with the own chunk);
- ``"sdpa"`` (the fallback without Triton): every tile gathered at once and run through
  ``F.scaled_dot_product_attention`` with a boolean mask (memory-efficient kernel: the [Q, C]
  probabilities are never stored for backward).
The quadratic loops (Exact selection, Top-1 Element) reuse the blockwise code of ``ops.top1`` with
larger query blocks. Imported only when ``impl="fast"`` is asked for or ``"auto"`` meets a CUDA tensor.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from ..config_base import ConfigError
from ..ops.top1.common import NEG_INF
from .common import log_once

log = logging.getLogger(__name__)

# query rows per block of the quadratic loops on GPU (memory ~ FAST_BLOCK * T * B * H * 8 bytes)
FAST_BLOCK = 1024
# device types the fast path runs on; the interpreter test tier (tests/interp) adds "cpu"
KERNEL_DEVICES: tuple[str, ...] = ("cuda",)
TILE_BACKENDS = ("triton", "sdpa")


def _log_once(msg: str, level: int = logging.INFO) -> None:
    log_once(log, msg, level)


@functools.cache
def triton_import_error() -> str | None:
    """``None`` if Triton (and so the tile kernel) imports, else why not. Checked once per process."""
    try:
        from . import top1_triton  # noqa: F401
    except (ImportError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def tile_backend(device: torch.device) -> str:
    """``"triton"`` for a tensor on a kernel device (``KERNEL_DEVICES``) where Triton imports (logged once),
    else ``"sdpa"``: gather + SDPA runs on any device, so the CUDA path's math stays testable on CPU
    without importing Triton."""
    if device.type not in KERNEL_DEVICES:
        return "sdpa"
    err = triton_import_error()
    if err is None:
        _log_once("Top-1 Chunk fast path: in-chunk attention on the Triton tile kernel")
        return "triton"
    _log_once(f"Top-1 Chunk fast path: Triton does not import ({err}); in-chunk attention on gather + SDPA", logging.WARNING)
    return "sdpa"


def tile_settings(tile_rows: int, device: torch.device, backend: str | None = None) -> dict:
    """The ``ChunkSettings`` fields of a tile backend (default: :func:`tile_backend` for ``device``)."""
    backend = backend or tile_backend(device)
    if backend == "triton":
        from .top1_triton import kernel_tile_rows, tile_attention_rows

        return {"tile_fn": tile_attention_rows, "tile_rows": kernel_tile_rows(tile_rows)}
    if backend == "sdpa":
        return {"tile_kernel": sdpa_tile_attention, "tile_rows": tile_rows}
    raise ValueError(f"tile backend must be one of {TILE_BACKENDS}, got {backend!r}")


def resolve_impl(name: str, impl: str, x: torch.Tensor) -> str:
    """``"fast"`` for a CUDA input when the config says "fast" or "auto" (the path needs no extra
    library: without Triton it runs gather + SDPA); "auto" elsewhere is "chunked", and "fast" elsewhere
    is a configuration error."""
    if impl not in ("fast", "auto"):
        return impl
    if x.device.type not in KERNEL_DEVICES:
        if impl == "fast":
            raise ConfigError(f"{name}.impl: impl='fast' is the CUDA path; use 'chunked' or 'auto' on {x.device}")
        return "chunked"
    _log_once(f"impl={impl!r} on {x.device.type}: the Top-1 selection mixers run their CUDA path ('fast')")
    return "fast"


def sdpa_tile_attention(
    qt: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, mask: torch.Tensor, scale: float, need_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as ``ops.top1.tile.tile_attention``: ``qt [N, Q, D]``, ``kt, vt [N, C, D]``, ``mask [N, Q, C]``.
    SDPA does not return the logsumexp, so when it is needed (Exact's selector gradient, the forced
    own chunk) it is computed by one extra batched matmul."""
    o = F.scaled_dot_product_attention(qt[:, None], kt[:, None], vt[:, None], attn_mask=mask[:, None], scale=scale)[:, 0]
    lse = None
    if need_lse:
        s = torch.bmm(qt.float() * scale, kt.float().transpose(1, 2)).masked_fill(~mask, NEG_INF)
        lse = s.logsumexp(-1).to(qt.dtype)
    return o, lse
