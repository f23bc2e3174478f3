"""CUDA fast path (``impl="fast"``) of the linear-recurrent mixers through flash-linear-attention
(Yang, Zhang et al., "FLA: A Triton-Based Library for Hardware-Efficient Implementations of Linear
Attention Mechanism", github.com/fla-org/flash-linear-attention), version 0.6.0.

Thin adapters, never vendored code: each function takes the tensors of one of our ops in our layout
and conventions, calls one fla op, and maps the results back, so it is a drop-in for that op:

    Mamba-2        ops.ssm.ssd_chunked              fla.ops.simple_gla.chunk_simple_gla
    DeltaNet       ops.delta_rule.delta_rule_chunked fla.ops.delta_rule.chunk_delta_rule
    Gated DeltaNet ops.delta_rule.delta_rule_chunked fla.ops.gated_delta_rule.chunk_gated_delta_rule
    KDA            mixers.kda.kda_chunked            fla.ops.kda.chunk_kda
    RWKV-6         ops.wkv.wkv6_chunked              fla.ops.rwkv6.chunk_rwkv6
    RWKV-7         ops.wkv.wkv7_chunked              fla.ops.rwkv7.chunk_rwkv7 (the DPLR delta rule)
    Based (linear) ops.linear_attn (+ normaliser)    fla.ops.based.parallel_based
    FoX            mixers.forgetting_attn (masked)  fla.ops.forgetting_attn.parallel_forgetting_attn
    LogLin Mamba-2 mixers.log_linear_mamba2         fla.ops.log_linear_attn.chunk_log_linear_attn (training)

The ``*_inputs`` functions hold the whole convention mapping (layout, scale, decay sign, state layout,
dtypes) as plain PyTorch, so CPU tests check them against fla's own pure-PyTorch references. The
mapping table and what is untested are in docs/kernels.md.

This module imports neither fla nor Triton at import time: each adapter imports its op when called,
and :func:`resolve_impl` (the one place that decides whether the fast path runs) imports fla only for
a CUDA input.
"""

from __future__ import annotations

import functools
import logging
import math

import torch

from ..config_base import ConfigError
from .common import log_once

log = logging.getLogger(__name__)
Tensor = torch.Tensor

FLA_VERSION = "0.6.0"  # the version these mappings were written against
# Device types the fast path runs on (fla's kernels are Triton kernels for CUDA). The CPU emulation test
# (tests/test_fla_emulation.py) adds "cpu" while fla's pure-PyTorch references stand in for the kernels.
KERNEL_DEVICES: tuple[str, ...] = ("cuda",)


def _log_once(msg: str, level: int = logging.INFO) -> None:
    log_once(log, msg, level)


@functools.cache
def fla_import_error() -> str | None:
    """``None`` if fla's Triton kernels import, else why not. Checked once per process."""
    try:
        import fla
        import fla.ops  # imports Triton and every kernel module
    except (ImportError, RuntimeError) as e:  # not installed; Triton without a usable driver raises RuntimeError
        return f"{type(e).__name__}: {e}"
    version = getattr(fla, "__version__", "unknown")
    if version != FLA_VERSION:
        _log_once(f"flash-linear-attention {version} found; basecap's adapters were written against {FLA_VERSION}", logging.WARNING)
    return None


def resolve_impl(name: str, impl: str, x: Tensor) -> str:
    """``"fast"`` or ``"chunked"`` for a mixer whose config says ``impl`` ("fast" or "auto").

    "auto" means fast when ``x`` is on CUDA (a device type in ``KERNEL_DEVICES``) and fla imports,
    else the chunked PyTorch form; the decision depends on the device and the installation only (never
    on the sequence length) and is logged once per process. "fast" where it cannot run is a
    configuration error."""
    if impl not in ("fast", "auto"):
        return impl
    if x.device.type not in KERNEL_DEVICES:
        if impl == "fast":
            raise ConfigError(f"{name}.impl: impl='fast' needs CUDA and flash-linear-attention; use 'chunked' on CPU (got an input on {x.device})")
        return "chunked"
    err = fla_import_error()
    if err is None:
        _log_once(f"impl={impl!r} on {x.device.type}: linear-recurrent mixers run flash-linear-attention kernels ('fast')")
        return "fast"
    if impl == "fast":
        raise ConfigError(f"{name}.impl: impl='fast' needs CUDA and flash-linear-attention (pip install 'basecap[fast]'); fla does not import: {err}")
    _log_once(f"impl='auto' on CUDA: flash-linear-attention does not import ({err}); using the chunked PyTorch forms", logging.WARNING)
    return "chunked"


