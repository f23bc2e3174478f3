"""Top-1 Chunk's Triton tile kernel on a GPU (what the interpreter tier cannot show: that it compiles,
fits in shared memory and computes in fp32 and bf16 on the device), at the paper's chunk length and
head size. Run by ``scripts/gpu_check.sh``; skipped without CUDA (a skip there fails the script)."""

from __future__ import annotations

import pytest
import torch

from basecap.kernels import top1_cuda
from basecap.mixers import build_mixer, parse_mixer_config
from basecap.ops.top1 import ChunkSettings, attend_selected

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def rel(a, b) -> float:
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference in fp32 (the kernel follows this switch)
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("dtype,tol_out,tol_grad", [(torch.float32, 1e-4, 1e-4), (torch.bfloat16, 2e-2, 5e-2)])
@pytest.mark.parametrize("T,C,D,tile_rows", [(4096, 128, 64, 64), (1000, 100, 128, 32), (333, 64, 64, 16)])
def test_tile_kernel_on_gpu(dtype, tol_out, tol_grad, T, C, D, tile_rows):
    """The kernel (``tile_fn``) against the CPU path's tile Function run on the GPU in fp32: output, lse and
    the gradients of q, k, v through both; bf16 inputs against the fp32 reference."""
    g = torch.Generator(device="cuda").manual_seed(0)
    B, H = 2, 4
    q, k, v = (torch.randn(B, H, T, D, device="cuda", generator=g) for _ in range(3))
    pos = torch.arange(T, device="cuda")
    sel = torch.minimum(torch.randint(0, T // C + 1, (B, H, T), device="cuda", generator=g), pos // C)
    sel[0, 0, :7] = -1
    g_o, g_lse = torch.randn(q.shape, device="cuda", generator=g), torch.randn(sel.shape, device="cuda", generator=g)
    res = []
    for x_dtype, tiles in ((torch.float32, {"tile_rows": tile_rows}),
                           (dtype, top1_cuda.tile_settings(tile_rows, q.device, "triton"))):
        qi, ki, vi = (t.to(x_dtype).requires_grad_() for t in (q, k, v))
        o, lse = attend_selected(qi, ki, vi, sel, pos, ChunkSettings(D**-0.5, C, **tiles), True)
        loss = (o.float() * g_o).sum() + (torch.where(sel >= 0, lse.float(), 0.0) * g_lse).sum()
        res.append((o, lse, torch.autograd.grad(loss, (qi, ki, vi))))
    (o_ref, lse_ref, g_ref), (o, lse, grads) = res
    ok = sel >= 0
    assert rel(o, o_ref) < tol_out and rel(lse[ok], lse_ref[ok]) < tol_out
    assert torch.isinf(lse[~ok]).all()
    for a, b in zip(grads, g_ref):
        assert rel(a, b) < tol_grad


@pytest.mark.parametrize("cfg", [{"selection": "approx"}, {"selection": "exact", "own_chunk": "always"}])
def test_kernel_and_sdpa_backends_agree_under_autocast(monkeypatch, cfg):
    """bf16 autocast (the training setting): the Triton backend against the gather + SDPA fallback, same
    weights and so the same selections (both select from the same bf16 q, k in float64)."""
    cfg = {"name": "top1_chunk", "impl": "fast", "chunk_len": 128, **cfg}
    torch.manual_seed(0)
    m = build_mixer(parse_mixer_config(cfg), 512).cuda()
    x = torch.randn(2, 2048, 512, device="cuda")
    out = {}
    for backend in top1_cuda.TILE_BACKENDS:
        monkeypatch.setattr(top1_cuda, "tile_backend", lambda device, b=backend: b)
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y, _ = m(xi)
        out[backend] = (y.float(), torch.autograd.grad(y.float().square().sum(), [xi, *m.parameters()]))
    (y, g), (y_ref, g_ref) = out["triton"], out["sdpa"]
    assert rel(y, y_ref) < 3e-2  # the SDPA backend rounds its lse to bf16 before the own-chunk merge
    assert rel(torch.cat([t.flatten() for t in g]), torch.cat([t.flatten() for t in g_ref])) < 6e-2


def test_auto_picks_the_kernel_on_gpu():
    assert top1_cuda.tile_backend(torch.device("cuda")) == "triton"
