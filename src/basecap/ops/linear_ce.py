"""LM head and cross-entropy fused over token chunks, so the [N, V] logits never exist whole.

The idea of Liger Kernel (Hsu et al., "Liger Kernel: Efficient Triton Kernels for LLM Training",
2024) and flash-linear-attention's ``FusedLinearCrossEntropyLoss``, written in plain PyTorch: for
each chunk of tokens, compute its logits in fp32, their log-sum-exp and loss, and (when a gradient is
needed) the logits' gradient ``softmax - onehot`` right away, folding it into ``grad_hidden`` and
``grad_weight`` before the next chunk. Backward then only scales those by the incoming gradient.
Peak extra memory is one chunk of logits instead of the whole [N, V] (plus its log-softmax and
gradient in the plain form).

``reduction="none"`` (per-token losses) cannot fold its gradient ahead, since each token's weight
arrives only in backward; it keeps the log-sum-exp and recomputes each chunk's logits in backward.

Semantics are those of ``F.cross_entropy(hidden @ weight.T, targets, ignore_index=..., reduction=...)``:
ignored tokens have zero loss and gradient, "mean" divides by the number of non-ignored tokens (NaN
when there is none, with zero gradients, as torch gives).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

CHUNK_LOGITS = 1 << 20  # logits per chunk when ``chunk_tokens`` is not given: 4 MiB in fp32 (docs/performance.md)
REDUCTIONS = ("mean", "sum", "none")


def default_chunk_tokens(vocab_size: int) -> int:
    return max(1, CHUNK_LOGITS // vocab_size)


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """fp32 unless an input is float64: bf16/fp16 inputs (autocast) still get fp32 logits and softmax."""
    return torch.promote_types(torch.promote_types(hidden.dtype, weight.dtype), torch.float32)


def _chunk(h: Tensor, w: Tensor, t: Tensor, ignore_index: int, grad: bool):
    """One chunk of tokens: per-token loss [C] (0 where ignored), log-sum-exp [C] and, with ``grad``,
    d loss_i / d logits = softmax - onehot [C, V], zero on ignored rows.

    Works in place on the chunk's logits, the only [C, V] buffer (``torch.logsumexp`` would add a second)."""
    logits = h @ w.t()  # [C, V]
    valid = t != ignore_index
    t_safe = torch.where(valid, t, 0)
    target_logit = logits.gather(1, t_safe[:, None])  # [C, 1], a copy
    m = logits.amax(dim=1, keepdim=True)
    e = logits.sub_(m).exp_()
    s = e.sum(dim=1, keepdim=True)
    lse = m + s.log()
    loss = torch.where(valid, (lse - target_logit).squeeze(1), 0.0)
    if not grad:
        return loss, lse.squeeze(1), None
    g = e.div_(torch.where(valid[:, None], s, torch.inf))  # softmax; an ignored row divides to zero
    g.scatter_add_(1, t_safe[:, None], -valid.to(g.dtype)[:, None])
    return loss, lse.squeeze(1), g


def _chunk_grad(h: Tensor, w: Tensor, t: Tensor, lse: Tensor, row_scale: Tensor, ignore_index: int) -> Tensor:
    """d (sum_i row_scale_i loss_i) / d logits [C, V] of one chunk, recomputed from its log-sum-exp."""
    valid = t != ignore_index
    g = (h @ w.t()).sub_(lse[:, None]).exp_()
    g.scatter_add_(1, torch.where(valid, t, 0)[:, None], -valid.to(g.dtype)[:, None])
    return g.mul_(torch.where(valid, row_scale, 0)[:, None])


def _forward(hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int, ignore_index: int, grad_hidden: bool, grad_weight: bool):
    """Per-token losses [N] and log-sum-exps [N] (fp32 or float64), plus unscaled folded gradients
    (sums over tokens of d loss_i / d hidden and d loss_i / d weight) for those asked for."""
    dt = _compute_dtype(hidden, weight)
    N = hidden.shape[0]
    w = weight.to(dt)
    losses = hidden.new_empty(N, dtype=dt)
    lses = hidden.new_empty(N, dtype=dt)
    gh = hidden.new_empty(hidden.shape, dtype=dt) if grad_hidden else None  # [N, D]
    gw = torch.zeros_like(w) if grad_weight else None  # [V, D]
    for s in range(0, N, chunk):
        e = min(s + chunk, N)
        h = hidden[s:e].to(dt)  # [C, D]
        losses[s:e], lses[s:e], g = _chunk(h, w, targets[s:e], ignore_index, gh is not None or gw is not None)
        if g is None:
            continue
        if gh is not None:
            torch.mm(g, w, out=gh[s:e])
        if gw is not None:
            gw.addmm_(g.t(), h)
    return losses, lses, gh, gw


