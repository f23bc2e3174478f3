"""The CPU form of the short convolution (shifted multiply-adds, hand-written backward) against F.conv1d."""

import pytest
import torch
import torch.nn.functional as F

from basecap.ops.short_conv import ShortConv, _ShiftConv, causal_depthwise_conv


def _conv1d(x, weight, pad):
    xp = torch.cat([pad, x], dim=1)
    return F.conv1d(xp.transpose(1, 2), weight, groups=x.shape[2]).transpose(1, 2)


def _shift(x, weight, pad):
    return causal_depthwise_conv(torch.cat([pad, x], dim=1), weight)


@pytest.mark.parametrize("K,T", [(1, 5), (2, 1), (4, 1), (4, 3), (4, 11), (3, 7)])
def test_shift_form_matches_conv1d_outputs_and_gradients(K, T):
    g = torch.Generator().manual_seed(K * 100 + T)
    x = torch.randn(2, T, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(5, 1, K, dtype=torch.float64, generator=g, requires_grad=True)
    pad = torch.randn(2, K - 1, 5, dtype=torch.float64, generator=g, requires_grad=True)
    dy = torch.randn(2, T, 5, dtype=torch.float64, generator=g)
    ours, ref = _shift(x, w, pad), _conv1d(x, w, pad)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(ours, (x, w, pad), dy), torch.autograd.grad(ref, (x, w, pad), dy)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_shift_form_gradcheck():
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, dtype=torch.float64, generator=g, requires_grad=True) for s in ((2, 9, 3), (3, 4))]
    assert torch.autograd.gradcheck(_ShiftConv.apply, args)


def test_short_conv_decode_matches_prefill_and_fp32_matches_conv1d():
    torch.manual_seed(0)
    conv = ShortConv(6, 4)
    x = torch.randn(2, 9, 6)
    y_full, _ = conv(x)
    ref = F.silu(_conv1d(x, conv.weight, x.new_zeros(2, 3, 6)))
    torch.testing.assert_close(y_full, ref, rtol=1e-5, atol=1e-6)
    cache, outs = conv.init_cache(2), []
    for t in (x[:, :2], x[:, 2:3], x[:, 3:9]):  # a prefill shorter than the kernel, one token, the rest
        y, cache = conv(t, cache)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), y_full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache, x[:, -3:])
