"""The LM head's loss: the chunked PyTorch form (``ops/linear_ce.py``) or, on CUDA, flash-linear-attention's
fused Triton kernel (``fla.modules.fused_linear_cross_entropy_loss``, same chunk-and-fold scheme); "plain"
materialises the logits (the reference).

fla's kernel reduces to a scalar ("mean"/"sum") and always does the gradient work, so "auto" takes it
only for a training loss (grad mode on, a reduced loss) on CUDA when fla imports; evaluation (no grad,
or per-token losses) runs the chunked form on every device. One difference from torch: fla returns 0,
not NaN, for the "mean" of a batch whose every target is ignored.

Nothing here imports fla or Triton unless a CUDA input asks for the fast path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config_base import ConfigError
from ..ops.linear_ce import linear_cross_entropy

IMPLS = ("plain", "chunked", "fast", "auto")


def resolve_head_impl(impl: str, hidden: torch.Tensor, reduction: str = "mean") -> str:
    """``"fast"``, ``"chunked"`` or ``"plain"``; depends on the device, the installation, the reduction and
    grad mode only."""
    if impl not in IMPLS:
        raise ConfigError(f"head impl must be one of {IMPLS}, got {impl!r}")
    if impl in ("plain", "chunked"):
        return impl
    if reduction == "none" or not torch.is_grad_enabled():
        if impl == "fast" and reduction == "none":
            raise ConfigError("head impl='fast': fla's fused linear cross-entropy returns only a reduced loss; use 'chunked' for per-token losses")
        return "chunked"
    from .fla import resolve_impl  # imports fla (Triton) only for a CUDA input

    return resolve_impl("head", impl, hidden)


def lm_head_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    impl: str = "auto",
    chunk_tokens: int | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T`` against ``targets`` (hidden [..., D], weight [V, D], targets [...])
    without materialising the logits (see :func:`basecap.ops.linear_ce.linear_cross_entropy`), or with
    ``impl="plain"`` the whole [..., V] logits and ``F.cross_entropy``, the reference and the "before" of
    speed comparisons."""
    D = hidden.shape[-1]
    impl = resolve_head_impl(impl, hidden, reduction)
    if impl == "plain":
        logits = hidden.reshape(-1, D) @ weight.T  # [N, V]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 (autocast) -> fp32
        loss = F.cross_entropy(logits, targets.reshape(-1), ignore_index=ignore_index, reduction=reduction)
        return loss.view(targets.shape) if reduction == "none" else loss
    if impl == "chunked":
        return linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk_tokens, ignore_index=ignore_index, reduction=reduction)
    from fla.modules.fused_linear_cross_entropy import fused_linear_cross_entropy_loss

    return fused_linear_cross_entropy_loss(hidden.reshape(-1, D), targets.reshape(-1), weight, ignore_index=ignore_index, reduction=reduction)
