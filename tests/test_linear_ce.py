"""The fused chunked LM head + cross-entropy against the plain ``F.cross_entropy(hidden @ weight.T, targets)``."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from basecap.ops.linear_ce import default_chunk_tokens, linear_cross_entropy

N, D, V = 37, 8, 50
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def rel(a, b):
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def inputs(dtype=torch.float32, n=N, ignore=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, D, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(V, D, generator=g, dtype=dtype).requires_grad_()
    targets = torch.randint(0, V, (n,), generator=g)
    targets[list(ignore)] = -100
    return hidden, weight, targets


def both(hidden, weight, targets, reduction="mean", chunk=5, **kw):
    """(loss, grad_hidden, grad_weight) of the fused and of the plain form, with a random upstream gradient."""
    out = []
    for fn in (lambda: linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk, reduction=reduction, **kw),
               lambda: F.cross_entropy(hidden @ weight.T, targets, reduction=reduction, **kw)):
        loss = fn()
        up = torch.rand(loss.shape, generator=torch.Generator().manual_seed(1), dtype=loss.dtype) + 0.5
        out.append((loss.detach(), *torch.autograd.grad((loss * up).sum(), (hidden, weight))))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [1, 5, 37, 64])  # one token, N not a multiple, exactly N, larger than N
def test_matches_plain(dtype, reduction, chunk):
    fused, plain = both(*inputs(dtype, ignore=(0, 7, 8)), reduction=reduction, chunk=chunk)
    assert fused[0].dtype == dtype and fused[0].shape == plain[0].shape
    for a, b in zip(fused, plain):
        assert rel(a, b) < TOL[dtype]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ignored_tokens_and_an_all_ignored_chunk(reduction):
    hidden, weight, targets = inputs(torch.float64, ignore=range(10, 20))  # chunk 5: tokens 10-19 fill two chunks
    (loss, gh, gw), plain = both(hidden, weight, targets, reduction=reduction, chunk=5)
    assert gh[10:20].abs().max() == 0
    for a, b in zip((loss, gh, gw), plain):
        assert rel(a, b) < 1e-12
    if reduction == "none":
        assert loss[10:20].abs().max() == 0


def test_mean_divides_by_the_non_ignored_count():
    hidden, weight, targets = inputs(torch.float64, ignore=range(0, N, 2))
    s = linear_cross_entropy(hidden, weight, targets, chunk_tokens=4, reduction="sum")
    m = linear_cross_entropy(hidden, weight, targets, chunk_tokens=4)
    assert torch.allclose(m, s / (targets != -100).sum(), rtol=1e-14, atol=0)


def test_every_token_ignored_matches_torch():
    hidden, weight, targets = inputs(ignore=range(N))
    for reduction in ("mean", "sum"):
        (loss, gh, gw), (ploss, pgh, pgw) = both(hidden, weight, targets, reduction=reduction)
        assert torch.equal(loss.isnan(), ploss.isnan())  # mean of nothing: NaN in both
        assert gh.abs().max() == 0 and gw.abs().max() == 0 and pgh.abs().max() == 0


def test_other_ignore_index():
    hidden, weight, targets = inputs(torch.float64)
    targets[:4] = 3
    fused, plain = both(hidden, weight, targets, ignore_index=3)
    for a, b in zip(fused, plain):
        assert rel(a, b) < 1e-12


def test_leading_dims_are_flattened():
    hidden, weight, targets = inputs(torch.float64, n=36)
    h3, t3 = hidden.view(4, 9, D), targets.view(4, 9)
    per_token = linear_cross_entropy(h3, weight, t3, chunk_tokens=7, reduction="none")
    assert per_token.shape == (4, 9)
    assert rel(per_token, F.cross_entropy((h3 @ weight.T).flatten(0, 1), t3.flatten(), reduction="none").view(4, 9)) < 1e-12


def test_tied_weight_gets_both_gradients():
    """An embedding's weight used as the head: its gradient is the sum of the lookup's and the head's."""
    torch.manual_seed(0)
    idx, targets = torch.randint(0, V, (3, 11)), torch.randint(0, V, (3, 11))
    targets[0, :4] = -100
    grads = []
    for fused in (True, False):
        torch.manual_seed(1)
        emb, proj = nn.Embedding(V, D).double(), nn.Linear(D, D).double()
        hidden = torch.tanh(proj(emb(idx)))
        if fused:
            loss = linear_cross_entropy(hidden, emb.weight, targets, chunk_tokens=4)
        else:
            loss = F.cross_entropy((hidden @ emb.weight.T).flatten(0, 1), targets.flatten())
        loss.backward()
        grads.append((emb.weight.grad, proj.weight.grad))
    for a, b in zip(*grads):
        assert rel(a, b) < 1e-12