def compute_dtype(x: Tensor, fp32_ok: bool = True) -> torch.dtype:
    """The dtype q/k/v enter a kernel in: the autocast dtype inside autocast, else the activations' own;
    fp32 becomes bf16 for kernels that reject fp32 (``fp32_ok=False``)."""
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
    else:
        dtype = x.dtype
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        dtype = torch.float32
    if dtype == torch.float32 and not fp32_ok:
        dtype = torch.bfloat16
    return dtype


def _btd(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``[B, H, T, *] -> [B, T, H, *]``, contiguous, in ``dtype``."""
    return x.transpose(1, 2).to(dtype).contiguous()


def _state(S: Tensor | None) -> Tensor | None:
    return None if S is None else S.float().contiguous()


# ---- Mamba-2 (SSD, one group) -> simple GLA ------------------------------------------------------------


def ssd_inputs(X: Tensor, log_a: Tensor, Bm: Tensor, Cm: Tensor, h0: Tensor | None = None) -> dict:
    """``chunk_simple_gla`` arguments for ``ssd_chunked(X [B,T,H,P], log_a [B,T,H], Bm, Cm [B,T,N], h0 [B,H,P,N])``.

    SSD is simple GLA with q = C, k = B (shared by the heads), v = dt * x, g = log a (head-wise
    log decay, <= 0) and scale 1. Our state is ``[H, P, N]`` (value x key); fla's is ``[H, K, V]``."""
    B, T, H, _ = X.shape
    N = Bm.shape[-1]
    dtype = compute_dtype(X)
    return dict(
        q=Cm[:, :, None].expand(B, T, H, N).to(dtype).contiguous(),
        k=Bm[:, :, None].expand(B, T, H, N).to(dtype).contiguous(),
        v=X.to(dtype).contiguous(),
        g=log_a.float().contiguous(),
        scale=1.0,
        initial_state=None if h0 is None else h0.float().transpose(-1, -2).contiguous(),
        output_final_state=h0 is not None,
    )


def ssd(X: Tensor, log_a: Tensor, Bm: Tensor, Cm: Tensor, h0: Tensor | None = None, *, op=None) -> tuple[Tensor, Tensor | None]:
    """Drop-in for ``ops.ssm.ssd_chunked``; the final state is returned only when ``h0`` is given.
    ``op``: the function called with fla's arguments (default fla's kernel; tests pass fla's reference)."""
    if op is None:
        from fla.ops.simple_gla import chunk_simple_gla

        op = chunk_simple_gla
    y, h = op(**ssd_inputs(X, log_a, Bm, Cm, h0))
    return y.to(X.dtype), (None if h is None or h0 is None else h.transpose(-1, -2).to(h0.dtype))


# ---- DeltaNet / Gated DeltaNet ----------------------------------------------------------------------

DELTA_MAX_HEAD_DIM = 256  # fla's chunk delta-rule state kernels (common/chunk_delta_h.py) assert K <= 256


def delta_rule_inputs(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None, state: Tensor | None = None) -> dict:
    """``chunk_delta_rule`` (``g is None``) or ``chunk_gated_delta_rule`` arguments for
    ``delta_rule_chunked(q, k [B,H,T,K], v [B,H,T,V], beta, g [B,H,T], state [B,H,K,V])``.

    Same recurrence, same state layout and the same default scale K^-1/2; fla wants time-major
    ``[B, T, H, *]``. q and k arrive L2-normalised, so the kernel's own L2 norm stays off. Both kernels
    run in 16-bit: fla's delta rule rejects fp32, and fla documents the gated one with bf16 q/k/v
    (the log decay g stays fp32, as in fla's GatedDeltaNet layer)."""
    if q.shape[-1] > DELTA_MAX_HEAD_DIM:
        raise ConfigError(
            f"head_dim: impl='fast' (fla's chunk delta rule) supports head_dim <= {DELTA_MAX_HEAD_DIM}, got {q.shape[-1]}; use impl='chunked'"
        )
    dtype = compute_dtype(q, fp32_ok=False)
    kw = dict(
        q=_btd(q, dtype),
        k=_btd(k, dtype),
        v=_btd(v, dtype),
        beta=beta.transpose(1, 2).to(dtype).contiguous(),
        initial_state=_state(state),
        output_final_state=state is not None,
        use_qk_l2norm_in_kernel=False,
    )
    if g is not None:
        kw["g"] = g.transpose(1, 2).float().contiguous()
    return kw


def delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None, state: Tensor | None = None, *, op=None
) -> tuple[Tensor, Tensor | None]:
    """Drop-in for ``ops.delta_rule.delta_rule_chunked`` (default scale); returns ``o [B,H,T,V]`` and
    the final state (only when ``state`` is given). ``op`` as in :func:`ssd`."""
    if op is None and g is None:
        from fla.ops.delta_rule import chunk_delta_rule

        op = chunk_delta_rule
    elif op is None:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        op = chunk_gated_delta_rule
    o, S = op(**delta_rule_inputs(q, k, v, beta, g, state))
    return o.transpose(1, 2).to(v.dtype), S


