"""The fast path (``impl="fast"``) of every fla-backed mixer, run on CPU with fla's kernels emulated.

fla's Triton ops need CUDA, so on CPU the mixer-to-kernel wiring never runs. Here each ``fla.ops``
function that ``basecap.kernels.fla`` imports is stood in by a function with the real op's signature
(checked against the installed fla source) that applies the op's documented defaults and checks, and
computes with fla's own pure-PyTorch reference (``fla/ops/*/naive.py``, loaded file by file; importing
fla itself needs Triton). ``KERNEL_DEVICES`` is widened to CPU so that ``resolve_impl`` sends
``impl="fast"`` through the whole real path (the ``fla_import_error`` check, the adapter, the op).

Each mixer's ``impl="fast"`` is then compared with its ``impl="chunked"`` (itself checked against the
step-by-step oracle by the contract tests), same weights: outputs and every gradient in training
(``state=None``, no state asked from the kernel), and prefill + decode from a non-zero state (state in,
state out, gradients of the initial state). What this proves and does not prove: docs/kernels.md.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from basecap.kernels import fla as fk
from basecap.mixers import build_mixer, mixer_class, parse_mixer_config

from fla_oracle import fla_naive

pytestmark = pytest.mark.filterwarnings("error:ChunkDeltaRuleFunction does not support float32")

D_MODEL = 32
# the kernels that take 16-bit q/k/v (the adapter rounds fp32 activations to bf16)
BF16_KERNELS = {"deltanet", "gated_deltanet", "rwkv7"}
# (output, gradient) relative-error bounds, fast against chunked: fp32 kernels differ by summation order
# only; bf16 kernels by the rounding of q/k/v (and a, b, beta) to bf16; under bf16 autocast every linear
# layer rounds as well. A convention error (layout, scale, decay sign, state layout) gives 1e-1 and more.
# The 16-bit kernels are also run in fp32 ("exact": the adapter keeps fp32, the stand-in accepts it), so
# their mapping is checked as tightly as the fp32 kernels'.
TOL = {"fp32": (1e-5, 1e-5), "bf16": (2e-2, 4e-2), "autocast": (4e-2, 8e-2)}
# switched by the "exact" runs: let the 16-bit stand-ins take fp32
_ACCEPT_FP32 = {"on": False}


# ---- the stand-ins: the real ops' signatures, defaults and checks; fla's references inside ----------

@functools.cache
def _naive(relpath: str):
    return fla_naive(relpath)


def _check_layout(*ts: torch.Tensor, heads_from: torch.Tensor) -> None:
    """fla 0.6.0 is time-major: every per-token tensor is ``[B, T, H, ...]``, on one device."""
    B, T, H = heads_from.shape[:3]
    for t in ts:
        assert t.shape[:3] == (B, T, H), f"not time-major [B, T, H, ...]: {tuple(t.shape)} vs {(B, T, H)}"
        assert t.device == heads_from.device


def _check_state(initial_state, B, H, K, V) -> None:
    if initial_state is not None:
        assert tuple(initial_state.shape) == (B, H, K, V), f"state {tuple(initial_state.shape)} != {(B, H, K, V)}"


def _check_common(kwargs: dict, cu_seqlens) -> None:
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")
    assert cu_seqlens is None, "the adapters never pass variable-length batches"


def _no_autocast(t: torch.Tensor):
    """The kernels compute in their own precision (fp32 accumulation) whatever the autocast state."""
    return torch.autocast(t.device.type, enabled=False)


def _heads_first(*ts):
    return [t.transpose(1, 2) for t in ts]


def _state_out(S, output_final_state: bool):
    return S.float() if output_final_state else None


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """``fla.ops.simple_gla.chunk_simple_gla``: o_t = scale q_t^T S_t, S_t = exp(g_t) S_{t-1} + k_t v_t^T."""
    _check_common(kwargs, cu_seqlens)
    kwargs.pop("chunk_size", None)
    assert (g is None) != (g_gamma is None), "exactly one of g and g_gamma"
    B, T, H, K = k.shape
    if g is None:
        g = g_gamma.float()[None, None].expand(B, T, H)
    _check_layout(k, v, g, heads_from=q)
    if initial_state is not None and state_v_first:
        initial_state = initial_state.transpose(-1, -2)
    _check_state(initial_state, B, H, K, v.shape[-1])
    scale = K**-0.5 if scale is None else scale
    with _no_autocast(q):
        o, S = _naive("simple_gla/naive.py").naive_recurrent_simple_gla(
            q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if S is not None and state_v_first:
        S = S.transpose(-1, -2)
    return o.to(q.dtype), _state_out(S, output_final_state)


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """``fla.ops.delta_rule.chunk_delta_rule`` (16-bit only, as the real op asserts)."""
    assert q.dtype == k.dtype == v.dtype
    assert q.dtype != torch.float32 or _ACCEPT_FP32["on"], "ChunkDeltaRuleFunction does not support float32."
    assert len(beta.shape) == 3, "beta must be of shape (batch size, num of head, seq len)."
    _check_common(kwargs, cu_seqlens)
    assert kwargs.pop("chunk_size", 64) in (16, 32, 64)
    B, _, H, K = k.shape
    _check_layout(k, v, beta, heads_from=q)
    _check_state(initial_state, B, H, K, v.shape[-1])
    scale = K**-0.5 if scale is None else scale
    with _no_autocast(q):
        if use_qk_l2norm_in_kernel:
            q, k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
        # the reference hard-codes the scale K^-1/2
        q = q.float() * (scale * K**0.5)
        o, S = _naive("delta_rule/naive.py").delta_rule_recurrence(
            *_heads_first(q, k, v, beta), initial_state=initial_state, output_final_state=output_final_state)
    return o.transpose(1, 2).to(v.dtype), _state_out(S, output_final_state)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (one value head per key head here)."""
    _check_common(kwargs, cu_seqlens)
    assert chunk_indices is None and cp_context is None
    assert kwargs.pop("chunk_size", 64) in (16, 32, 64)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    B, _, H, K = k.shape
    assert v.shape[2] == H, "grouped value heads are not emulated"
    _check_layout(k, v, g, beta, heads_from=q)
    if initial_state is not None and state_v_first:
        initial_state = initial_state.transpose(-1, -2)
    _check_state(initial_state, B, H, K, v.shape[-1])
    scale = K**-0.5 if scale is None else scale
    with _no_autocast(q):
        if kwargs.get("use_gate_in_kernel", False):
            dt_bias = kwargs.get("dt_bias")
            g = -kwargs["A_log"].float().exp() * F.softplus(g.float() + (0 if dt_bias is None else dt_bias.float()))
        if use_beta_sigmoid_in_kernel:
            beta = (2 if allow_neg_eigval else 1) * beta.float().sigmoid()
        if use_qk_l2norm_in_kernel:
            q, k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
        o, S = _naive("gated_delta_rule/naive.py").naive_recurrent_gated_delta_rule(
            q, k, v, beta, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if S is not None and state_v_first:
        S = S.transpose(-1, -2)
    return o.to(q.dtype), _state_out(S, output_final_state)


def chunk_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                cu_seqlens_cpu=None, **kwargs):
    """``fla.ops.rwkv6.chunk_rwkv6``: w is the log decay, u the bonus ``[H, K]``, default scale K^-1/2."""
    _check_common(kwargs, cu_seqlens)
    kwargs.pop("chunk_size", None)
    B, _, H, K = k.shape
    _check_layout(k, v, w, heads_from=r)
    assert tuple(u.shape) == (H, K)
    _check_state(initial_state, B, H, K, v.shape[-1])
    scale = K**-0.5 if scale is None else scale
    with _no_autocast(r):
        o, S = _naive("rwkv6/recurrent_naive.py").naive_recurrent_rwkv6(
            *_heads_first(r, k, v, w), u, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state)
    return o.transpose(1, 2).to(r.dtype), _state_out(S, output_final_state)


