"""The LM head's CUDA path (``kernels/linear_ce.py``, ``impl="fast"``): flash-linear-attention's fused
linear cross-entropy (Triton), interpreted on CPU, against the chunked PyTorch form (``ops/linear_ce.py``):
loss, the gradients of the hidden states and of the weight; ignored targets, both reductions, the
model's leading dimensions."""

from __future__ import annotations

import pytest
import torch

from basecap.kernels.linear_ce import lm_head_loss, resolve_head_impl

TOL = 1e-5  # fp32 on both sides (measured <= 4e-7)


def rel(a, b) -> float:
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_head_matches_chunked(launches, reduction):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 50, 32, generator=gen).requires_grad_()
    weight = (0.1 * torch.randn(300, 32, generator=gen)).requires_grad_()
    targets = torch.randint(0, 300, (2, 50), generator=gen)
    targets[0, :7] = -100
    assert resolve_head_impl("auto", hidden, reduction) == "fast"  # a training loss on a kernel device
    res = {}
    for impl in ("chunked", "fast"):
        loss = lm_head_loss(hidden, weight, targets, impl=impl, reduction=reduction)
        res[impl] = (loss, torch.autograd.grad(loss, (hidden, weight)))
    (l_ref, g_ref), (loss, grads) = res["chunked"], res["fast"]
    errs = [rel(loss, l_ref), *(rel(a, b) for a, b in zip(grads, g_ref))]
    print(f"fused head ({reduction}): loss {errs[0]:.1e}, grad hidden {errs[1]:.1e}, grad weight {errs[2]:.1e}")
    assert max(errs) < TOL
    assert any(k.startswith("fla.modules.fused") for k in launches), dict(launches)


def test_fused_head_mean_of_all_ignored_is_zero():
    """The documented difference from torch: fla's "mean" over no target is 0, not NaN."""
    hidden, weight = torch.randn(4, 32, requires_grad=True), torch.randn(40, 32)
    loss = lm_head_loss(hidden, weight, torch.full((4,), -100), impl="fast")
    assert float(loss) == 0.0
