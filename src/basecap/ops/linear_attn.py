"""Causal linear attention with Based's second-order Taylor feature map (Arora et al. 2024;
linear attention: Katharopoulos et al. 2020), chunked form.

    phi(x) = [1, x / d^(1/4), vec(x x^T) / sqrt(2 d)],   phi(q).phi(k) = 1 + s + s^2 / 2,  s = q.k / sqrt(d)
    o_t = sum_{s <= t} phi(q_t).phi(k_s) v_s = phi(q_t)^T S_t,   S_t = sum_{s <= t} phi(k_s) v_s^T

Outputs are unnormalised; append a column of ones to v to get the normaliser as the last column.
Layout ``[B, H, T, d]``; the state S is ``[B, H, 1 + d + d^2, V]`` in the order of phi (as in the
original Based code).

phi is never materialised: within a chunk the scores are 1 + s + s^2/2 from q.k; across chunks the
second-order block is a quadratic form, x^T S2[:, :, v] x = sum_i x_i (x @ S2)[i, v], i.e. a
``[C, d] @ [d, d V]`` product. The inter-chunk part is a custom autograd function that walks groups
of chunks in both passes and keeps only q, k, v and the per-chunk states, so memory stays
O(T d + T/C d^2 V) instead of O(T d^2).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

Tensor = torch.Tensor


def taylor_features(x: Tensor) -> Tensor:
    """``[..., d] -> [..., 1 + d + d^2]`` (used by references; the chunked form avoids it)."""
    d = x.shape[-1]
    xa = x * (2 * d) ** -0.25
    return torch.cat([torch.ones_like(x[..., :1]), x * d**-0.25, (xa[..., :, None] * xa[..., None, :]).flatten(-2)], dim=-1)


def taylor_kernel(q: Tensor, k: Tensor) -> Tensor:
    """phi(q) @ phi(k)^T without the features: ``[..., Tq, d] x [..., Tk, d] -> [..., Tq, Tk]``."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return 1 + s + 0.5 * s * s


def _quad(x: Tensor, M: Tensor) -> Tensor:
    """out[c, v] = sum_ij x[c, i] x[c, j] M[i, j, v]; x ``[..., C, d]``, M ``[..., d, d V]``."""
    d = x.shape[-1]
    return ((x @ M).unflatten(-1, (d, -1)) * x[..., None]).sum(-2)


def _quad_grad(x: Tensor, M: Tensor, g: Tensor) -> Tensor:
    """d/dx of sum_cv g[c, v] _quad(x, M)[c, v]."""
    d = x.shape[-1]
    M3 = M.unflatten(-1, (d, -1))
    Ms = (M3 + M3.transpose(-2, -3)).flatten(-2)
    return ((x @ Ms).unflatten(-1, (d, -1)) * g[..., None, :]).sum(-1)


