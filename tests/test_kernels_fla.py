"""The flash-linear-attention fast path (``impl="fast"``, ``basecap.kernels.fla``).

CPU (run everywhere): every adapter, called with fla's own pure-PyTorch reference in place of the
Triton kernel (the references are loaded file by file, never the fla package), equals our step-by-step
oracle, so the convention mapping (layout, scale, decay sign, state layout) is checked without a GPU;
"fast" on CPU is a clear configuration error; "auto" on CPU is exactly the chunked form; running every
mixer on CPU never imports Triton or fla.

GPU (``-m gpu``; skipped without CUDA, failed on CUDA when fla does not import): each mixer with
``impl="fast"`` against the same mixer with ``impl="chunked"`` (itself checked against the oracle by the
contract test), outputs and every gradient at T = 1, 63, 100, 2048, in fp32 and under bf16 autocast, plus
prefill + decode. The mixer-to-kernel wiring is also run on CPU, with fla's references standing in for
the kernels: tests/test_fla_emulation.py.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from basecap.config_base import ConfigError
from basecap.kernels import fla as fk
from basecap.mixers import build_mixer, mixer_class, parse_mixer_config
from basecap.mixers.based import taylor_attn_recurrent
from basecap.ops.delta_rule import delta_rule_recurrent, l2_normalize
from basecap.ops.ssm import ssd_ref
from basecap.ops.wkv import wkv6_recurrent, wkv7_recurrent

from fla_oracle import fla_naive

FAST_MIXERS = ["mamba2", "deltanet", "gated_deltanet", "rwkv6", "rwkv7", "based"]
CPU_ERROR = "impl='fast' needs CUDA and flash-linear-attention; use 'chunked' on CPU"


def rel(a, b, floor: float = 1e-12):
    """||a - b|| / max(||b||, floor), after checking both are finite."""
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(floor))


def leaves(*ts):
    return [t.clone().requires_grad_() for t in ts]


def compare(ours, theirs, ins_ours, ins_theirs, tol_out, tol_grad):
    """Outputs and the gradients of one random projection of them, w.r.t. every input."""
    for a, b in zip(ours, theirs):
        assert rel(a, b) < tol_out
    gen = torch.Generator().manual_seed(1)
    w = [torch.randn(b.shape, generator=gen) for b in theirs]
    g_a = torch.autograd.grad(sum((a.float() * wi).sum() for a, wi in zip(ours, w)), ins_ours)
    g_b = torch.autograd.grad(sum((b.float() * wi).sum() for b, wi in zip(theirs, w)), ins_theirs)
    for i, (a, b) in enumerate(zip(g_a, g_b)):
        assert rel(a, b) < tol_grad, f"gradient of input {i}: rel err {rel(a, b):.2e}"


def bf16(*ts):
    """What the 16-bit kernels see: the inputs rounded to bf16."""
    return [t.to(torch.bfloat16).float() for t in ts]


# ---- the convention mapping, against fla's references (CPU) -------------------------------------

@pytest.mark.parametrize("with_state", [False, True])
def test_ssd_adapter_matches_fla_reference(with_state):
    naive = fla_naive("simple_gla/naive.py")

    def op(q, k, v, g, scale, initial_state, output_final_state):
        return naive.naive_recurrent_simple_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                                                output_final_state=output_final_state)

    gen = torch.Generator().manual_seed(0)
    B, T, H, P, N = 2, 19, 3, 5, 4
    X, Bm, Cm = torch.randn(B, T, H, P, generator=gen), torch.randn(B, T, N, generator=gen), torch.randn(B, T, N, generator=gen)
    log_a = -1.5 * torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, P, N, generator=gen)
    mine, ref = leaves(X, log_a, Bm, Cm, h0), leaves(X, log_a, Bm, Cm, h0)
    if with_state:
        y, h = fk.ssd(*mine, op=op)
        y_ref, h_ref = ssd_ref(*ref)
        compare([y, h], [y_ref, h_ref], mine, ref, 1e-5, 1e-5)
    else:
        y, h = fk.ssd(*mine[:4], op=op)
        assert h is None
        y_ref, _ = ssd_ref(*ref[:4])
        compare([y], [y_ref], mine[:4], ref[:4], 1e-5, 1e-5)


def delta_inputs(gated: bool, B=2, H=3, T=21, K=8, V=6):
    gen = torch.Generator().manual_seed(0)
    q = l2_normalize(torch.randn(B, H, T, K, generator=gen))
    k = l2_normalize(torch.randn(B, H, T, K, generator=gen))
    v = torch.randn(B, H, T, V, generator=gen)
    beta = torch.rand(B, H, T, generator=gen)
    g = -1.5 * torch.rand(B, H, T, generator=gen) if gated else None
    S0 = torch.randn(B, H, K, V, generator=gen)
    return q, k, v, beta, g, S0


@pytest.mark.parametrize("gated", [False, True])
def test_delta_rule_adapter_matches_fla_reference(gated):
    """Both delta-rule kernels run in bf16 (even for fp32 inputs): compare on the rounded inputs."""
    if gated:
        naive = fla_naive("gated_delta_rule/naive.py")

        def op(q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel):
            assert use_qk_l2norm_in_kernel is False
            return naive.naive_recurrent_gated_delta_rule(q=q, k=k, v=v, beta=beta, g=g, initial_state=initial_state,
                                                          output_final_state=output_final_state)
    else:
        naive = fla_naive("delta_rule/naive.py")

        def op(q, k, v, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel):
            assert use_qk_l2norm_in_kernel is False
            o, S = naive.delta_rule_recurrence(*(t.transpose(1, 2) for t in (q, k, v, beta)),
                                               initial_state=initial_state, output_final_state=output_final_state)
            return o.transpose(1, 2), S

    q, k, v, beta, g, S0 = delta_inputs(gated)
    extra = [g] if gated else []
    mine = leaves(q, k, v, beta, *extra, S0)
    ref = leaves(*bf16(q, k, v, beta), *extra, S0)
    kw = lambda ts: dict(g=ts[4] if gated else None, state=ts[-1])  # noqa: E731
    o, S = fk.delta_rule(*mine[:4], **kw(mine), op=op)
    assert kw(mine)["state"] is not None and S.dtype == torch.float32 and o.dtype == v.dtype
    o_ref, S_ref = delta_rule_recurrent(*ref[:4], **kw(ref))
    compare([o, S], [o_ref, S_ref], mine, ref, 1e-2, 2e-2)


def test_wkv6_adapter_matches_fla_reference():
    """fla's RWKV-6 reference is head-first; the kernel is time-major like ours. Scale 1, w = log decay."""
    naive = fla_naive("rwkv6/recurrent_naive.py")

    def op(r, k, v, w, u, scale, initial_state, output_final_state):
        o, S = naive.naive_recurrent_rwkv6(*(t.transpose(1, 2) for t in (r, k, v, w)), u, scale=scale,
                                           initial_state=initial_state, output_final_state=output_final_state)
        return o.transpose(1, 2), S

    gen = torch.Generator().manual_seed(0)
    B, T, H, K = 2, 17, 3, 6
    r, k, v = (torch.randn(B, T, H, K, generator=gen) for _ in range(3))
    log_w = -torch.exp(torch.randn(B, T, H, K, generator=gen) - 1)
    u, S0 = torch.randn(H, K, generator=gen), torch.randn(B, H, K, K, generator=gen)
    mine, ref = leaves(r, k, v, log_w, u, S0), leaves(r, k, v, log_w, u, S0)
    y, S = fk.wkv6(*mine, op=op)
    y_ref, S_ref = wkv6_recurrent(*ref)
    compare([y, S], [y_ref, S_ref], mine, ref, 1e-5, 1e-5)


