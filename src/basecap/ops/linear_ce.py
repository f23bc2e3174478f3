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

# Logits per chunk when ``chunk_tokens`` is not given: 8 MiB in fp32 (256 tokens at V = 8192). On one
# thread 4-8 MiB chunks were fastest (2 MiB and 32 MiB slower); on a CPU shared with other jobs,
# two threads ran the smaller chunks' many ops with large stalls, so the larger of the two.
CHUNK_LOGITS = 1 << 21
REDUCTIONS = ("mean", "sum", "none")


def default_chunk_tokens(vocab_size: int) -> int:
    return max(1, CHUNK_LOGITS // vocab_size)


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """fp32 unless an input is float64: bf16/fp16 inputs (autocast) still get fp32 logits and softmax."""
    return torch.promote_types(torch.promote_types(hidden.dtype, weight.dtype), torch.float32)


def _targets(hidden: Tensor, w: Tensor, targets: Tensor, ignore_index: int):
    """Non-ignored mask [N], targets with ignored ones set to class 0 [N], and the target logits
    hidden_i . w[t_i] [N], all tokens at once (per-chunk small ops cost more than their arithmetic)."""
    valid = targets != ignore_index
    t_safe = torch.where(valid, targets, 0)
    target_logit = (hidden * w.index_select(0, t_safe)).sum(1)
    return valid, t_safe, target_logit


def _forward(hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int, ignore_index: int, grad_hidden: bool, grad_weight: bool):
    """Per-token losses [N] (0 where ignored) and log-sum-exps [N] in fp32 (float64 for float64 inputs),
    plus the unscaled folded gradients (sums over tokens of d loss_i / d hidden and d loss_i / d weight)
    asked for.

    Each chunk's logits are the only [C, V] buffer, one allocation reused by every chunk (a fresh one per
    chunk cost about 20% of the head's time on CPU: large blocks come from the allocator as new pages,
    faulted in on first touch): max, exp and softmax are taken in place on it, and with a gradient it
    becomes d loss_i / d logits = softmax - onehot (zero on ignored rows). Few ops per chunk on purpose:
    on a shared CPU every op can wait for a busy OpenMP thread."""
    dt = _compute_dtype(hidden, weight)
    hidden, w = hidden.to(dt), weight.to(dt)
    N = hidden.shape[0]
    valid, t_safe, target_logit = _targets(hidden, w, targets, ignore_index)
    neg_valid = -valid.to(dt)[:, None]  # [N, 1]: the onehot subtracted from the softmax
    row_max = hidden.new_empty(N, 1)
    row_sum = hidden.new_empty(N, 1)
    grad = grad_hidden or grad_weight
    if grad:  # the softmax divides by the row sum; by inf on ignored rows, which zeroes them
        inf = hidden.new_tensor(float("inf"))
    gh = hidden.new_empty(hidden.shape) if grad_hidden else None  # [N, D]
    gw = torch.zeros_like(w) if grad_weight else None  # [V, D]
    buf = hidden.new_empty(min(chunk, N), w.shape[0])  # [C, V]
    for s in range(0, N, chunk):
        e = min(s + chunk, N)
        h = hidden[s:e]  # [C, D]
        logits = torch.mm(h, w.t(), out=buf[: e - s])  # [C, V]
        torch.amax(logits, dim=1, keepdim=True, out=row_max[s:e])
        torch.sum(logits.sub_(row_max[s:e]).exp_(), dim=1, keepdim=True, out=row_sum[s:e])
        if not grad:
            continue
        g = logits.div_(torch.where(valid[s:e, None], row_sum[s:e], inf))
        g.scatter_add_(1, t_safe[s:e, None], neg_valid[s:e])
        if gh is not None:
            torch.mm(g, w, out=gh[s:e])
        if gw is not None:
            gw.addmm_(g.t(), h)
    lse = (row_max + row_sum.log_()).squeeze(1)
    losses = torch.where(valid, lse - target_logit, 0.0)
    return losses, lse, gh, gw


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
        out_dtypes, dt = (hidden.dtype, weight.dtype), lses.dtype
        hidden, w, grad_out = hidden.to(dt), weight.to(dt), grad_out.to(dt)
        gh = torch.empty_like(hidden) if need_h else None
        gw = torch.zeros_like(w) if need_w else None
        valid = targets != ctx.ignore_index
        t_safe = torch.where(valid, targets, 0)[:, None]  # [N, 1]
        row_scale = torch.where(valid, grad_out, 0)[:, None]  # [N, 1]
        neg_valid = -valid.to(dt)[:, None]
        N = hidden.shape[0]
        buf = hidden.new_empty(min(ctx.chunk, N), w.shape[0])  # [C, V], reused by every chunk
        for s in range(0, N, ctx.chunk):
            e = min(s + ctx.chunk, N)
            h = hidden[s:e]  # [C, D]
            g = torch.mm(h, w.t(), out=buf[: e - s]).sub_(lses[s:e, None]).exp_()  # softmax, recomputed [C, V]
            g.scatter_add_(1, t_safe[s:e], neg_valid[s:e]).mul_(row_scale[s:e])
            if gh is not None:
                torch.mm(g, w, out=gh[s:e])
            if gw is not None:
                gw.addmm_(g.t(), h)
        return (gh.to(out_dtypes[0]) if gh is not None else None, gw.to(out_dtypes[1]) if gw is not None else None, None, None, None)


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, chunk_tokens: int | None = None, ignore_index: int = -100, reduction: str = "mean"
) -> Tensor:
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
