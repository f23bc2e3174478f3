"""Top-1 Chunk's CUDA path on its Triton tile kernel (``kernels/top1_triton.py``), interpreted on CPU,
against the dense reference (``impl="ref"``): Exact and Approx, own chunk a candidate or always attended,
with and without the selector's straight-through gradient; outputs and every gradient, then prefill +
decode from the KV cache. The kernel itself against the CPU path's tile Function (``_TileAttention``)
with the log-sum-exp's gradient, a gate, unselected queries, the projection's [B, T, H, D] query rows and
a strided decode cache."""

from __future__ import annotations

import time

import pytest
import torch

from basecap.kernels import top1_cuda, top1_triton
from basecap.mixers import build_mixer, mixer_class, parse_mixer_config
from basecap.ops.top1 import ChunkSettings, append_time, attend_selected

D_MODEL = 32
TOL_OUT, TOL_GRAD = 1e-5, 1e-5  # fp32 on both sides: summation order only (measured <= 4e-7)
VARIANTS = mixer_class("top1_chunk").test_variants  # both selections x both own-chunk modes, C = 5, 6, 8
KERNELS = {"basecap.kernels.top1_triton._tile_fwd", "basecap.kernels.top1_triton._tile_bwd"}


def rel(a, b) -> float:
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _pair(cfg: dict):
    cfg = {"name": "top1_chunk", **cfg}
    torch.manual_seed(0)
    ref = build_mixer(parse_mixer_config(dict(cfg, impl="ref")), D_MODEL)
    fast = build_mixer(parse_mixer_config(dict(cfg, impl="fast")), D_MODEL)
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def training_errors(ref, fast, T: int = 37) -> dict:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, T, D_MODEL, generator=gen)
    w = torch.randn(2, T, D_MODEL, generator=gen)
    out = {}
    for key, m in (("ref", ref), ("fast", fast)):
        xi = x.clone().requires_grad_()
        y, _ = m(xi)
        names, params = zip(*m.named_parameters())
        out[key] = (y, dict(zip(("x", *names), torch.autograd.grad((y * w).sum(), [xi, *params]))))
    (y_ref, g_ref), (y, g) = out["ref"], out["fast"]
    return {"output": rel(y, y_ref), **{f"grad {k}": rel(g[k], g_ref[k]) for k in g_ref}}


def _check(errs: dict, what: str) -> None:
    bad = {k: e for k, e in errs.items() if e > (TOL_GRAD if k.startswith("grad") else TOL_OUT)}
    assert not bad, f"{what}: " + ", ".join(f"{k} {e:.1e}" for k, e in bad.items())


@pytest.mark.parametrize("variant", range(len(VARIANTS)), ids=[str(v) for v in VARIANTS])
def test_fast_training_matches_reference(launches, variant):
    ref, fast = _pair(VARIANTS[variant])
    t0 = time.perf_counter()
    errs = training_errors(ref, fast)
    print(f"top1_chunk {VARIANTS[variant]}: {time.perf_counter() - t0:.1f} s, max error "
          f"{max(errs.values()):.1e} ({max(errs, key=errs.get)})")
    _check(errs, f"variant {VARIANTS[variant]}")
    parts = 2 if fast.cfg.own_chunk == "always" else 1  # the selected chunk, then the own chunk
    assert {k: n for k, n in launches.items() if k in KERNELS} == {k: parts for k in KERNELS}, dict(launches)