def test_wkv7_adapter_matches_fla_reference():
    """fla's DPLR reference is head-first and scales q by K^-1/2 (undone here, the kernel gets scale 1);
    the kernel runs in bf16, so compare on the rounded inputs; the decay respects the bound we declare."""
    naive = fla_naive("generalized_delta_rule/dplr/naive.py")

    def op(r, w, k, v, a, b, scale, initial_state, output_final_state, safe_gate, lower_bound):
        assert safe_gate and bool((w >= lower_bound).all()) and bool((w <= 0).all())
        K = r.shape[-1]
        hf = lambda t: t.transpose(1, 2)  # noqa: E731
        o, S = naive.dplr_recurrence(hf(r).float() * (scale * K**0.5), hf(k), hf(v), hf(a), hf(b), hf(w),
                                     initial_state=initial_state, output_final_state=output_final_state)
        return o.transpose(1, 2), S

    gen = torch.Generator().manual_seed(0)
    B, T, H, K = 2, 17, 3, 6
    r, k, v = (torch.randn(B, T, H, K, generator=gen) for _ in range(3))
    log_w = fk.RWKV7_LOG_W_MIN * torch.sigmoid(torch.randn(B, T, H, K, generator=gen))
    kk = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    a, b = -kk, kk * torch.rand(B, T, H, K, generator=gen)
    S0 = torch.randn(B, H, K, K, generator=gen)
    mine = leaves(r, log_w, k, v, a, b, S0)
    rr, kr, vr, ar, br = bf16(r, k, v, a, b)
    ref = leaves(rr, log_w, kr, vr, ar, br, S0)
    y, S = fk.wkv7(*mine, op=op)
    y_ref, S_ref = wkv7_recurrent(*ref)
    compare([y, S], [y_ref, S_ref], mine, ref, 1e-4, 2e-2)


