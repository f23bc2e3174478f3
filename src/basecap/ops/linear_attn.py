"""Causal linear attention with a feature map (Katharopoulos et al. 2020, "Transformers are RNNs"),
chunked form (each mixer keeps its own step-by-step reference).

    o_t = sum_{s <= t} (phi(q_t) . phi(k_s)) v_s = phi(q_t)^T KV_t,    KV_t = sum_{s <= t} phi(k_s) v_s^T

Outputs are unnormalised; a caller that wants the usual normaliser appends a column of ones to v
(the last output column is then phi(q_t) . sum_s phi(k_s)). Layout: ``[B, H, T, D]``; the state
KV is ``[B, H, F, V]`` with F the feature dimension.
"""

from __future__ import annotations

from typing import Callable

import torch

Tensor = torch.Tensor


def linear_attn_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature_map: Callable[[Tensor], Tensor],
    kernel: Callable[[Tensor, Tensor], Tensor] | None = None,
    chunk_size: int = 64,
    state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Chunked form on raw ``q, k [B, H, T, D]``.

    Within a chunk the scores come from ``kernel(q, k) -> [..., C, C]`` (which must equal
    ``feature_map(q) @ feature_map(k)^T``; it is cheaper when the feature map is large), across
    chunks from the prefix sums of per-chunk KV. No loop over time or chunks.
    """
    B, H, T, D = q.shape
    V = v.shape[-1]
    C = max(1, min(chunk_size, T))
    pad = (-T) % C
    N = (T + pad) // C

    def chunks(x):
        if pad:
            x = torch.cat([x, x.new_zeros(B, H, pad, x.shape[-1])], dim=2)
        return x.view(B, H, N, C, x.shape[-1])

    q, k, v = chunks(q), chunks(k), chunks(v)  # padded v = 0, so padded keys add nothing
    qf, kf = feature_map(q), feature_map(k)  # [B, H, N, C, F]
    scores = kernel(q, k) if kernel is not None else qf @ kf.transpose(-1, -2)
    o = scores.tril() @ v
    kv = kf.transpose(-1, -2) @ v  # per-chunk sums [B, H, N, F, V]
    before = torch.cat([torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1]], dim=2).cumsum(2)  # exclusive prefix
    if state is not None:
        before = before + state[:, :, None].to(kv.dtype)
    o = o + qf @ before
    final = before[:, :, -1] + kv[:, :, -1]
    return o.reshape(B, H, N * C, V)[:, :, :T], final