# ---- Kimi Delta Attention (KDA) ----------------------------------------------------------------------


def kda_inputs(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, state: Tensor | None = None) -> dict:
    """``chunk_kda`` arguments for ``kda_chunked(q, k, g [B,H,T,K], v [B,H,T,V], beta [B,H,T], state [B,H,K,V])``.

    The same recurrence S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T, the same
    key x value state and default scale K^-1/2; fla wants time-major ``[B, T, H, *]``. We compute the
    per-channel log decay g (<= 0) and beta (after the sigmoid) ourselves, so the kernel's gate, beta
    sigmoid and L2 norm stay off; g and the state go in fp32 (the op asserts an fp32 state), q/k/v and
    beta in 16-bit as for the gated delta rule (fla documents ``chunk_kda`` with bf16 inputs)."""
    if q.shape[-1] > DELTA_MAX_HEAD_DIM:
        raise ConfigError(
            f"kda.head_dim: impl='fast' (fla chunk_kda) supports head_dim <= {DELTA_MAX_HEAD_DIM}, got {q.shape[-1]}; use impl='chunked'"
        )
    dtype = compute_dtype(q, fp32_ok=False)
    return dict(
        q=_btd(q, dtype),
        k=_btd(k, dtype),
        v=_btd(v, dtype),
        g=_btd(g, torch.float32),
        beta=beta.transpose(1, 2).to(dtype).contiguous(),
        initial_state=_state(state),
        output_final_state=state is not None,
        use_qk_l2norm_in_kernel=False,
        use_gate_in_kernel=False,
        use_beta_sigmoid_in_kernel=False,
    )


def kda(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, state: Tensor | None = None, *, op=None) -> tuple[Tensor, Tensor | None]:
    """Drop-in for ``mixers.kda.kda_chunked`` (default scale): ``o [B,H,T,V]`` and the final state (only
    when ``state`` is given). ``op`` as in :func:`ssd`."""
    if op is None:
        from fla.ops.kda import chunk_kda

        op = chunk_kda
    o, S = op(**kda_inputs(q, k, v, beta, g, state))
    return o.transpose(1, 2).to(v.dtype), S


# ---- RWKV-6 ---------------------------------------------------------------------------------------


def wkv6_inputs(r: Tensor, k: Tensor, v: Tensor, log_w: Tensor, u: Tensor, state: Tensor | None = None) -> dict:
    """``chunk_rwkv6`` arguments for ``wkv6_chunked(r, k, v, log_w [B,T,H,K], u [H,K], state [B,H,K,V])``.

    Layouts and state already agree; fla's ``w`` is the log decay (our ``log_w``, <= 0), the bonus u
    is passed as is (fla's RWKV6 layer passes the fp32 parameter), and the scale must be 1 (fla's
    default is K^-1/2)."""
    dtype = compute_dtype(r)
    return dict(
        r=r.to(dtype).contiguous(),
        k=k.to(dtype).contiguous(),
        v=v.to(dtype).contiguous(),
        w=log_w.float().contiguous(),
        u=u,
        scale=1.0,
        initial_state=_state(state),
        output_final_state=state is not None,
    )


def wkv6(r: Tensor, k: Tensor, v: Tensor, log_w: Tensor, u: Tensor, state: Tensor | None = None, *, op=None) -> tuple[Tensor, Tensor | None]:
    """Drop-in for ``ops.wkv.wkv6_chunked``: ``y [B,T,H,V]`` and the final state (when ``state`` is
    given). ``op`` as in :func:`ssd`."""
    if op is None:
        from fla.ops.rwkv6 import chunk_rwkv6

        op = chunk_rwkv6
    y, S = op(**wkv6_inputs(r, k, v, log_w, u, state))
    return y.to(v.dtype), S


