"""Stand-ins for the ``fla.ops`` functions that ``basecap.kernels.fla`` imports, for the emulation tests
(``tests/test_fla_emulation.py``).

fla's Triton ops need CUDA, so on CPU the mixer-to-kernel wiring never runs. Each stand-in has the real op's
signature (checked against the installed fla source: ``_real_signature``), applies the op's documented defaults
and checks, and computes with fla's own pure-PyTorch reference (``fla/ops/*/naive.py``, loaded file by file;
importing fla itself needs Triton). ``install_stand_ins`` puts them in place of ``fla`` / ``fla.ops.*`` and widens
``KERNEL_DEVICES`` to CPU.
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

from fla_oracle import fla_naive

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


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
              use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
              lower_bound=None, disable_recompute=False, return_intermediate_states=False, state_v_first=False,
              cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    """``fla.ops.kda.chunk_kda``: S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,
    o_t = scale S_t^T q_t, g the per-channel log decay ``[B, T, H, K]`` (one value head per key head here)."""
    _check_common(kwargs, cu_seqlens)
    assert cp_context is None and not use_graph and not return_intermediate_states
    dtype = q.dtype
    if initial_state is not None:
        assert initial_state.dtype == torch.float32, "initial_state must be in float32."
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    if use_gate_in_kernel and A_log is None and lower_bound is None:
        raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is not set.")
    if kwargs.pop("chunk_size", 64) not in (32, 64):
        raise ValueError("`chunk_size` must be either 32 or 64 for KDA")
    if safe_gate and use_gate_in_kernel and (lower_bound is None or not -5 <= lower_bound < 0):
        raise ValueError("`lower_bound` must be in the safe range [-5, 0) when `safe_gate=True` and `use_gate_in_kernel=True`.")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    B, T, H, K = q.shape
    assert q.shape == k.shape and K <= 256 and v.shape[2] == H, "grouped value heads are not emulated"
    assert g.shape == (B, T, H, K) and beta.shape == (B, T, H)
    _check_layout(k, v, g, beta, heads_from=q)
    if initial_state is not None and state_v_first:
        initial_state = initial_state.transpose(-1, -2)
    _check_state(initial_state, B, H, K, v.shape[-1])
    scale = K**-0.5 if scale is None else scale
    with _no_autocast(q):
        if use_gate_in_kernel:
            assert lower_bound is None, "the lower-bound gate is not emulated"
            g = g.float() + (0 if dt_bias is None else dt_bias.float().view(H, K))
            g = -A_log.float().exp().view(H, 1) * F.softplus(g)
        if use_beta_sigmoid_in_kernel:
            beta = (2 if allow_neg_eigval else 1) * beta.float().sigmoid()
        if use_qk_l2norm_in_kernel:
            q, k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
        o, S = _naive("kda/naive.py").naive_recurrent_kda(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if S is not None and state_v_first:
        S = S.transpose(-1, -2)
    return o.to(dtype), _state_out(S, output_final_state)


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
        warnings.warn("ChunkDeltaRuleFunction does not support float32 on some platforms.", RuntimeWarning, stacklevel=2)
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


def parallel_forgetting_attn(q, k, v, g, scale=None, window_size=None, cu_seqlens=None):
    """``fla.ops.forgetting_attn.parallel_forgetting_attn``: causal softmax attention whose logit_ij gets
    sum_{l=j+1..i} g_l (g the per-step log forget gate, ``[B, T, HQ]``), time-major, no state."""
    _check_common({}, cu_seqlens)
    B, T, HQ, K = q.shape
    assert k.shape[:2] == (B, T) and v.shape[:3] == k.shape[:3], "q, k, v time-major with one length"
    if k.shape[2] == 0 or HQ % k.shape[2] != 0:
        raise ValueError(f"The number of query heads ({HQ}) must be divisible by the number of key/value heads ({k.shape[2]}).")
    _check_layout(g, heads_from=q)
    assert K <= 256, "The key dimension can not be larger than 256"
    scale = K**-0.5 if scale is None else scale
    with _no_autocast(q):
        o = _naive("forgetting_attn/naive.py").naive_forgetting_attn(q, k, v, g, scale=scale, window_size=window_size)
    return o.to(q.dtype)


def chunk_log_linear_attn(q, k, v, g, level_scales, initial_state=None, output_final_state=False, cu_seqlens=None, scale=1.0):
    """``fla.ops.log_linear_attn.chunk_log_linear_attn``: o_t = scale sum_{s<=t} lambda_t^(l(t,s)) exp(g_{s+1} + ... + g_t)
    (q_t . k_s) v_s with l(t, s) the Fenwick level of the pair; q, k ``[B, T, G, K]`` shared by H / G value heads,
    ``level_scales [B, T, H, L]`` (level l at index l); default scale 1. The op's state (``LogLinearAttentionState``)
    is not emulated."""
    _check_common({}, cu_seqlens)
    B, T, G, K = k.shape
    H, V = v.shape[2:]
    assert q.shape == k.shape and v.shape[:2] == (B, T), "q, k [B, T, G, K] and v [B, T, H, V], one length"
    _check_layout(g, level_scales, heads_from=v)
    if H % G != 0:
        raise ValueError("The number of value heads must be divisible by the number of query/key heads.")
    if V & (V - 1):
        raise ValueError("Head dimension must be a power of two. Please pad the head dimension to the next power of two.")
    if K % 64 != 0:
        raise ValueError("State dimension must be divisible by 64.")
    if T >= 2**17:
        raise ValueError("Sequence length must be less than 2**17")
    assert initial_state is None and not output_final_state, "the op's state is not emulated"
    # what the caller promises: a weight for every level the kernel touches (levels 0..6 inside its 64-token chunks and
    # those between chunks up to the top one, ceil(log2 T)); its backward reads and writes them with no bound check
    assert level_scales.shape[-1] >= max(7, (T - 1).bit_length() + 1), f"level_scales {tuple(level_scales.shape)} too narrow for T = {T}"
    scale = K**-0.5 if scale is None else scale
    with _no_autocast(q):
        o = _naive("log_linear_attn/naive.py").naive_log_linear_attn(q.float(), k.float(), v.float(), g.float(), level_scales.float(), scale=scale)
    return o.to(v.dtype), None


# module under fla.ops -> (the stand-in, where the real op is defined, relative to fla/ops)
STAND_INS = {
    "simple_gla": (chunk_simple_gla, "simple_gla/chunk.py"),
    "delta_rule": (chunk_delta_rule, "delta_rule/chunk.py"),
    "gated_delta_rule": (chunk_gated_delta_rule, "gated_delta_rule/chunk.py"),
    "kda": (chunk_kda, "kda/chunk.py"),
    "rwkv6": (chunk_rwkv6, "rwkv6/chunk.py"),
    "rwkv7": (chunk_rwkv7, "rwkv7/chunk.py"),
    "based": (parallel_based, "based/parallel.py"),
    "forgetting_attn": (parallel_forgetting_attn, "forgetting_attn/parallel.py"),
    "log_linear_attn": (chunk_log_linear_attn, "log_linear_attn/chunk.py"),
}


def install_stand_ins(monkeypatch):
    """Installs stand-in ``fla`` / ``fla.ops.*`` modules and lets the fast path run on CPU; yields the
    list of calls (op name, ``initial_state is None``, ``output_final_state``), then clears the cached import
    check (a generator for a fixture to ``yield from``; ``monkeypatch`` undoes the rest)."""
    for relpath in ("simple_gla/naive.py", "delta_rule/naive.py", "gated_delta_rule/naive.py", "kda/naive.py",
                    "rwkv6/recurrent_naive.py", "generalized_delta_rule/dplr/naive.py", "based/naive.py",
                    "forgetting_attn/naive.py", "log_linear_attn/naive.py"):
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