def chunk_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None,
                cu_seqlens_cpu=None, safe_gate=False, chunk_size=None, disable_recompute=False, cp_context=None,
                lower_bound=None):
    """``fla.ops.rwkv7.chunk_rwkv7`` = ``chunk_dplr_delta_rule(q=r, gk=w, ...)``:
    S_t = diag(exp(w_t)) S + b_t (a_t^T S) + k_t v_t^T, o_t = scale r_t^T S_t."""
    if r.dtype == torch.float32 and not _ACCEPT_FP32["on"]:  # the DPLR op's own warning (an error here)
        warnings.warn("ChunkDeltaRuleFunction does not support float32 on some platforms.", RuntimeWarning)
    _check_common({}, cu_seqlens)
    assert cp_context is None and chunk_size in (None, 16, 32, 64)
    if lower_bound is not None and lower_bound >= 0:
        raise ValueError(f"`lower_bound` must be negative (gk is a log-decay < 0), got {lower_bound}.")
    # what the caller promises with these switches (the kernel does not check them)
    if lower_bound is not None:
        assert bool((w >= lower_bound).all()) and bool((w < 0).all()), "lower_bound <= w < 0 broken"
    if safe_gate:
        assert bool((w >= -5).all()), "safe_gate: w outside [-5, 0)"
    B, _, H, K = k.shape
    _check_layout(w, k, v, a, b, heads_from=r)
    _check_state(initial_state, B, H, K, v.shape[-1])
    scale = K**-0.5 if scale is None else scale
    with _no_autocast(r):
        # the reference hard-codes the scale K^-1/2
        o, S = _naive("generalized_delta_rule/dplr/naive.py").dplr_recurrence(
            *_heads_first(r.float() * (scale * K**0.5), k, v, a, b, w), initial_state=initial_state,
            output_final_state=output_final_state)
    return o.transpose(1, 2).to(r.dtype), _state_out(S, output_final_state)