def test_only_the_requested_gradient():
    hidden, weight, targets = inputs()
    weight.requires_grad_(False)
    for reduction in ("mean", "none"):
        loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=8, reduction=reduction)
        (gh,) = torch.autograd.grad(loss.sum(), hidden)
        (ph,) = torch.autograd.grad(F.cross_entropy(hidden @ weight.T, targets, reduction=reduction).sum(), hidden)
        assert rel(gh, ph) < 1e-5


def test_no_grad_mode_does_no_gradient_work(monkeypatch):
    from basecap.ops import linear_ce

    hidden, weight, targets = inputs(ignore=(2,))
    calls = []
    real = linear_ce._forward
    monkeypatch.setattr(linear_ce, "_forward", lambda *a: calls.append(any(a[-2:])) or real(*a))  # a[-2:]: grad flags
    with torch.no_grad():
        for reduction in ("mean", "sum", "none"):
            loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=8, reduction=reduction)
            assert loss.grad_fn is None
            assert rel(loss, F.cross_entropy(hidden @ weight.T, targets, reduction=reduction)) < 1e-5
    assert calls and not any(calls)
    linear_cross_entropy(hidden, weight, targets, chunk_tokens=8).backward()
    assert calls[-1]  # the probe does see the gradient path


def test_autocast_bf16_keeps_fp32_logits():
    """Under autocast the logits and softmax stay fp32 (bf16 logits would be off by ~1e-3)."""
    hidden, weight, targets = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=8)
        gh, gw = torch.autograd.grad(loss, (hidden, weight))
    assert loss.dtype == torch.float32 and gh.dtype == gw.dtype == torch.float32
    ref = F.cross_entropy(hidden @ weight.T, targets)
    for a, b in zip((loss.detach(), gh, gw), (ref.detach(), *torch.autograd.grad(ref, (hidden, weight)))):
        assert rel(a, b) < 1e-5
    for reduction in ("mean", "none"):  # bf16 parameters and activations: fp32 loss, bf16 gradients
        h16, w16 = hidden.detach().bfloat16().requires_grad_(), weight.detach().bfloat16().requires_grad_()
        out = linear_cross_entropy(h16, w16, targets, chunk_tokens=8, reduction=reduction)
        out.sum().backward()
        assert out.dtype == torch.float32 and h16.grad.dtype == w16.grad.dtype == torch.bfloat16
        ref = F.cross_entropy(h16.float() @ w16.float().T, targets, reduction=reduction)
        assert rel(out, ref) < 1e-6


def test_bad_arguments():
    hidden, weight, targets = inputs()
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(hidden, weight, targets, reduction="avg")
    with pytest.raises(ValueError, match="weight"):
        linear_cross_entropy(hidden, weight.T, targets)
    with pytest.raises(ValueError, match="targets"):
        linear_cross_entropy(hidden, weight, targets[:-1])
    with pytest.raises(ValueError, match="chunk_tokens"):
        linear_cross_entropy(hidden, weight, targets, chunk_tokens=0)
    assert default_chunk_tokens(8192) >= 1 and default_chunk_tokens(10**9) == 1


_CPU_HEAD_SCRIPT = r"""
import sys
import torch
from basecap.kernels.linear_ce import lm_head_loss
h, w = torch.randn(6, 4, requires_grad=True), torch.randn(9, 4, requires_grad=True)
t = torch.randint(0, 9, (6,))
lm_head_loss(h, w, t, impl="auto").backward()
with torch.no_grad():
    lm_head_loss(h, w, t, impl="auto", reduction="none")
print(sorted(m for m in ("fla", "triton") if m in sys.modules))
"""