def test_based_adapter_matches_fla_reference():
    naive = fla_naive("based/naive.py")

    def op(q, k, v, scale, use_norm):
        assert use_norm
        return naive.naive_parallel_based(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale,
                                          use_norm=True).transpose(1, 2)

    gen = torch.Generator().manual_seed(0)
    B, H, T, d, V = 2, 3, 23, 4, 5
    q, k, v = torch.randn(B, H, T, d, generator=gen), torch.randn(B, H, T, d, generator=gen), torch.randn(B, H, T, V, generator=gen)
    mine, ref = leaves(q, k, v), leaves(q, k, v)
    o = fk.based_linear(*mine, op=op)
    o_ref, _, _ = taylor_attn_recurrent(*ref)
    compare([o], [o_ref], mine, ref, 1e-5, 1e-5)


def _fla_parameters(relpath: str, func: str) -> set[str]:
    """Named parameters of an fla function, read from its source (importing it needs Triton)."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed")
    tree = ast.parse((Path(list(spec.submodule_search_locations)[0]) / "ops" / relpath).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            return {a.arg for a in node.args.args + node.args.kwonlyargs}
    raise AssertionError(f"{func} not found in fla/ops/{relpath}")


def test_adapter_arguments_exist_in_fla():
    """Every keyword an adapter passes is a named parameter of the fla op (not swallowed by **kwargs)."""
    z = torch.zeros
    calls = {
        ("simple_gla/chunk.py", "chunk_simple_gla"): fk.ssd_inputs(z(1, 2, 1, 4), z(1, 2, 1), z(1, 2, 3), z(1, 2, 3), z(1, 1, 4, 3)),
        ("delta_rule/chunk.py", "chunk_delta_rule"): fk.delta_rule_inputs(*[z(1, 1, 2, 4)] * 3, z(1, 1, 2), None, z(1, 1, 4, 4)),
        ("gated_delta_rule/chunk.py", "chunk_gated_delta_rule"):
            fk.delta_rule_inputs(*[z(1, 1, 2, 4)] * 3, z(1, 1, 2), z(1, 1, 2), z(1, 1, 4, 4)),
        ("rwkv6/chunk.py", "chunk_rwkv6"): fk.wkv6_inputs(*[z(1, 2, 1, 4)] * 4, z(1, 4), z(1, 1, 4, 4)),
        ("rwkv7/chunk.py", "chunk_rwkv7"): fk.wkv7_inputs(*[z(1, 2, 1, 4)] * 6, z(1, 1, 4, 4)),
        ("based/parallel.py", "parallel_based"): fk.based_inputs(*[z(1, 1, 2, 4)] * 3),
    }
    for (path, func), kwargs in calls.items():
        missing = set(kwargs) - _fla_parameters(path, func)
        assert not missing, f"{func} has no parameter(s) {sorted(missing)}"


def test_based_rejects_feature_dims_the_kernel_lacks():
    q = torch.zeros(1, 1, 2, fk.BASED_MAX_FEATURE_DIM + 1)
    with pytest.raises(ConfigError, match="feature_dim"):
        fk.based_inputs(q, q, q)


def test_compute_dtype():
    x = torch.zeros(2)
    assert fk.compute_dtype(x) == torch.float32
    assert fk.compute_dtype(x, fp32_ok=False) == torch.bfloat16
    assert fk.compute_dtype(x.half(), fp32_ok=False) == torch.float16
    assert fk.compute_dtype(x.double()) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fk.compute_dtype(x) == torch.bfloat16


# ---- impl selection on CPU ---------------------------------------------------------------------------

def variants(name):
    return [{"name": name, **v} for v in mixer_class(name).test_variants]


def test_resolve_impl_on_cpu():
    x = torch.zeros(1)
    assert fk.resolve_impl("deltanet", "ref", x) == "ref"
    assert fk.resolve_impl("deltanet", "chunked", x) == "chunked"
    assert fk.resolve_impl("deltanet", "auto", x) == "chunked"
    with pytest.raises(ConfigError, match=re.escape(CPU_ERROR)):
        fk.resolve_impl("deltanet", "fast", x)


@pytest.mark.parametrize("name", FAST_MIXERS)
def test_fast_on_cpu_is_a_clear_error(name):
    for cfg in variants(name):
        m = build_mixer(parse_mixer_config(dict(cfg, impl="fast")), 32)
        with pytest.raises(ConfigError, match=re.escape(CPU_ERROR)):
            m(torch.randn(1, 5, 32))


@pytest.mark.parametrize("name", FAST_MIXERS)
def test_auto_on_cpu_is_the_chunked_form(name):
    """Bit for bit, in training and in prefill + decode."""
    torch.manual_seed(0)
    cfg = variants(name)[0]
    auto = build_mixer(parse_mixer_config(dict(cfg, impl="auto")), 32)
    chunked = build_mixer(parse_mixer_config(dict(cfg, impl="chunked")), 32)
    chunked.load_state_dict(auto.state_dict())
    x = torch.randn(2, 23, 32)
    assert torch.equal(auto(x)[0], chunked(x)[0])
    s_a, s_c = auto.init_state(2), chunked.init_state(2)
    for part in (x[:, :20], x[:, 20:21], x[:, 21:]):
        (y_a, s_a), (y_c, s_c) = auto(part, s_a), chunked(part, s_c)
        assert torch.equal(y_a, y_c)
    for key, val in s_c.items():
        assert torch.equal(s_a[key], val) if isinstance(val, torch.Tensor) else s_a[key] == val


_NO_FLA_SCRIPT = r"""
import json, sys, typing
import torch
torch.set_num_threads(1)
import basecap, basecap.model, basecap.kernels.fla
from basecap.mixers import build_mixer, mixer_class, mixer_names, parse_mixer_config