def _reduce(losses: Tensor, targets: Tensor, ignore_index: int, reduction: str) -> tuple[Tensor, Tensor | None]:
    """Scalar loss and the factor its per-token gradients carry (None: 1). A "mean" over no token is
    0/0 = NaN as in torch; its gradients are all zero anyway, so the factor's clamp changes nothing."""
    total = losses.sum()
    if reduction == "sum":
        return total, None
    count = (targets != ignore_index).sum().to(total.dtype)  # a tensor: no host sync on CUDA
    return total / count, 1.0 / count.clamp_min(1)


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss reduced to a scalar ("mean" or "sum"); gradients folded in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, ignore_index, reduction):
        with torch.autocast(hidden.device.type, enabled=False):
            losses, _, gh, gw = _forward(hidden, weight, targets, chunk, ignore_index, *ctx.needs_input_grad[:2])
        total, scale = _reduce(losses, targets, ignore_index, reduction)
        if scale is not None:
            gh = gh.mul_(scale) if gh is not None else None
            gw = gw.mul_(scale) if gw is not None else None
        ctx.save_for_backward(gh, gw)
        ctx.dtypes = hidden.dtype, weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_out):
        gh, gw = ctx.saved_tensors
        dh = (gh * grad_out).to(ctx.dtypes[0]) if gh is not None else None
        dw = (gw * grad_out).to(ctx.dtypes[1]) if gw is not None else None
        return dh, dw, None, None, None, None


class _LinearCrossEntropyPerToken(torch.autograd.Function):
    """Per-token losses (``reduction="none"``); backward recomputes each chunk's logits."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, ignore_index):
        with torch.autocast(hidden.device.type, enabled=False):
            losses, lses, _, _ = _forward(hidden, weight, targets, chunk, ignore_index, False, False)
        ctx.save_for_backward(hidden, weight, targets, lses)
        ctx.chunk, ctx.ignore_index = chunk, ignore_index
        return losses

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lses = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        dt = lses.dtype
        w = weight.to(dt)
        grad_out = grad_out.to(dt)
        gh = torch.empty(hidden.shape, dtype=dt, device=hidden.device) if need_h else None
        gw = torch.zeros_like(w) if need_w else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            e = min(s + ctx.chunk, hidden.shape[0])
            h = hidden[s:e].to(dt)
            g = _chunk_grad(h, w, targets[s:e], lses[s:e], grad_out[s:e], ctx.ignore_index)  # [C, V]
            if gh is not None:
                torch.mm(g, w, out=gh[s:e])
            if gw is not None:
                gw.addmm_(g.t(), h)
        return (gh.to(hidden.dtype) if gh is not None else None, gw.to(weight.dtype) if gw is not None else None,
                None, None, None)


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, *, chunk_tokens: int | None = None,
                         ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """``F.cross_entropy(hidden @ weight.T, targets)`` without materialising the logits.

    hidden [..., D], weight [V, D] (an ``nn.Linear`` head's or a tied embedding's), targets [...] (int).
    Returns a scalar for "mean"/"sum" and losses shaped like ``targets`` for "none", in fp32 (float64
    for float64 inputs) whatever the input dtype. ``chunk_tokens`` tokens are processed at a time
    (default: :data:`CHUNK_LOGITS` logits per chunk). Without grad mode (evaluation) no gradient work is done.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    D = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != D:
        raise ValueError(f"weight must be [V, {D}] for hidden [..., {D}], got {list(weight.shape)}")
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets {list(targets.shape)} must match hidden's leading dims {list(hidden.shape[:-1])}")
    chunk = chunk_tokens if chunk_tokens is not None else default_chunk_tokens(weight.shape[0])
    if chunk < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk}")
    shape = targets.shape
    h, t = hidden.reshape(-1, D), targets.reshape(-1)
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        with torch.autocast(hidden.device.type, enabled=False):
            losses = _forward(h, weight, t, chunk, ignore_index, False, False)[0]
        return losses.view(shape) if reduction == "none" else _reduce(losses, t, ignore_index, reduction)[0]
    if reduction == "none":
        return _LinearCrossEntropyPerToken.apply(h, weight, t, chunk, ignore_index).view(shape)
    return _LinearCrossEntropy.apply(h, weight, t, chunk, ignore_index, reduction)
