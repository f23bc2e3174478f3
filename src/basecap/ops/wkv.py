"""WKV recurrences of RWKV-5/6 (Peng et al. 2024, arXiv 2404.05892) and RWKV-7 (Peng et al. 2025,
arXiv 2503.14456): a plain step-by-step reference and a chunked training form of each.

Layout: ``r, k, a, b, log_w`` are ``[B, T, H, K]``, ``v`` is ``[B, T, H, V]``, the state is
``[B, H, K, V]`` (key rows, value columns; the papers write its transpose). ``log_w`` is the
per-step log decay (<= 0). Derivations are in docs/mixers/rwkv.md.

RWKV-5/6 ("wkv6"), bonus ``u [H, K]``:
    y_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T),     S_t = diag(w_t) S_{t-1} + k_t v_t^T
RWKV-7 ("wkv7"), generalised delta rule with ``a = -kappa_hat``, ``b = kappa_hat * in-context lr``:
    S_t = diag(w_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,     y_t = r_t^T S_t

Chunked forms: inside a chunk of C tokens the decays are cumulative sums of ``log_w``; chunks
hand their state to the next (a Python loop over T/C chunks, never over time steps). RWKV-5/6
exponents are sums of exactly the log decays they span (their decay is unbounded); RWKV-7's are
referenced to the chunk midpoint (its decay is bounded); see each function.

Also here: the token shift and the depth-ramp / orthogonal initialisers the RWKV blocks share.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def _f32(x: Tensor) -> Tensor:
    """Half precisions are computed in fp32 (fp64 stays fp64, for tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _to_chunks(x: Tensor, C: int) -> Tensor:
    """[B, T, H, D] -> [B, H, N, C, D], zero-padding T up to a multiple of C (at least fp32)."""
    B, T, H, D = x.shape
    pad = (-T) % C
    if pad:
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
    return _f32(x).transpose(1, 2).reshape(B, H, (T + pad) // C, C, D)


def _from_chunks(y: Tensor, T: int) -> Tensor:
    """[B, H, N, C, D] -> [B, T, H, D]."""
    B, H, N, C, D = y.shape
    return y.reshape(B, H, N * C, D)[:, :, :T].transpose(1, 2)


def _chunk_scan(step: Callable[..., Tensor], S0: Tensor, *per_chunk: Tensor) -> tuple[Tensor, Tensor]:
    """Run ``S = step(S, *chunk_inputs)`` over the chunk axis (dim 2) of ``per_chunk``.

    Returns the state entering every chunk ``[B, H, N, K, V]`` and the final state."""
    entering = []
    S = S0
    for inputs in zip(*(t.unbind(2) for t in per_chunk)):
        entering.append(S)
        S = step(S, *inputs)
    return torch.stack(entering, 2), S


def _initial_state(state: Tensor | None, B: int, H: int, K: int, V: int, like: Tensor) -> Tensor:
    return like.new_zeros(B, H, K, V) if state is None else state.to(like.dtype)


# ---- shared by the RWKV blocks -------------------------------------------------------------


def token_shift(x: Tensor, last: Tensor | None) -> tuple[Tensor, Tensor]:
    """``x [B, T, D]`` -> (the previous token at every position, the new last token ``[B, D]``).
    ``last`` is the token before ``x`` (decode state); ``None`` means zeros (sequence start)."""
    first = x.new_zeros(x.shape[0], 1, x.shape[2]) if last is None else last[:, None].to(x.dtype)
    return torch.cat([first, x[:, :-1]], 1), x[:, -1]


def depth_ratios(layer_idx: int, n_layers: int) -> tuple[float, float]:
    """RWKV's init ramps: (``ratio_0_to_1`` = l / (L-1), ``ratio_1_to_almost0`` = 1 - l / L);
    layers past ``n_layers - 1`` are treated as the last layer."""
    layer = min(layer_idx, n_layers - 1)
    return (layer / (n_layers - 1) if n_layers > 1 else 0.0), 1.0 - layer / n_layers


@torch.no_grad()
def orthogonal_init_(w: Tensor, scale: float) -> Tensor:
    """RWKV's orthogonal init: gain ``scale``, times sqrt(rows / cols) for tall matrices."""
    rows, cols = w.shape
    return torch.nn.init.orthogonal_(w, gain=scale * (math.sqrt(rows / cols) if rows > cols else 1.0))


# ---- RWKV-5 / RWKV-6 ------------------------------------------------------------------------


def wkv6_recurrent(r: Tensor, k: Tensor, v: Tensor, log_w: Tensor, u: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Reference: one step at a time in fp32. Returns ``(y [B, T, H, V], final state)``."""
    B, T, H, K = r.shape
    V = v.shape[-1]
    r, k, v, u, w = _f32(r), _f32(k), _f32(v), _f32(u), _f32(log_w).exp()
    S = _initial_state(state, B, H, K, V, r)
    ys = []
    for t in range(T):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]  # [B, H, K, V]
        ys.append(torch.einsum("bhk,bhkv->bhv", r[:, t], S + u[:, :, None] * kv))
        S = w[:, t, :, :, None] * S + kv
    return torch.stack(ys, 1), S


def wkv6_chunked(
    r: Tensor, k: Tensor, v: Tensor, log_w: Tensor, u: Tensor, state: Tensor | None = None, chunk_size: int = 8
) -> tuple[Tensor, Tensor]:
    """Chunked form of :func:`wkv6_recurrent` (same arguments and results).

    RWKV-5/6 decays are unbounded (``w = exp(-exp(.))`` can be ~0), so a factorisation
    ``(r e^{g_t}) . (k e^{-g_s})`` could overflow, and a difference of two cumulative sums loses
    the small decay between nearby tokens once a huge one came earlier. Every exponent here is a
    sum of the log decays it spans (all <= 0, no cancellation): within a chunk the scores are
    built one lag ``t - s = 1 .. C-1`` at a time with a running window sum (each lag vectorised
    over all time steps; the loop runs C-1 times whatever T is); across chunks prefix/suffix sums."""
    B, T, H, K = r.shape
    V = v.shape[-1]
    C = min(chunk_size, T)  # a short input (decoding) is one chunk of its own length
    r_, k_, v_, lw = (_to_chunks(t, C) for t in (r, k, v, log_w))  # [B, H, N, C, *]
    bonus = (r_ * _f32(u)[None, :, None, None, :] * k_).sum(-1)  # current token, [B, H, N, C]
    scores = torch.diag_embed(bonus)  # [B, H, N, C(t), C(s)]
    window = lw.new_zeros(lw[..., 1:, :].shape)  # sum of log_w over (s, t-1], for t = s + lag
    for lag in range(1, C):
        if lag > 1:
            window = window[..., 1:, :] + lw[..., 1 : C - lag + 1, :]
        s_lag = (r_[..., lag:, :] * k_[..., :-lag, :] * window.exp()).sum(-1)
        scores = scores + torch.diag_embed(s_lag, offset=-lag)
    y = scores @ v_

    before = F.pad(lw.cumsum(3)[..., :-1, :], (0, 0, 1, 0))  # chunk start .. t-1
    after = F.pad(lw.flip(3).cumsum(3).flip(3)[..., 1:, :], (0, 0, 0, 1))  # s+1 .. chunk end
    chunk_kv = (k_ * after.exp()).transpose(-1, -2) @ v_  # [B, H, N, K, V]
    chunk_decay = lw.sum(3, keepdim=True).exp().transpose(-1, -2)  # [B, H, N, K, 1]
    S0 = _initial_state(state, B, H, K, V, r_)
    S_in, S_last = _chunk_scan(lambda S, d, kv: torch.addcmul(kv, d, S), S0, chunk_decay, chunk_kv)
    y = y + (r_ * before.exp()) @ S_in
    return _from_chunks(y, T), S_last


# ---- RWKV-7 -------------------------------------------------------------------------------


def wkv7_recurrent(r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Reference: one step at a time in fp32. Returns ``(y [B, T, H, V], final state)``."""
    B, T, H, K = r.shape
    V = v.shape[-1]
    r, k, v, a, b, w = _f32(r), _f32(k), _f32(v), _f32(a), _f32(b), _f32(log_w).exp()
    S = _initial_state(state, B, H, K, V, r)
    ys = []
    for t in range(T):
        sa = torch.einsum("bhk,bhkv->bhv", a[:, t], S)  # what the state returns for key a_t
        S = w[:, t, :, :, None] * S + b[:, t, :, :, None] * sa[:, :, None, :] + k[:, t, :, :, None] * v[:, t, :, None, :]
        ys.append(torch.einsum("bhk,bhkv->bhv", r[:, t], S))
    return torch.stack(ys, 1), S


def wkv7_chunked(
    r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor | None = None, chunk_size: int = 32
) -> tuple[Tensor, Tensor]:
    """Chunked (WY-style) form of :func:`wkv7_recurrent` (same arguments and results).

    Inside a chunk, ``u_t = a_t^T S_{t-1}`` solves a unit lower-triangular system, after which
    outputs and the chunk's state transition ``S <- M S + X`` are matrix products. Intra-chunk
    products use the decay relative to the chunk midpoint, so factors stay within
    ``exp(C/2 * max|log w|)``: RWKV-7 bounds ``|log w| <= exp(-0.5)``, i.e. <= e^19.4 at C = 64."""
    B, T, H, K = r.shape
    V = v.shape[-1]
    C = min(chunk_size, T)  # a short input (decoding) is one chunk of its own length
    r_, k_, v_, a_, b_, lw = (_to_chunks(t, C) for t in (r, k, v, a, b, log_w))  # [B, H, N, C, *]
    g = lw.cumsum(3)  # decay from the chunk start through t (the output reads S_t)
    ge = F.pad(g[..., :-1, :], (0, 0, 1, 0))  # ... through t-1 (u_t reads S_{t-1})
    mid = g[..., C // 2 : C // 2 + 1, :]
    from_mid = (mid - g).exp()
    keys = torch.cat([k_ * from_mid, b_ * from_mid], -2)  # [B, H, N, 2C, K]
    queries = torch.cat([r_ * (g - mid).exp(), a_ * (ge - mid).exp()], -2)  # [B, H, N, 2C, K]
    P = queries @ keys.transpose(-1, -2)  # [B, H, N, 2C, 2C]
    upto = torch.ones(C, C, dtype=torch.bool, device=r.device).tril(0)  # s <= t
    before = upto.tril(-1)  # s < t
    A_rk, A_rb = P[..., :C, :C] * upto, P[..., :C, C:] * upto
    A_ak, A_ab = P[..., C:, :C] * before, P[..., C:, C:] * before

    # u = (a e^{ge}) S_in + A_ak v + A_ab u  =>  u = W S_in + U
    eye = torch.eye(C, device=r.device, dtype=r_.dtype)
    rhs = torch.cat([a_ * ge.exp(), A_ak @ v_], -1)
    WU = torch.linalg.solve_triangular(eye - A_ab, rhs, upper=False, unitriangular=True)
    W, U = WU[..., :K], WU[..., K:]

    g_end = g[..., -1:, :]
    to_end = (g_end - g).exp()  # [B, H, N, C, K]
    kb_end = torch.cat([k_ * to_end, b_ * to_end], -2)  # [B, H, N, 2C, K]
    M = torch.diag_embed(g_end.squeeze(-2).exp()) + (b_ * to_end).transpose(-1, -2) @ W  # [B, H, N, K, K]
    X = kb_end.transpose(-1, -2) @ torch.cat([v_, U], -2)  # [B, H, N, K, V]
    S0 = _initial_state(state, B, H, K, V, r_)
    S_in, S_last = _chunk_scan(lambda S, M_n, X_n: X_n + M_n @ S, S0, M, X)
    u = W @ S_in + U
    y = (r_ * g.exp()) @ S_in + A_rk @ v_ + A_rb @ u
    return _from_chunks(y, T), S_last
