"""The delta rule and the gated delta rule: a step-by-step fp32 reference and a chunked form.

DeltaNet (Schlag et al. 2021; Yang et al. 2024, "Parallelizing Linear Transformers with the Delta
Rule over Sequence Length", arXiv 2406.06484) and Gated DeltaNet (Yang et al. 2025, "Gated Delta
Networks: Improving Mamba2 with Delta Rule", arXiv 2412.06464).

Layout: q, k ``[B, H, T, K]``, v ``[B, H, T, V]``, beta and the log-decay g ``[B, H, T]``; the state
S is ``[B, H, K, V]`` and the recurrence is

    S_t = a_t S_{t-1} + k_t beta_t (v_t - a_t S_{t-1}^T k_t)^T,   a_t = exp(g_t)  (a_t = 1 without g)
    o_t = scale * S_t^T q_t

The chunked form (UT transform, see docs/mixers/delta.md) solves one unit lower-triangular system
per chunk for all chunks at once, then passes the state across chunks: the only Python loop runs
over T / C chunks. Decay enters as within-chunk cumulative sums of g (log space), so every
exponent is <= 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def delta_rule_recurrent(q, k, v, beta, g=None, scale: float | None = None, state=None):
    """Plain step-by-step recurrence in fp32 (the oracle). Returns ``(o [B,H,T,V], S [B,H,K,V])``."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    q, k, v, beta = q.float() * scale, k.float(), v.float(), beta.float()
    a = torch.ones_like(beta) if g is None else g.float().exp()
    S = q.new_zeros(B, H, K, V) if state is None else state.float()
    outs = []
    for q_t, k_t, v_t, b_t, a_t in zip(q.unbind(2), k.unbind(2), v.unbind(2), beta.unbind(2), a.unbind(2)):
        S = S * a_t[..., None, None]
        pred = (k_t[..., None, :] @ S).squeeze(-2)  # S^T k: what the memory returns for k_t, [B, H, V]
        S = S + k_t[..., :, None] * (b_t[..., None] * (v_t - pred))[..., None, :]
        outs.append((q_t[..., None, :] @ S).squeeze(-2))
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, V)
    return o, S


def _pad_time(x: torch.Tensor, pad: int, dim: int) -> torch.Tensor:
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def delta_rule_chunked(q, k, v, beta, g=None, scale: float | None = None, state=None, chunk_size: int = 64):
    """Chunked (UT transform) delta rule; same contract as :func:`delta_rule_recurrent`.

    Padded steps have k = v = beta = g = 0, i.e. they leave the state unchanged.
    """
    B, H, T, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    C = max(1, min(chunk_size, T))
    pad = (-T) % C
    N = (T + pad) // C
    q = _pad_time(q * scale, pad, 2).view(B, H, N, C, K)
    k = _pad_time(k, pad, 2).view(B, H, N, C, K)
    v = _pad_time(v, pad, 2).view(B, H, N, C, V)
    beta = _pad_time(beta, pad, 2).view(B, H, N, C, 1)

    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()  # s <= t
    if g is not None:
        G = _pad_time(g, pad, 2).view(B, H, N, C).cumsum(-1)  # log of prod_{u<=t} a_u within the chunk
        decay = (G[..., :, None] - G[..., None, :]).masked_fill(~incl, float("-inf")).exp()  # [B,H,N,C,C]
        gam = G.exp()[..., None]  # decay from the chunk start to t: [B, H, N, C, 1]
        k_to_end = k * (G[..., -1:] - G).exp()[..., None]  # k_s weighted by decay from s to chunk end
        chunk_decay = G[..., -1].exp()[..., None, None]  # [B, H, N, 1, 1]
    else:
        decay = incl.to(q.dtype)
        gam, k_to_end, chunk_decay = None, k, None

    # u = (I + A)^{-1} diag(beta) (v - gam * k S0),  A[t, s] = beta_t decay[t, s] k_t.k_s for s < t
    A = (beta * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    L = A + torch.eye(C, dtype=q.dtype, device=q.device)
    T_ut = torch.linalg.solve_triangular(L, torch.diag_embed(beta.squeeze(-1)), upper=False, unitriangular=True)
    u_free, w = T_ut @ v, T_ut @ (k if gam is None else k * gam)  # u = u_free - w @ S0
    P = (q @ k.transpose(-1, -2)) * decay  # intra-chunk scores, zero above the diagonal
    q_s = q if gam is None else q * gam  # reads the chunk-start state

    S = q.new_zeros(B, H, K, V) if state is None else state.to(q.dtype)
    # unbind once: indexing chunk n inside the loop would cost a full-size gradient buffer per chunk
    per_chunk = zip(
        u_free.unbind(2),
        w.unbind(2),
        q_s.unbind(2),
        P.unbind(2),
        k_to_end.transpose(-1, -2).unbind(2),
        [None] * N if chunk_decay is None else chunk_decay.unbind(2),
    )
    outs = []
    for u_n, w_n, q_n, P_n, kT_n, dec_n in per_chunk:
        u = u_n - w_n @ S  # [B, H, C, V]
        outs.append(q_n @ S + P_n @ u)
        S = (S if dec_n is None else S * dec_n) + kT_n @ u
    o = torch.stack(outs, dim=2).reshape(B, H, N * C, V)[:, :, :T]
    return o, S


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.normalize(x, p=2.0, dim=-1, eps=eps)