# ---- RWKV-7 ---------------------------------------------------------------------------------------

RWKV7_LOG_W_MIN = -math.exp(-0.5)  # RWKV-7's log decay lies in [-e^-1/2, 0)


def wkv7_inputs(r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor | None = None) -> dict:
    """``chunk_rwkv7`` arguments for ``wkv7_chunked(r, log_w, k, v, a, b [B,T,H,K], state [B,H,K,V])``.

    The same generalised delta rule S_t = diag(w_t) S + b_t (a_t^T S) + k_t v_t^T, y_t = r_t^T S_t,
    with the same layouts, scale 1 and fla's ``w`` = our log decay. As in fla's RWKV7 layer: 16-bit
    inputs (the DPLR op warns on fp32) and the decay bound ``lower_bound = -e^-1/2`` that licenses its
    tensor-core path; fla then picks chunk size 64 (16 on Triton < 3.4)."""
    dtype = compute_dtype(r, fp32_ok=False)
    return dict(
        r=r.to(dtype).contiguous(),
        w=log_w.float().contiguous(),
        k=k.to(dtype).contiguous(),
        v=v.to(dtype).contiguous(),
        a=a.to(dtype).contiguous(),
        b=b.to(dtype).contiguous(),
        scale=1.0,
        initial_state=_state(state),
        output_final_state=state is not None,
        safe_gate=True,
        lower_bound=RWKV7_LOG_W_MIN,
    )


def wkv7(
    r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor | None = None, *, op=None
) -> tuple[Tensor, Tensor | None]:
    """Drop-in for ``ops.wkv.wkv7_chunked``: ``y [B,T,H,V]`` and the final state (when ``state`` is
    given). ``op`` as in :func:`ssd`."""
    if op is None:
        from fla.ops.rwkv7 import chunk_rwkv7

        op = chunk_rwkv7
    y, S = op(**wkv7_inputs(r, log_w, k, v, a, b, state))
    return y.to(v.dtype), S


# ---- Based (Taylor linear attention) --------------------------------------------------------------

BASED_MAX_FEATURE_DIM = 128  # parallel_based's limit


def based_inputs(q: Tensor, k: Tensor, v: Tensor) -> dict:
    """``parallel_based`` arguments for Based's linear branch, ``q, k [B,H,T,d]``, ``v [B,H,T,V]``.

    fla's kernel computes the same normalised 1 + s + s^2/2 attention with s = q.k / sqrt(d), time-major,
    without a state (training only) and with its own normaliser epsilon 1e-6 (ours: ``BasedConfig.eps``;
    the normaliser is >= 1/2 per key, so the difference is below 1e-6 relative)."""
    d = q.shape[-1]
    if d > BASED_MAX_FEATURE_DIM:
        raise ConfigError(
            f"based.feature_dim: impl='fast' (fla parallel_based) supports feature_dim <= {BASED_MAX_FEATURE_DIM}, got {d}; use impl='chunked'"
        )
    dtype = compute_dtype(q)
    return dict(q=_btd(q, dtype), k=_btd(k, dtype), v=_btd(v, dtype), scale=d**-0.5, use_norm=True)


def based_linear(q: Tensor, k: Tensor, v: Tensor, *, op=None) -> Tensor:
    """Normalised Taylor linear attention, ``o [B,H,T,V]``; no state in or out. ``op`` as in :func:`ssd`."""
    if op is None:
        from fla.ops.based import parallel_based

        op = parallel_based
    return op(**based_inputs(q, k, v)).transpose(1, 2).to(v.dtype)


# ---- Forgetting Transformer (FoX) -------------------------------------------------------------------

FOX_MAX_HEAD_DIM = 256  # parallel_attn asserts K <= 256 (one key block)


def forgetting_attn_inputs(q: Tensor, k: Tensor, v: Tensor, log_f: Tensor, scale: float) -> dict:
    """``parallel_forgetting_attn`` arguments for FoX's attention, ``q, k, v [B,H,T,D]``, ``log_f [B,H,T]``.

    fla's kernel adds sum_{l=j+1..i} g_l to logit_ij with g the per-step log forget gate (<= 0), exactly our
    bias; it takes the gates themselves (it forms the cumulative sums), time-major, in fp32. Our scale is
    passed as is (fla's default D^-1/2 is the same). No cache: training only."""
    if q.shape[-1] > FOX_MAX_HEAD_DIM:
        raise ConfigError(
            f"forgetting_attn.head_dim: impl='fast' (fla parallel_forgetting_attn) supports head_dim <= {FOX_MAX_HEAD_DIM}, "
            f"got {q.shape[-1]}; use impl='chunked'"
        )
    dtype = compute_dtype(q)
    return dict(q=_btd(q, dtype), k=_btd(k, dtype), v=_btd(v, dtype), g=log_f.transpose(1, 2).float().contiguous(), scale=scale)


