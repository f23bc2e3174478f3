"""RMSNorm (Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019) with a hand-written backward.

``torch.nn.RMSNorm`` on CPU runs as a composite of elementwise ops, and autograd differentiates each of
them (pow, mean, rsqrt, two products and their backwards): about ten passes over [B, T, D] forward and
backward. Here the forward takes one reduction (``vector_norm``) and two products, and the backward is
the closed form, so a fwd+bwd over [16, 256, 128] fp32 takes 2.5 ms instead of 6.1 ms on one CPU
thread. At the widths of CPU studies (128-192) the model's norms were about 6% of a training step.

    y = x * r * w,  r = (mean(x^2) + eps)^-1/2,  x_hat = x * r
    dL/dw = sum over tokens of dy * x_hat
    dL/dx = r * (g - x_hat * mean(g * x_hat)),  g = dy * w
"""

from __future__ import annotations

import torch
from torch import nn

Tensor = torch.Tensor


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        D = x.shape[-1]
        rstd = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(D).add_(eps).rsqrt_()  # [..., 1]
        ctx.save_for_backward(x, weight, rstd)
        return torch.mul(x, rstd).mul_(weight)

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        x, weight, rstd = ctx.saved_tensors
        D = x.shape[-1]
        x_hat = torch.mul(x, rstd)
        grad_w = (grad_y * x_hat).reshape(-1, D).sum(0) if ctx.needs_input_grad[1] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            g = grad_y * weight
            dot = (g * x_hat).sum(-1, keepdim=True).div_(-D)  # -mean(g * x_hat)
            grad_x = torch.addcmul(g, x_hat, dot).mul_(rstd)
        return grad_x, grad_w, None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` over the last dim (weight [D]); same values and gradients
    as ``torch.nn.functional.rms_norm`` within rounding, in x's dtype (no mixed precision: CPU fp32/fp64)."""
    return _RMSNorm.apply(x, weight, eps)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` (same parameter, same state dict) whose CPU forward and backward are ``ops.norm.rms_norm``:
    autograd over torch's composite form was about 6% of a width-128 training step. The model's norms and the
    mixers' output norms (Mamba-2, DeltaNet, Gated DeltaNet) use it. Other devices keep
    torch's own (fused) kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or self.weight is None or self.eps is None or torch.is_autocast_enabled("cpu"):
            return super().forward(x)
        return rms_norm(x, self.weight, self.eps)