ran = []
for name in mixer_names():
    cls = mixer_class(name)
    impls = typing.get_args(cls.config_class.model_fields["impl"].annotation)
    for variant in cls.test_variants:
        for impl in [i for i in ("auto", "fast") if i in impls]:
            m = build_mixer(parse_mixer_config({"name": name, **variant, "impl": impl}), 32)
            x = torch.randn(2, 9, 32, requires_grad=True)
            try:
                y, _ = m(x)
                y.square().mean().backward()
                m(x[:, :3].detach(), m.init_state(2))
            except ValueError:  # 'fast' is CUDA-only for most mixers
                assert impl == "fast", (name, impl)
            ran.append(f"{name}:{impl}")
bad = sorted(k for k in sys.modules if k.split(".")[0] in ("fla", "triton"))
print(json.dumps({"ran": ran, "imported": bad}))
"""


def test_cpu_never_imports_fla_or_triton():
    out = subprocess.run([sys.executable, "-c", _NO_FLA_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["imported"] == [], res["imported"]
    for name in FAST_MIXERS:
        assert f"{name}:auto" in res["ran"] and f"{name}:fast" in res["ran"]


# ---- GPU: the Triton kernels against the chunked forms ----------------------------------------------

def _need_fla_gpu():
    """Skips without a CUDA device; on a CUDA machine a missing or broken fla is a failure, not a skip."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    err = fk.fla_import_error()
    if err is not None:
        pytest.fail(f"CUDA is available but flash-linear-attention does not import "
                    f"(pip install 'basecap[fast]'): {err}")