def parallel_based(q, k, v, scale=None, use_norm=True):
    """``fla.ops.based.parallel_based``: causal (1 + s + s^2/2) attention, s = scale q.k, time-major, no state."""
    assert q.shape[-1] <= 128, "only support feature dim up to 128"
    _check_layout(k, v, heads_from=q)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with _no_autocast(q):
        o = _naive("based/naive.py").naive_parallel_based(*_heads_first(q.float(), k.float(), v.float()),
                                                          scale=scale, use_norm=use_norm)
    return o.transpose(1, 2).to(q.dtype)


# module under fla.ops -> (the stand-in, where the real op is defined, relative to fla/ops)
STAND_INS = {
    "simple_gla": (chunk_simple_gla, "simple_gla/chunk.py"),
    "delta_rule": (chunk_delta_rule, "delta_rule/chunk.py"),
    "gated_delta_rule": (chunk_gated_delta_rule, "gated_delta_rule/chunk.py"),
    "rwkv6": (chunk_rwkv6, "rwkv6/chunk.py"),
    "rwkv7": (chunk_rwkv7, "rwkv7/chunk.py"),
    "based": (parallel_based, "based/parallel.py"),
}


@pytest.fixture
def emulated_fla(monkeypatch):
    """Installs stand-in ``fla`` / ``fla.ops.*`` modules and lets the fast path run on CPU; yields the
    list of calls (op name, ``initial_state is None``, ``output_final_state``)."""
    for relpath in ("simple_gla/naive.py", "delta_rule/naive.py", "gated_delta_rule/naive.py",
                    "rwkv6/recurrent_naive.py", "generalized_delta_rule/dplr/naive.py", "based/naive.py"):
        _naive(relpath)  # skips the test where fla (or einops) is not installed
    calls: list[tuple[str, bool, bool]] = []
    fla = types.ModuleType("fla")
    fla.__version__ = fk.FLA_VERSION
    fla.ops = types.ModuleType("fla.ops")
    for sub, (fn, _) in STAND_INS.items():
        def recorded(*args, _fn=fn, **kwargs):
            bound = inspect.signature(_fn).bind(*args, **kwargs).arguments
            calls.append((_fn.__name__, bound.get("initial_state") is None, bool(bound.get("output_final_state"))))
            return _fn(*args, **kwargs)
        mod = types.ModuleType(f"fla.ops.{sub}")
        setattr(mod, fn.__name__, recorded)
        setattr(fla.ops, sub, mod)
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(sys.modules, "fla", fla)
    monkeypatch.setitem(sys.modules, "fla.ops", fla.ops)
    monkeypatch.setattr(fk, "KERNEL_DEVICES", ("cuda", "cpu"))
    fk.fla_import_error.cache_clear()
    yield calls
    fk.fla_import_error.cache_clear()