def forgetting_attn(q: Tensor, k: Tensor, v: Tensor, log_f: Tensor, scale: float, *, op=None) -> Tensor:
    """Forgetting attention, ``o [B,H,T,D]``; no state in or out. ``op`` as in :func:`ssd`."""
    if op is None:
        from fla.ops.forgetting_attn import parallel_forgetting_attn

        op = parallel_forgetting_attn
    return op(**forgetting_attn_inputs(q, k, v, log_f, scale)).transpose(1, 2).to(v.dtype)


# ---- Log-linear Mamba-2 -> log-linear attention -------------------------------------------------------

LOG_LINEAR_KEY_BLOCK = 64  # chunk_log_linear_attn tiles the key (state) dimension in blocks of 64 and rejects others
# Its forward reads levels 0..6 inside its 64-token chunks and the levels between chunks up to the sequence's top level
# (masking those past the width of level_scales); its backward reads and writes all of them with no bound check
LOG_LINEAR_INTRA_LEVELS = 7
LOG_LINEAR_MAX_LEN = 2**17  # it keeps at most 11 chunk levels: sequences shorter than 2^17 tokens
_pad = torch.nn.functional.pad


def log_linear_attn_inputs(X: Tensor, log_a: Tensor, Bm: Tensor, Cm: Tensor, lam: Tensor) -> dict:
    """``chunk_log_linear_attn`` arguments for log-linear Mamba-2's training form (no state),
    ``log_linear_chunked(X [B,T,H,P], log_a [B,T,H], Bm, Cm [B,T,N], lam [B,T,H,L])``.

    As Mamba-2 (:func:`ssd_inputs`): q = C, k = B, v = dt * x, g = log a (per head and step, <= 0), scale 1;
    the one group is passed as one key head shared by the H value heads (fla's ``G = 1``). ``level_scales`` =
    lambda, fp32, with level l at index l. Padding, all exact: the keys (B and C) with zero channels to a
    multiple of 64, the values with zero channels to a power of two (at least 16; the extra output channels
    are dropped), lambda with zero levels (our levels past its width weigh 0) to every level the kernel
    touches: at least 7 and the sequence's top level, bit_length(T - 1). The kernel's forward masks levels
    past the width but its backward does not (a narrower lambda gives wrong gradients)."""
    B, T, H, P = X.shape
    N, L = Bm.shape[-1], lam.shape[-1]
    if T >= LOG_LINEAR_MAX_LEN:
        raise ConfigError(
            f"log_linear_mamba2.impl: impl='fast' (fla chunk_log_linear_attn) takes fewer than {LOG_LINEAR_MAX_LEN} tokens, got {T}; use impl='chunked'"
        )
    dtype = compute_dtype(X)
    pad_k = -N % LOG_LINEAR_KEY_BLOCK
    pad_v = max(16, 1 << (P - 1).bit_length()) - P
    return dict(
        q=_pad(Cm, (0, pad_k))[:, :, None].to(dtype).contiguous(),
        k=_pad(Bm, (0, pad_k))[:, :, None].to(dtype).contiguous(),
        v=_pad(X, (0, pad_v)).to(dtype).contiguous(),
        g=log_a.float().contiguous(),
        level_scales=_pad(lam.float(), (0, max(0, LOG_LINEAR_INTRA_LEVELS - L, (T - 1).bit_length() + 1 - L))).contiguous(),
        scale=1.0,
    )


def log_linear_attn(X: Tensor, log_a: Tensor, Bm: Tensor, Cm: Tensor, lam: Tensor, *, op=None) -> Tensor:
    """Drop-in for ``mixers.log_linear_mamba2.log_linear_chunked`` in training: ``y [B,T,H,P]``; no state in or
    out (fla's state keeps the raw tokens of its open chunk, not our level states). ``op`` as in :func:`ssd`."""
    if op is None:
        from fla.ops.log_linear_attn import chunk_log_linear_attn

        op = chunk_log_linear_attn
    o, _ = op(**log_linear_attn_inputs(X, log_a, Bm, Cm, lam))
    return o[..., : X.shape[-1]].to(X.dtype)