@pytest.mark.parametrize("variant", [1, 2], ids=[str(VARIANTS[i]) for i in (1, 2)])
def test_fast_prefill_and_decode_match_reference(launches, variant):
    """Prefill 20 tokens, decode 1, 1 and 7 from the cache (Approx also carries its per-chunk key sums):
    outputs against one reference forward over all 29."""
    ref, fast = _pair(VARIANTS[variant])
    x = torch.randn(2, 29, D_MODEL, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y_ref, _ = ref(x)
        state, ys = fast.init_state(2), []
        for a, b in ((0, 20), (20, 21), (21, 22), (22, 29)):
            y, state = fast(x[:, a:b], state)
            ys.append(y)
    err = rel(torch.cat(ys, 1), y_ref)
    print(f"top1_chunk {VARIANTS[variant]} prefill + decode: {err:.1e}")
    assert err < TOL_OUT
    assert launches["basecap.kernels.top1_triton._tile_fwd"] >= 4


def _tile_inputs(T: int = 70, B: int = 2, H: int = 2, D: int = 8):
    """q in the projection's [B, T, H, D] memory (rows indexed), k as a strided decode-cache view, some
    queries without a selection (-1)."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, T, H, D, generator=gen).transpose(1, 2).requires_grad_()
    k0, v0 = (torch.randn(B, H, T, D, generator=gen) for _ in range(2))
    with torch.no_grad():
        k_cache = append_time(k0[:, :, :40], k0[:, :, 40:])
    assert not k_cache.is_contiguous()
    k, v = k0.clone().requires_grad_(), v0.clone().requires_grad_()
    pos = torch.arange(T)
    sel = torch.minimum(torch.randint(0, 9, (B, H, T), generator=gen), pos // 8)
    sel[0, 0, :5] = -1
    return q, k, v, k_cache, pos, sel


@pytest.mark.parametrize("with_gate,dtype,tol", [(False, torch.float32, 1e-5), (True, torch.float32, 1e-5),
                                                 (True, torch.float16, 2e-3)])
def test_tile_kernel_matches_cpu_tile_function(launches, with_gate, dtype, tol):
    """``attend_selected`` with the kernel (``tile_fn``) against the CPU Function in fp32: output, lse, and
    the gradients of q, k, v (through the output and the lse) and of the gate; fp16 (the 16-bit code path:
    operands rounded, fp32 accumulation) against the fp32 reference."""
    q, k, v, k_cache, pos, sel = _tile_inputs()
    g_o, g_lse = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)), torch.randn(sel.shape)
    res = []
    for x_dtype, tiles in ((torch.float32, {"tile_rows": 16}), (dtype, top1_cuda.tile_settings(16, q.device, "triton"))):
        qi, ki, vi = (t.detach().to(x_dtype).requires_grad_() for t in (q, k, v))
        gate = torch.ones(sel.shape, dtype=x_dtype, requires_grad=True) if with_gate else None
        o, lse = attend_selected(qi, ki, vi, sel, pos, ChunkSettings(0.3, 8, **tiles), True, gate)
        assert o.dtype == lse.dtype == x_dtype
        loss = (o.float() * g_o).sum() + (torch.where(sel >= 0, lse.float(), 0.0) * g_lse).sum()
        grads = torch.autograd.grad(loss, (qi, ki, vi, *([gate] if with_gate else [])))
        with torch.no_grad():  # the decode cache: a strided view of a larger buffer
            o_cache, _ = attend_selected(qi, k_cache.to(x_dtype), vi, sel, pos, ChunkSettings(0.3, 8, **tiles), True)
        res.append((o, lse, grads, o_cache))
    (o_ref, lse_ref, g_ref, oc_ref), (o, lse, grads, oc) = res
    errs = {"output": rel(o, o_ref), "cache output": rel(oc, oc_ref), "lse": rel(lse[sel >= 0], lse_ref[sel >= 0]),
            **{f"grad {n}": rel(a, b) for n, a, b in zip(("q", "k", "v", "gate"), grads, g_ref)}}
    print(f"tile kernel {dtype} gate={with_gate}: " + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    assert max(errs.values()) < tol, errs
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)) and not o[sel < 0].any()
    assert launches["basecap.kernels.top1_triton._tile_bwd"] == 1


def test_a_lse_without_gradient_is_caught(monkeypatch):
    """A broken wiring: the kernel's log-sum-exp handed back without its gradient (as from
    ``parallel_nsa_fwd``, whose lse is not differentiable). Exact's selector gradient and the merge with
    the own chunk flow through it, so the mixer's gradients miss the reference by far."""
    fn = top1_triton.tile_attention_rows

    def lse_detached(*args):
        o, lse = fn(*args)
        return o, lse.detach()

    monkeypatch.setattr(top1_triton, "tile_attention_rows", lse_detached)
    ref, fast = _pair(VARIANTS[2])  # Exact, own chunk always attended
    errs = training_errors(ref, fast)
    worst = max(v for k, v in errs.items() if k.startswith("grad"))
    print(f"lse without gradient: output {errs['output']:.1e}, worst gradient {worst:.1e}")
    assert errs["output"] < TOL_OUT and worst > 100 * TOL_GRAD


def test_tile_rows_must_suit_the_kernel():
    assert [top1_triton.kernel_tile_rows(n) for n in (1, 16, 17, 32, 64, 200)] == [16, 16, 32, 32, 64, 128]