def _real_signature(relpath: str, func: str) -> list[tuple]:
    """(name, kind, default) of every parameter of an fla function, read from its source."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed")
    tree = ast.parse((Path(list(spec.submodule_search_locations)[0]) / "ops" / relpath).read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func)
    a, empty = node.args, inspect.Parameter.empty
    pos = a.posonlyargs + a.args
    defaults = [empty] * (len(pos) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
    params = [(p.arg, "positional", d) for p, d in zip(pos, defaults)]
    params += [(p.arg, "keyword", empty if d is None else ast.literal_eval(d))
               for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return params + ([("**" + a.kwarg.arg, "var", empty)] if a.kwarg else [])


def test_stand_ins_have_the_real_signatures():
    """Same parameters, order and defaults as the fla 0.6.0 ops, so the adapters' calls bind as on GPU."""
    for fn, relpath in STAND_INS.values():
        ours = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind == p.VAR_KEYWORD:
                ours.append(("**" + p.name, "var", p.empty))
            else:
                ours.append((p.name, "keyword" if p.kind == p.KEYWORD_ONLY else "positional", p.default))
        assert ours == _real_signature(relpath, fn.__name__), fn.__name__


# ---- every fla-backed mixer: impl="fast" (emulated) against impl="chunked" ------------------------

def fla_mixers() -> list[str]:
    from basecap.mixers import mixer_names

    return [n for n in mixer_names() if mixer_class(n).fast_kernels == "fla"]


KERNEL_OF = {"mamba2": "chunk_simple_gla", "deltanet": "chunk_delta_rule", "gated_deltanet": "chunk_gated_delta_rule",
             "rwkv6": "chunk_rwkv6", "rwkv7": "chunk_rwkv7", "based": "parallel_based"}
# (mixer, test variant, precision): "kernel" runs the adapters' own dtypes, "exact" keeps the 16-bit kernels in fp32
CASES = [(name, i, precision) for name in fla_mixers() for i in range(len(mixer_class(name).test_variants))
         for precision in (("kernel", "exact") if name in BF16_KERNELS else ("kernel",))]
CASE_IDS = ["-".join(map(str, case)) for case in CASES]


def test_every_fla_mixer_is_emulated():
    assert {n for n, *_ in CASES} == set(KERNEL_OF)


def rel(a, b, floor: float = 1e-12) -> float:
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(floor))


def _pair(name: str, variant: int):
    """(chunked, fast) mixers with the same weights; all-zero parameters (LoRA inputs) get small random
    values so the data-dependent paths carry gradient."""
    cfg = {"name": name, **mixer_class(name).test_variants[variant]}
    torch.manual_seed(0)
    ref = build_mixer(parse_mixer_config(dict(cfg, impl="chunked")), D_MODEL)
    with torch.no_grad():
        for p in ref.parameters():
            if not p.any():
                p.normal_(0, 0.05)
    fast = build_mixer(parse_mixer_config(dict(cfg, impl="fast")), D_MODEL)
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def _set_precision(monkeypatch, name: str, precision: str) -> tuple[float, float]:
    """Applies ``precision`` and returns its (output, gradient) tolerance."""
    if precision == "exact":
        compute_dtype = fk.compute_dtype
        monkeypatch.setattr(fk, "compute_dtype", lambda x, fp32_ok=True: compute_dtype(x))
        monkeypatch.setitem(_ACCEPT_FP32, "on", True)
    return TOL["bf16" if name in BF16_KERNELS and precision == "kernel" else "fp32"]


