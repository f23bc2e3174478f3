"""Dense references of the Top-1 mixers: full T x T scores and membership masks, autograd for the
estimators. Slow and memory-hungry by design; the oracle the blockwise and tiled forms are tested
against."""

from __future__ import annotations

import torch

from .common import NEG_INF, SEL_DTYPE, Tensor, st_gate


def element_ref(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, scale: float, estimator: str) -> Tensor:
    """Top-1 Element: full [Tq, Tk] scores, argmax in float64 (first maximum), estimator by autograd."""
    vis = torch.arange(k.shape[2], device=q.device)[None, :] <= q_pos[:, None]  # [Tq, Tk]
    s = ((q.float() @ k.float().transpose(-1, -2)) * scale).masked_fill(~vis, float("-inf"))
    s64 = ((q.to(SEL_DTYPE) @ k.to(SEL_DTYPE).transpose(-1, -2)) * scale).masked_fill(~vis, float("-inf"))
    idx = s64.argmax(-1, keepdim=True)  # [B, H, Tq, 1]
    p = torch.softmax(s, dim=-1)
    if estimator == "straight_through":
        y = torch.zeros_like(p).scatter(-1, idx, 1.0) + (p - p.detach())  # exactly onehot in value
        return (y @ v.float()).to(v.dtype)
    p_sel = p.gather(-1, idx)
    v_sel = v.gather(2, idx.expand(-1, -1, -1, v.shape[-1]))
    return (p_sel / p_sel.detach()) * v_sel


def chunk_ref(
    q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, scale: float, chunk_len: int, *, selection: str, own_chunk: str, selector_grad: str
) -> Tensor:
    """Top-1 Chunk: builds the [Tq, n_chunks, Tk] membership mask and every score explicitly."""
    C, Tk = chunk_len, k.shape[2]
    n_chunks = -(-Tk // C)
    kpos, j = torch.arange(Tk, device=q.device), torch.arange(n_chunks, device=q.device)
    own = q_pos // C
    vis = kpos[None, :] <= q_pos[:, None]  # [Tq, Tk]
    M = vis[:, None, :] & ((kpos // C)[None, :] == j[:, None])[None]  # [Tq, n_chunks, Tk]
    cand = j[None, :] <= own[:, None] if own_chunk == "candidate" else j[None, :] < own[:, None]
    valid = cand.any(-1)  # [Tq]
    s = (q.float() @ k.float().transpose(-1, -2)) * scale  # [B, H, Tq, Tk]
    q64, k64 = q.to(SEL_DTYPE), k.to(SEL_DTYPE)
    if selection == "exact":
        s64 = (q64 @ k64.transpose(-1, -2)) * scale
        score = s64[:, :, :, None, :].masked_fill(~M, NEG_INF).logsumexp(-1)  # l_tj
    else:
        n = M.sum(-1)  # [Tq, n_chunks]
        kbar = torch.einsum("tji,bhid->bhtjd", M.to(SEL_DTYPE), k64) / n.clamp(min=1)[..., None]
        score = (q64[:, :, :, None, :] * kbar).sum(-1) * scale + n.clamp(min=1).to(SEL_DTYPE).log()
    score = score.masked_fill(~cand, NEG_INF)
    sel = score.detach().argmax(-1)  # [B, H, Tq], first maximum
    A = M[torch.arange(len(q_pos), device=q.device), sel] & valid[:, None]  # keys of the selected chunk
    if own_chunk == "always":
        A = A | M[torch.arange(len(q_pos), device=q.device), own]
    o = torch.softmax(s.masked_fill(~A, NEG_INF), dim=-1) @ v.float()
    if selector_grad == "straight_through":
        if selection == "exact":
            l32 = torch.where(M, s[:, :, :, None, :], NEG_INF).logsumexp(-1)
            l_cand = torch.where(valid[:, None], l32.masked_fill(~cand, NEG_INF), 0.0)
            log_p = l32.gather(-1, sel[..., None])[..., 0] - l_cand.logsumexp(-1)
        else:
            log_p = torch.log_softmax(torch.where(valid[:, None], score, 0.0), -1).gather(-1, sel[..., None])[..., 0]
        o = o * st_gate(torch.where(valid, log_p, 0.0).float())[..., None]
    return o.to(v.dtype)