DEV = "cuda"
D_GPU = 256
# per case: the mixer config (realistic head sizes) and whether its kernel computes in fp32
GPU_CASES = {
    "mamba2": ({"name": "mamba2", "head_dim": 64, "d_state": 64}, True),
    "mamba2_shared": ({"name": "mamba2", "head_dim": 64, "d_state": 64, "decay": "shared", "out_norm": False}, True),
    "mamba2_nodecay": ({"name": "mamba2", "head_dim": 64, "d_state": 64, "decay": "none", "short_conv": False}, True),
    "deltanet": ({"name": "deltanet", "head_dim": 64}, False),
    "gated_deltanet": ({"name": "gated_deltanet", "n_heads": 4, "head_dim": 64}, False),
    "rwkv6": ({"name": "rwkv6", "head_dim": 64}, True),
    "rwkv7": ({"name": "rwkv7", "head_dim": 64}, False),
    "based": ({"name": "based", "n_heads": 16, "feature_dim": 16, "head_dim": 64, "window": 64}, True),
}
# (output, gradient) relative-error bounds. fp32 kernels: Triton's tl.dot rounds fp32 operands to tf32;
# bf16 kernels: q/k/v and some intermediates in bf16; autocast: every linear layer in bf16 as well.
# A CPU simulation (our chunked forms on inputs rounded to tf32 / bf16, at these shapes) gave about
# 1e-3 (fp32 kernels), 4e-3 (bf16 kernels) and 1e-2 (autocast, all parameters together): the bounds
# leave room for the kernels' own roundings; a convention error shows up as 1e-1 and more.
TOL = {"fp32_kernel": (5e-3, 2e-2), "bf16_kernel": (3e-2, 6e-2), "autocast": (4e-2, 8e-2)}
LENGTHS = (1, 63, 100, 2048)


def _pair(cfg: dict):
    """(chunked, fast) mixers on CUDA with the same weights; all-zero parameters (RWKV's LoRA inputs)
    get small random values so the data-dependent paths carry gradient."""
    torch.manual_seed(0)
    ref = build_mixer(parse_mixer_config(dict(cfg, impl="chunked")), D_GPU)
    with torch.no_grad():
        for p in ref.parameters():
            if not p.any():
                p.normal_(0, 0.05)
    fast = build_mixer(parse_mixer_config(dict(cfg, impl="fast")), D_GPU)
    fast.load_state_dict(ref.state_dict())
    return ref.to(DEV), fast.to(DEV)


def _run(m, x, w, autocast: bool):
    m.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with torch.autocast(DEV, dtype=torch.bfloat16, enabled=autocast):
        y, _ = m(x)
    (y.float() * w).sum().backward()
    grads = {n: p.grad.float() for n, p in m.named_parameters() if p.grad is not None}
    return y.float(), x.grad.float(), grads