def _grads(m, loss, inputs: dict) -> dict:
    names, params = zip(*m.named_parameters())
    got = torch.autograd.grad(loss, [*inputs.values(), *params], allow_unused=True)
    return {k: g for k, g in zip([*inputs, *names], got) if g is not None}


def _grad_errors(g, g_ref) -> dict:
    """Per-tensor relative errors; a gradient that is ~0 in exact arithmetic is measured against 1e-3 of
    the whole gradient instead of itself."""
    assert g.keys() == g_ref.keys()
    floor = 1e-3 * float(torch.cat([t.flatten().double() for t in g_ref.values()]).norm())
    return {f"grad {k}": rel(g[k], g_ref[k], floor) for k in g_ref}


def _check(errs: dict, tol_out: float, tol_grad: float, what: str) -> None:
    bad = {k: e for k, e in errs.items() if e > (tol_grad if k.startswith("grad") else tol_out)}
    assert not bad, f"{what}: " + ", ".join(f"{k} {e:.1e}" for k, e in bad.items())


def training_errors(ref, fast, autocast: bool = False) -> dict:
    """Relative errors of fast against chunked in training (``state=None``): the output and the
    gradients of the input and of every parameter."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 23, D_MODEL, generator=gen)
    w = torch.randn(2, 23, D_MODEL, generator=gen)
    out = {}
    for key, m in (("ref", ref), ("fast", fast)):
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast and m is fast):
            y, state = m(xi)
        assert state is None
        out[key] = (y.float(), _grads(m, (y.float() * w).sum(), {"x": xi}))
    (y_ref, g_ref), (y, g) = out["ref"], out["fast"]
    return {"output": rel(y, y_ref), **_grad_errors(g, g_ref)}


def _start_state(ref, gen) -> dict:
    """A realistic non-zero decode state: the chunked mixer's state after 9 random tokens."""
    with torch.no_grad():
        _, state = ref(torch.randn(2, 9, D_MODEL, generator=gen), ref.init_state(2))
    return state


def _leaves(state: dict) -> dict:
    return {k: v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in state.items()}


def state_errors(ref, fast) -> dict:
    """Relative errors of fast against chunked from a non-zero state: a 13-token prefill (output, new
    state, gradients of the input, of the initial state and of every parameter), then decode steps of
    1, 1 and 7 tokens (outputs and states)."""
    gen = torch.Generator().manual_seed(2)
    start = _start_state(ref, gen)
    x = torch.randn(2, 22, D_MODEL, generator=gen)
    w = torch.randn(2, 13, D_MODEL, generator=gen)
    out = {}
    for key, m in (("ref", ref), ("fast", fast)):
        s0, xi = _leaves(start), x[:, :13].clone().requires_grad_()
        y, s1 = m(xi, s0)
        gen_w = torch.Generator().manual_seed(3)
        loss = (y * w).sum() + sum((v.float() * torch.randn(v.shape, generator=gen_w)).sum()
                                   for v in s1.values() if isinstance(v, torch.Tensor))
        grads = _grads(m, loss, {"x": xi, **{f"state {k}": v for k, v in s0.items()
                                             if isinstance(v, torch.Tensor) and v.requires_grad}})
        ys, state = [y.detach()], s1
        with torch.no_grad():
            for part in (x[:, 13:14], x[:, 14:15], x[:, 15:]):
                y, state = m(part, state)
                ys.append(y)
        out[key] = (torch.cat(ys, 1), s1, state, grads)
    (y_ref, s1_ref, s_ref, g_ref), (y, s1, s, g) = out["ref"], out["fast"]
    errs = {"output": rel(y, y_ref), **_grad_errors(g, g_ref)}
    for label, a, b in (("after prefill", s1, s1_ref), ("final", s, s_ref)):
        assert a.keys() == b.keys()
        for k, v in b.items():
            if isinstance(v, torch.Tensor):
                assert a[k].dtype == v.dtype and a[k].shape == v.shape, (label, k)
                errs[f"state {k} {label}"] = rel(a[k], v)
            else:
                assert a[k] == v, (label, k)
    return errs