def _groups(N: int, C: int) -> list[slice]:
    """Consecutive chunks handled together (~512 tokens): few large ops, cache-sized temporaries."""
    G = max(1, 512 // C)
    return [slice(i, min(i + G, N)) for i in range(0, N, G)]


def _split(S: Tensor, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """State ``[..., 1 + d + d^2, V]`` -> zeroth ``[..., V]``, first ``[..., d, V]``, second ``[..., d, d V]``."""
    V = S.shape[-1]
    return S[..., 0, :], S[..., 1 : 1 + d, :], S[..., 1 + d :, :].reshape(*S.shape[:-2], d, d * V)


def _pack(s0: Tensor, s1: Tensor, s2: Tensor) -> Tensor:
    V = s0.shape[-1]
    return torch.cat([s0[..., None, :], s1, s2.reshape(*s2.shape[:-2], -1, V)], dim=-2)


class _InterChunk(torch.autograd.Function):
    """o_n = phi(q_n) S_n and S_{n+1} = S_n + phi(k_n)^T v_n over chunks n (q, k, v ``[B, H, N, C, *]``)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, S0: Tensor):
        B, H, N, C, d = q.shape
        lin, sq = d**-0.25, (2 * d) ** -0.25
        out = v.new_empty(B, H, N, C, v.shape[-1])
        states = v.new_empty(B, H, N, *S0.shape[-2:])  # S_n: the state before chunk n
        S = S0
        for g in _groups(N, C):
            k_g, v_g, q_g = k[:, :, g], v[:, :, g], q[:, :, g]
            xk = k_g * sq
            kv = _pack(
                v_g.sum(-2), (k_g * lin).transpose(-1, -2) @ v_g, xk.transpose(-1, -2) @ (xk[..., :, None] * v_g[..., None, :]).flatten(-2)
            )  # [B, H, G, F, V]
            before = S[:, :, None] + (kv.cumsum(2) - kv)
            b0, b1, b2 = _split(before, d)
            out[:, :, g] = b0[..., None, :] + (q_g * lin) @ b1 + _quad(q_g * sq, b2)
            states[:, :, g] = before
            S = before[:, :, -1] + kv[:, :, -1]
        ctx.save_for_backward(q, k, v, states)
        return out, S

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor, d_final: Tensor):
        q, k, v, states = ctx.saved_tensors
        d = q.shape[-1]
        lin, sq = d**-0.25, (2 * d) ** -0.25
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        G_end = torch.zeros_like(states[:, :, 0]) if d_final is None else d_final  # dL/dS after the group
        for g in reversed(_groups(q.shape[2], q.shape[3])):
            q_g, k_g, v_g, d_o = q[:, :, g], k[:, :, g], v[:, :, g], d_out[:, :, g]
            xq, xk = q_g * sq, k_g * sq
            b0, b1, b2 = _split(states[:, :, g], d)
            dq[:, :, g] = (d_o @ b1.transpose(-1, -2)) * lin + _quad_grad(xq, b2, d_o) * sq
            # each chunk's pull on the state it read, then dL/dS_{n+1} for every chunk n of the group
            E = _pack(d_o.sum(-2), (q_g * lin).transpose(-1, -2) @ d_o, xq.transpose(-1, -2) @ (xq[..., :, None] * d_o[..., None, :]).flatten(-2))
            total = E.sum(2)
            g0, g1, g2 = _split(G_end[:, :, None] + (total[:, :, None] - E.cumsum(2)), d)
            dv[:, :, g] = g0[..., None, :] + (k_g * lin) @ g1 + _quad(xk, g2)
            dk[:, :, g] = (v_g @ g1.transpose(-1, -2)) * lin + _quad_grad(xk, g2, v_g) * sq
            G_end = G_end + total
        return dq, dk, dv, G_end


def taylor_linear_attn_chunked(q: Tensor, k: Tensor, v: Tensor, chunk_size: int = 64, state: Tensor | None = None):
    """``q, k [B, H, T, d]``, ``v [B, H, T, V]`` -> ``(o [B, H, T, V], S [B, H, 1 + d + d^2, V])``."""
    B, H, T, d = q.shape
    V = v.shape[-1]
    C = max(1, min(chunk_size, T))
    pad = (-T) % C
    N = (T + pad) // C

    def chunks(x):
        if pad:
            x = torch.cat([x, x.new_zeros(B, H, pad, x.shape[-1])], dim=2)
        return x.contiguous().view(B, H, N, C, x.shape[-1])  # a head-major copy: the chunk ops read it many times

    q, k, v = chunks(q), chunks(k), chunks(v)  # padded v = 0, so padded keys add nothing
    o = taylor_kernel(q, k).tril() @ v
    S0 = q.new_zeros(B, H, 1 + d + d * d, V) if state is None else state.to(q.dtype)
    inter, final = _InterChunk.apply(q, k, v, S0)
    return (o + inter).reshape(B, H, N * C, V)[:, :, :T], final