@pytest.mark.gpu
# the Mamba-2 ablations share the default's kernel: fp32 covers their mapping, autocast runs the default only
@pytest.mark.parametrize("case,mode", [(c, m) for c in sorted(GPU_CASES) for m in ("fp32", "autocast")
                                       if m == "fp32" or not c.startswith("mamba2_")])
def test_fast_matches_chunked_on_gpu(case, mode):
    _need_fla_gpu()
    cfg, fp32_kernel = GPU_CASES[case]
    tol_out, tol_grad = TOL["autocast" if mode == "autocast" else ("fp32_kernel" if fp32_kernel else "bf16_kernel")]
    ref, fast = _pair(cfg)
    gen = torch.Generator(device=DEV).manual_seed(0)
    for T in LENGTHS:
        x = torch.randn(2, T, D_GPU, device=DEV, generator=gen)
        w = torch.randn(2, T, D_GPU, device=DEV, generator=gen)
        y_ref, gx_ref, g_ref = _run(ref, x, w, autocast=False)
        y, gx, g = _run(fast, x, w, autocast=(mode == "autocast"))
        assert g.keys() == g_ref.keys()
        errs = {"output": rel(y, y_ref), "x.grad": rel(gx, gx_ref)}
        g_all, g_all_ref = (torch.cat([gr[n].flatten() for n in g_ref]) for gr in (g, g_ref))
        if mode == "fp32":
            # a gradient that is ~0 in exact arithmetic (e.g. Based's q/k at T = 1, where the normalised
            # output is v whatever q.k) is compared against 1e-3 of the whole gradient, not against itself
            floor = 1e-3 * float(g_all_ref.norm())
            errs.update({f"grad {n}": rel(g[n], g_ref[n], floor) for n in g_ref})
        else:  # bf16 autocast: all parameter gradients as one vector (single small ones are noisy in bf16)
            errs["params.grad"] = rel(g_all, g_all_ref)
        bad = {k: e for k, e in errs.items() if e > (tol_out if k == "output" else tol_grad)}
        assert not bad, f"{case} {mode} T={T}: " + ", ".join(f"{k} {e:.2e}" for k, e in bad.items())


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_fast_prefill_and_decode_on_gpu(case):
    """Prefill 37 tokens then decode 4 one at a time with impl='fast' (Based: the chunked form, as
    documented) == one chunked forward; the final state equals the chunked path's."""
    _need_fla_gpu()
    cfg, fp32_kernel = GPU_CASES[case]
    tol = TOL["fp32_kernel" if fp32_kernel else "bf16_kernel"][0]
    ref, fast = _pair(cfg)
    x = torch.randn(2, 41, D_GPU, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1))
    with torch.no_grad():
        y_ref, _ = ref(x)
        _, s_ref = ref(x, ref.init_state(2, device=DEV))
        state = fast.init_state(2, device=DEV)
        ys = []
        for part in (x[:, :37], *x[:, 37:].split(1, dim=1)):
            y, state = fast(part, state)
            ys.append(y)
    assert rel(torch.cat(ys, 1), y_ref) < tol
    for key, val in s_ref.items():
        if isinstance(val, torch.Tensor):
            assert rel(state[key], val) < tol, key


@pytest.mark.gpu
def test_auto_picks_fast_on_gpu():
    _need_fla_gpu()
    x = torch.zeros(1, device=DEV)
    assert fk.resolve_impl("deltanet", "auto", x) == "fast"
    ref, fast = _pair(GPU_CASES["deltanet"][0])
    auto = build_mixer(parse_mixer_config(dict(GPU_CASES["deltanet"][0], impl="auto")), D_GPU).to(DEV)
    auto.load_state_dict(fast.state_dict())
    x = torch.randn(2, 50, D_GPU, device=DEV)
    with torch.no_grad():
        assert rel(auto(x)[0], fast(x)[0]) < 1e-5