@pytest.mark.parametrize("name,variant,precision", CASES, ids=CASE_IDS)
def test_fast_training_branch_matches_chunked(emulated_fla, monkeypatch, name, variant, precision):
    """state=None: outputs and every gradient; the kernel is called once and asked for no state."""
    tol = _set_precision(monkeypatch, name, precision)
    ref, fast = _pair(name, variant)
    _check(training_errors(ref, fast), *tol, f"{name} variant {variant} {precision}")
    uses_kernel = not (name == "based" and fast.cfg.branches == "window")
    assert emulated_fla == ([(KERNEL_OF[name], True, False)] if uses_kernel else []), emulated_fla


@pytest.mark.parametrize("name,variant,precision", CASES, ids=CASE_IDS)
def test_fast_state_branch_matches_chunked(emulated_fla, monkeypatch, name, variant, precision):
    """Prefill + decode from a non-zero state: the kernel gets the state and returns the new one at every
    call. Based's linear branch runs its chunked form whenever a state is passed (no kernel call)."""
    tol = _set_precision(monkeypatch, name, precision)
    ref, fast = _pair(name, variant)
    _check(state_errors(ref, fast), *tol, f"{name} variant {variant} {precision}")
    assert emulated_fla == ([] if name == "based" else [(KERNEL_OF[name], False, True)] * 4), emulated_fla


@pytest.mark.parametrize("name", sorted(KERNEL_OF))
def test_fast_under_autocast_matches_chunked(emulated_fla, name):
    """bf16 autocast (the GPU training setting): fast under autocast against chunked in fp32."""
    ref, fast = _pair(name, 0)
    _check(training_errors(ref, fast, autocast=True), *TOL["autocast"], f"{name} autocast")
    assert emulated_fla


# ---- the emulation catches convention errors ----------------------------------------------------

def _wrong(inputs_fn, change):
    @functools.wraps(inputs_fn)
    def wrapped(*args, **kwargs):
        kw = inputs_fn(*args, **kwargs)
        change(kw)
        return kw
    return wrapped


def _drop_scale(kw):
    del kw["scale"]  # the op's default K^-1/2 instead of ours


def _state_transposed(kw):
    if kw["initial_state"] is not None:
        kw["initial_state"] = kw["initial_state"].transpose(-1, -2).contiguous()


def _a_b_swapped(kw):
    kw["a"], kw["b"] = kw["b"], kw["a"]


def _based_scale_one(kw):
    kw["scale"] = 1.0


MUTATIONS = {  # mixer -> (adapter input builder, change, branch)
    "mamba2": ("ssd_inputs", _drop_scale, "training"),
    "deltanet": ("delta_rule_inputs", _state_transposed, "state"),
    "rwkv6": ("wkv6_inputs", _drop_scale, "training"),
    "rwkv7": ("wkv7_inputs", _a_b_swapped, "training"),
    "based": ("based_inputs", _based_scale_one, "training"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_emulation_catches_a_convention_error(emulated_fla, monkeypatch, name):
    """A deliberately wrong mapping (scale, state layout, DPLR a/b) fails the comparison by far."""
    builder, change, branch = MUTATIONS[name]
    tol_out, _ = _set_precision(monkeypatch, name, "exact")
    monkeypatch.setattr(fk, builder, _wrong(getattr(fk, builder), change))
    ref, fast = _pair(name, 0)
    err = (training_errors if branch == "training" else state_errors)(ref, fast)["output"]
    assert err > 100 * tol_out, f"{name}: rel err {err:.1e} (tolerance {tol_out:.0e})"