def test_head_dispatch_on_cpu_is_chunked_and_never_imports_fla():
    out = subprocess.run([sys.executable, "-c", _CPU_HEAD_SCRIPT], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_head_dispatch_choices():
    from basecap.config_base import ConfigError
    from basecap.kernels.linear_ce import lm_head_loss, resolve_head_impl

    hidden, weight, targets = inputs(torch.float64)
    assert resolve_head_impl("auto", hidden) == "chunked"
    with torch.no_grad():
        assert resolve_head_impl("fast", hidden) == "chunked"  # evaluation never pays fla's gradient work
    with pytest.raises(ConfigError, match="CUDA"):
        resolve_head_impl("fast", hidden)
    with pytest.raises(ConfigError, match="per-token"):
        resolve_head_impl("fast", hidden, reduction="none")
    with pytest.raises(ConfigError, match="impl"):
        resolve_head_impl("triton", hidden)
    targets[:3] = -100
    for reduction in ("mean", "none"):
        ref = F.cross_entropy(hidden @ weight.T, targets, reduction=reduction)
        for impl in ("plain", "chunked", "auto"):
            loss = lm_head_loss(hidden.view(1, N, D), weight, targets.view(1, N), impl=impl, chunk_tokens=5, reduction=reduction)
            assert loss.shape == (() if reduction == "mean" else (1, N))
            assert rel(loss.flatten(), ref.flatten()) < 1e-12


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_fla_path_matches_plain(dtype):
    from basecap.kernels.linear_ce import lm_head_loss

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(1000, 64, device="cuda", generator=g).to(dtype).requires_grad_()
    weight = (0.1 * torch.randn(3000, 64, device="cuda", generator=g)).to(dtype).requires_grad_()
    targets = torch.randint(0, 3000, (1000,), device="cuda", generator=g)
    targets[:50] = -100
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for impl in ("fast", "chunked"):
        loss = lm_head_loss(hidden, weight, targets, impl=impl)
        gh, gw = torch.autograd.grad(loss, (hidden, weight))
        ref = F.cross_entropy(hidden.float() @ weight.float().T, targets)
        rh, rw = torch.autograd.grad(ref, (hidden, weight))
        assert rel(loss.float(), ref) < tol
        assert rel(gh.float(), rh.float()) < tol and rel(gw.float(), rw.float()) < tol


def test_head_benchmark_smoke(tmp_path):
    import json

    from basecap.bench import head

    head.main(["--tokens", "2048", "--widths", "32", "--vocabs", "2048", "--reps", "1", "--warmup", "0",
               "--threads", "1", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "head.json").read_text())
    rows = {r["variant"]: r for r in data["results"]}
    assert set(rows) == {"plain", "chunked"} and rows["chunked"]["check_rel_err"] < 1e-5
    # plain holds three [N, V] fp32 buffers (logits, log-softmax, their gradient: 16 MiB each), chunked one 4 MiB chunk
    assert rows["chunked"]["peak_bytes"] < 0.5 * rows["plain"]["peak_bytes"]
    assert (tmp_path / "head.png").exists()


def test_model_throughput_benchmark_compares_heads(tmp_path):
    import json

    from basecap.bench import throughput

    throughput.main(["--mixers", "attention", "--preset", "tiny", "--lengths", "1024", "--vocab", "4096", "--reps", "1",
                     "--warmup", "0", "--head-impls", "plain", "chunked", "--threads", "1", "--memory", "--device", "cpu",
                     "--out", str(tmp_path)])
    rows = {r["head_impl"]: r for r in json.loads((tmp_path / "throughput.json").read_text())["rows"]}
    assert set(rows) == {"plain", "chunked"} and all(r["step_s"] > 0 and r["params"] == rows["plain"]["params"] for r in rows.values())
    # the plain head's [1024, 4096] fp32 logits, log-softmax and gradient (16 MiB each) are what the chunked one saves
    assert rows["chunked"]["peak_mem_gib"] < rows["plain"]["peak_mem_gib"] - 24 / 1024
