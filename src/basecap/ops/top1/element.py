"""Top-1 Element attention, blockwise: ``o_t = v_{argmax_i s_ti}`` with a hand-written backward."""

from __future__ import annotations

import torch

from .common import NEG_INF, SEL_DTYPE, Tensor, causal_mask


class _Top1Element(torch.autograd.Function):
    """o_t = v_{argmax_i s_ti}; backward by the straight-through soft or probability-ratio estimator.

    Forward and backward loop over query blocks of ``block_rows`` rows (full rows of visible keys), so
    memory is O(block_rows * Tk), never Tq x Tk."""

    @staticmethod
    def forward(ctx, q, k, v, q_pos, scale, block_rows, estimator):
        B, H, Tq, D = q.shape
        idx = torch.empty(B, H, Tq, dtype=torch.long, device=q.device)
        lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)
        for s in range(0, Tq, block_rows):
            pos = q_pos[s : s + block_rows]
            end = int(pos[-1]) + 1
            sc = (q[:, :, s : s + block_rows].to(SEL_DTYPE) @ k[:, :, :end].to(SEL_DTYPE).transpose(-1, -2)) * scale
            sc = sc.masked_fill(causal_mask(pos, end).logical_not(), NEG_INF)
            idx[:, :, s : s + block_rows] = sc.argmax(-1)
            lse[:, :, s : s + block_rows] = sc.logsumexp(-1).float()
        out = v.gather(2, idx[..., None].expand(-1, -1, -1, v.shape[-1]))
        ctx.save_for_backward(q, k, v, q_pos, idx, lse)
        ctx.scale, ctx.block_rows, ctx.estimator = scale, block_rows, estimator
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, q_pos, idx, lse = ctx.saved_tensors
        scale, block_rows = ctx.scale, ctx.block_rows
        dq, dk = torch.zeros_like(q), torch.zeros_like(k)
        # both estimators pass dO straight to the selected value
        dv = torch.zeros_like(v).scatter_add_(2, idx[..., None].expand(-1, -1, -1, v.shape[-1]), dout.to(v.dtype))
        for s in range(0, q.shape[2], block_rows):
            pos = q_pos[s : s + block_rows]
            end = int(pos[-1]) + 1
            qb, kb, do = q[:, :, s : s + block_rows], k[:, :, :end], dout[:, :, s : s + block_rows]
            sc = (qb @ kb.transpose(-1, -2)) * scale
            p = torch.exp(sc - lse[:, :, s : s + block_rows, None]).masked_fill(causal_mask(pos, end).logical_not(), 0.0)
            dp = do @ v[:, :, :end].transpose(-1, -2)  # dL/dp_ti = dO_t . v_i
            if ctx.estimator == "straight_through":  # soft-attention score gradient
                ds = p * (dp - (p * dp).sum(-1, keepdim=True))
            else:  # d log p_{i*} / ds_tj = 1[j = i*] - p_tj, times g_t = dO_t . v_{i*}
                sel = idx[:, :, s : s + block_rows, None]
                g = dp.gather(-1, sel)
                ds = (-p * g).scatter_add(-1, sel, g)
            dq[:, :, s : s + block_rows] = (ds @ kb) * scale
            dk[:, :, :end] += (ds.transpose(-1, -2) @ qb) * scale
        return dq, dk, dv, None, None, None, None


def top1_element(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, scale: float, block_rows: int, estimator: str) -> Tensor:
    """Blockwise Top-1 Element attention; ``estimator`` is ``straight_through`` or ``prob_ratio``."""
    return _Top1Element.apply(q, k, v, q_pos, scale, block_rows, estimator)
