"""Scans for diagonal selective state-space models (Mamba-1, Gu & Dao 2023; Mamba-2 / SSD,
Dao & Gu 2024). Derivations are in docs/mixers/mamba.md.

Mamba-1 (per channel e, state n):  h_t[e,n] = a_t[e,n] h_{t-1}[e,n] + w_t[e] B_t[n],
                                    y_t[e]   = sum_n C_t[n] h_t[e,n]
with a_t = exp(g_t[e] A[e,n]) (``g`` = dt for data-dependent decay), exp(A) when ``g`` is None
(a decay that does not depend on the input) and 1 when ``A`` is None (no decay).

Mamba-2 (per head h, head dim p, state n):  h_t[h,p,n] = exp(l_t[h]) h_{t-1}[h,p,n] + X_t[h,p] B_t[n],
                                            y_t[h,p]   = sum_n C_t[n] h_t[h,p,n]
with one scalar log-decay ``l_t[h] <= 0`` per head and step (one group: B and C shared by heads).

``*_ref`` are plain step-by-step recurrences (the oracles). ``selective_scan`` is the chunked
training form of Mamba-1: a loop over chunks carrying the state, and inside a chunk an in-place
Brent-Kung parallel scan (log2(C) levels, multiplicative, so it never overflows whatever the
decays are); its backward recomputes each chunk from the saved chunk-start states, so memory is
O(T E N / C) instead of O(T E N). ``ssd_chunked`` is the state-space-duality algorithm of Mamba-2
(quadratic inside chunks with the decay mask exp(c_t - c_s), state passing between chunks),
written with autograd-friendly ops.
"""

from __future__ import annotations

from functools import lru_cache

import torch


def selective_scan_ref(w, Bm, Cm, g, A, h0=None):
    """Mamba-1 recurrence, one step at a time. w, g [B,T,E]; Bm, Cm [B,T,N]; A [E,N] or None;
    h0 [B,E,N] or None. Returns y [B,T,E] and the last state [B,E,N]."""
    Bsz, T, E = w.shape
    N = Bm.shape[-1]
    h = h0 if h0 is not None else w.new_zeros(Bsz, E, N)
    ys = []
    for t in range(T):
        u = w[:, t, :, None] * Bm[:, t, None, :]  # [B,E,N]
        if A is not None:
            a = torch.exp(A if g is None else g[:, t, :, None] * A)
            h = a * h + u
        else:
            h = h + u
        ys.append((h * Cm[:, t, None, :]).sum(-1))
    return torch.stack(ys, dim=1), h


def ssd_ref(X, log_a, Bm, Cm, h0=None):
    """Mamba-2 recurrence, one step at a time. X [B,T,H,P]; log_a [B,T,H]; Bm, Cm [B,T,N];
    h0 [B,H,P,N] or None. Returns y [B,T,H,P] and the last state [B,H,P,N]."""
    Bsz, T, H, P = X.shape
    N = Bm.shape[-1]
    h = h0 if h0 is not None else X.new_zeros(Bsz, H, P, N)
    ys = []
    for t in range(T):
        h = torch.exp(log_a[:, t])[:, :, None, None] * h + X[:, t, :, :, None] * Bm[:, t, None, None, :]
        ys.append((h * Cm[:, t, None, None, :]).sum(-1))
    return torch.stack(ys, dim=1), h


@lru_cache(maxsize=None)
def _brent_kung_levels(L: int, reverse: bool) -> tuple[tuple[slice, slice, bool], ...]:
    """(dst, src, update_coefficient) index pairs of an in-place inclusive Brent-Kung scan of
    length L; with ``reverse`` the scan runs from the last position to the first."""
    levels = []
    s = 1
    while 2 * s <= L:  # up-sweep: position i (= 2s-1 mod 2s) absorbs the block of size s before it
        levels.append((range(2 * s - 1, L, 2 * s), s, 4 * s <= L))
        s *= 2
    s = 1
    while 6 * s <= L:
        s *= 2
    while s >= 1:  # down-sweep: i (= 3s-1 mod 2s) absorbs the finished prefix ending at i - s
        if 3 * s <= L:
            levels.append((range(3 * s - 1, L, 2 * s), s, False))
        s //= 2
    out = []
    for dst, s, upd in levels:
        first, last = dst[0], dst[-1]
        if reverse:  # mirror positions: p -> L-1-p; the partner is then s positions *later*
            out.append((slice(L - 1 - last, L - first, dst.step), slice(L - 1 - last + s, L - first + s, dst.step), upd))
        else:
            out.append((slice(first, last + 1, dst.step), slice(first - s, last + 1 - s, dst.step), upd))
    return tuple(out)


def scan_plan(a: torch.Tensor | None, u: torch.Tensor, reverse: bool = False) -> list:
    """The strided views an in-place scan of (a, u) along dim 1 works on. Building them costs
    more Python time than the arithmetic on small chunks, so buffers reused chunk after chunk
    build their plan once."""
    plan = []
    for dst, src, upd in _brent_kung_levels(u.shape[1], reverse):
        a_dst = a[:, dst] if a is not None else None
        plan.append((u[:, dst], a_dst, u[:, src], a[:, src] if a is not None and upd else None))
    return plan


def run_scan(plan: list) -> None:
    for u_dst, a_dst, u_src, a_src in plan:
        if a_dst is None:
            u_dst.add_(u_src)
        else:
            u_dst.addcmul_(a_dst, u_src)
            if a_src is not None:
                a_dst.mul_(a_src)


def scan_(a: torch.Tensor | None, u: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """In place along dim 1: u_t <- a_t u_{t-1} + u_t (``reverse``: u_t <- a_t u_{t+1} + u_t).
    ``a`` (same shape as u, or None for a = 1) is overwritten with partial products."""
    run_scan(scan_plan(a, u, reverse))
    return u


_LOG2E = 1.4426950408889634


def _chunk_inputs(w, Bm, g, At2, t0, t1, u, a):
    """Fill the work buffers for steps t0..t1: u_t = B_t w_t and a_t = exp(g_t A) (both
    [B,L,N,E]; ``a`` is None when there is no decay). ``At2`` is A log2(e): exp2 costs half of
    exp on CPU."""
    torch.mul(Bm[:, t0:t1, :, None], w[:, t0:t1, None, :], out=u)
    if a is not None:
        if g is None:
            a.copy_(torch.exp2(At2).expand_as(a))
        else:
            torch.mul(g[:, t0:t1, None, :], At2, out=a).exp2_()


class _SelectiveScan(torch.autograd.Function):
    # Internally the state is laid out [B, L, N, E] (E innermost) so every contraction over N
    # or E runs over long contiguous rows. Chunk-sized work buffers are allocated once per call
    # and reused: allocating them per chunk makes the allocator map and unmap memory each time.
    @staticmethod
    def forward(ctx, w, Bm, Cm, g, A, h0, chunk):
        Bsz, T, E = w.shape
        N = Bm.shape[-1]
        At = A.t().contiguous() if A is not None else None  # [N,E]
        At2 = At * _LOG2E if At is not None else None
        h = h0.transpose(1, 2).contiguous() if h0 is not None else w.new_zeros(Bsz, N, E)
        y = w.new_empty(Bsz, T, E)
        u_buf = w.new_empty(Bsz, min(chunk, T), N, E)
        a_buf = torch.empty_like(u_buf) if At is not None else None
        views = {}  # chunk length -> (u, a, scan plan) on the shared buffers
        starts = []
        for t0 in range(0, T, chunk):
            t1 = min(t0 + chunk, T)
            starts.append(h)
            if t1 - t0 not in views:
                u, a = u_buf[:, : t1 - t0], (a_buf[:, : t1 - t0] if a_buf is not None else None)
                views[t1 - t0] = (u, a, scan_plan(a, u))
            u, a, plan = views[t1 - t0]
            _chunk_inputs(w, Bm, g, At2, t0, t1, u, a)
            if a is None:  # fold the carried state into step t0
                u[:, 0].add_(h)
            else:
                u[:, 0].addcmul_(a[:, 0], h)
            run_scan(plan)
            y[:, t0:t1] = (Cm[:, t0:t1, None, :] @ u).squeeze(-2)
            h = u[:, -1].clone()
        ctx.chunk = chunk
        ctx.has_h0 = h0 is not None
        ctx.save_for_backward(w, Bm, Cm, g, At, torch.stack(starts, dim=1))
        return y, h.transpose(1, 2)

    @staticmethod
    def backward(ctx, gy, gh_last):
        w, Bm, Cm, g, At, starts = ctx.saved_tensors
        chunk = ctx.chunk
        Bsz, T, E = w.shape
        N = Bm.shape[-1]
        gy = gy if gy is not None else torch.zeros_like(w)
        carry = gh_last.transpose(1, 2) if gh_last is not None else torch.zeros_like(starts[:, 0])
        gw, gB, gC = torch.empty_like(w), torch.empty_like(Bm), torch.empty_like(Cm)
        gg = torch.empty_like(g) if g is not None else None
        gAt = torch.zeros_like(At) if At is not None else None
        At2 = At * _LOG2E if At is not None else None
        bufs = w.new_empty(5 if At is not None else 2, Bsz, min(chunk, T), N, E).unbind(0)
        views = {}
        for ci in reversed(range(starts.shape[1])):
            t0 = ci * chunk
            t1 = min(t0 + chunk, T)
            h_start = starts[:, ci]
            if t1 - t0 not in views:
                u, G, *rest = (b[:, : t1 - t0] for b in bufs)
                a, a_scan, coef = rest if rest else (None,) * 3
                views[t1 - t0] = (u, G, a, a_scan, coef, scan_plan(a_scan, u), scan_plan(coef, G, reverse=True))
            u, G, a, a_scan, coef, forward_plan, reverse_plan = views[t1 - t0]
            # recompute the chunk's states h_t (the scan turns u into h)
            _chunk_inputs(w, Bm, g, At2, t0, t1, u, a)
            if a is None:
                u[:, 0].add_(h_start)
            else:
                assert a_scan is not None and coef is not None  # the five buffers come together with At
                u[:, 0].addcmul_(a[:, 0], h_start)
                a_scan.copy_(a)
            run_scan(forward_plan)
            h = u
            # G_t = dL/dh_t = C_t gy_t + a_{t+1} G_{t+1}: a reverse scan with coefficients a_{t+1}
            torch.mul(Cm[:, t0:t1, :, None], gy[:, t0:t1, None, :], out=G)
            G[:, -1].add_(carry)
            if a is not None:
                assert coef is not None
                coef[:, :-1].copy_(a[:, 1:])
                coef[:, -1].fill_(1.0)  # never multiplies anything; keep it finite
            run_scan(reverse_plan)
            gw[:, t0:t1] = (Bm[:, t0:t1, None, :] @ G).squeeze(-2)
            gB[:, t0:t1] = (w[:, t0:t1, None, :] @ G.transpose(-1, -2)).squeeze(-2)
            gC[:, t0:t1] = (gy[:, t0:t1, None, :] @ h.transpose(-1, -2)).squeeze(-2)
            if a is not None:
                assert gAt is not None  # At is given with a
                glog = torch.mul(G, a, out=a_scan)  # dL/d(log a_t) = G_t h_{t-1} a_t
                glog[:, 1:].mul_(h[:, :-1])
                glog[:, 0].mul_(h_start)
                if g is not None:
                    assert gg is not None
                    gg[:, t0:t1] = torch.linalg.vecdot(glog, At, dim=2)
                    glog.mul_(g[:, t0:t1, None, :])
                gAt += glog.sum((0, 1))
            carry = G[:, 0].clone() if a is None else a[:, 0] * G[:, 0]
        gA = gAt.t() if gAt is not None else None
        return gw, gB, gC, gg, gA, (carry.transpose(1, 2) if ctx.has_h0 else None), None


# On CPU the scan is bound by memory traffic: each chunk's work buffers ([B, L, N, E] floats) are swept
# 2 log2(L) times by the scan and several times more by the products around it, so a chunk whose buffer
# overflows the core's caches is paid for at DRAM speed on every sweep. ``cpu_chunk`` caps the chunk at the
# largest power of two whose buffer fits this budget (LOG.md: Mamba-1's step at the small size).
CPU_CHUNK_BYTES = 4 << 20


def cpu_chunk(chunk: int, batch: int, n: int, e: int, itemsize: int = 4) -> int:
    """The chunk length the CPU scan uses for a requested ``chunk``: at most ``chunk``, and halved while
    one chunk's buffer (batch x L x n x e items) exceeds ``CPU_CHUNK_BYTES`` (never below 1)."""
    L = max(1, chunk)
    while L > 1 and batch * L * n * e * itemsize > CPU_CHUNK_BYTES:
        L //= 2
    return L


def selective_scan(w, Bm, Cm, g, A, h0=None, chunk_size: int = 64):
    """Chunked Mamba-1 scan; same contract and results as ``selective_scan_ref`` (the chunk length
    changes only the rounding). On CPU the chunk is capped by ``cpu_chunk``."""
    if w.device.type == "cpu":
        chunk_size = cpu_chunk(chunk_size, w.shape[0], Bm.shape[-1], w.shape[-1], w.element_size())
    return _SelectiveScan.apply(w, Bm, Cm, g, A, h0, chunk_size)


def ssd_chunked(X, log_a, Bm, Cm, h0=None, chunk_size: int = 64):
    """Chunked SSD; same contract and results as ``ssd_ref``. Inside a chunk: the quadratic
    (attention-like) form with the decay mask exp(cum_t - cum_s) (chunk-local cumulative
    log-decays, so the differences stay small); between chunks: pass the state. B and C are shared
    by the heads (one group), so the chunk states and their read-out fold the heads into one
    [H*P]-wide matmul per chunk; only the decay-weighted intra-chunk scores are per head."""
    Bsz, T, H, P = X.shape
    N = Bm.shape[-1]
    L = min(chunk_size, T)
    pad = (-T) % L
    if pad:  # padded steps: no input, decay exp(0) = 1, so the final state is unchanged
        X = torch.nn.functional.pad(X, (0, 0, 0, 0, 0, pad))
        log_a = torch.nn.functional.pad(log_a, (0, 0, 0, pad))
        Bm = torch.nn.functional.pad(Bm, (0, 0, 0, pad))
        Cm = torch.nn.functional.pad(Cm, (0, 0, 0, pad))
    nc = X.shape[1] // L
    Xc = X.view(Bsz, nc, L, H, P)
    Bc = Bm.view(Bsz, nc, L, N)
    Cc = Cm.view(Bsz, nc, L, N)
    cum = log_a.view(Bsz, nc, L, H).cumsum(2)  # [B,c,L,H] log-decay from the chunk start through step t
    cumh = cum.transpose(2, 3)  # [B,c,H,L]
    # 1. within chunks: y_t = sum_{s<=t} (C_t . B_s) exp(cum_t - cum_s) X_s
    causal = torch.ones(L, L, dtype=torch.bool, device=X.device).tril()
    decay = torch.exp((cumh[..., :, None] - cumh[..., None, :]).masked_fill(~causal, float("-inf")))  # [B,c,H,L,L]
    scores = Cc @ Bc.transpose(-1, -2)  # [B,c,L,L]
    y = (scores[:, :, None] * decay) @ Xc.transpose(2, 3)  # [B,c,H,L,P]
    # 2. each chunk's own contribution to the state at its end, heads folded into the rows
    to_end = torch.exp(cum[:, :, -1:] - cum)  # [B,c,L,H]
    Xw = (Xc * to_end[..., None]).view(Bsz, nc, L, H * P)
    chunk_states = Xw.transpose(-1, -2) @ Bc  # [B,c,HP,N]
    # 3. state passing between chunks (loop over chunks only; unbind once: indexing a big tensor per chunk
    # would cost a full-size zero gradient per index)
    chunk_decay = torch.exp(cum[:, :, -1]).repeat_interleave(P, dim=-1)[..., None]  # [B,c,HP,1]
    h = h0.reshape(Bsz, H * P, N) if h0 is not None else X.new_zeros(Bsz, H * P, N)
    entering = []
    for decay_c, state_c in zip(chunk_decay.unbind(1), chunk_states.unbind(1)):
        entering.append(h)
        h = decay_c * h + state_c
    starts = torch.stack(entering, dim=1)  # [B,c,HP,N]
    # 4. contribution of the state entering each chunk, read out in the [B,c,L,H,P] layout of the result
    y_state = (Cc @ starts.transpose(-1, -2)).view(Bsz, nc, L, H, P) * torch.exp(cum)[..., None]
    y = y_state + y.transpose(2, 3)
    return y.reshape(Bsz, nc * L, H, P)[:, :T], h.view(Bsz, H, P, N)
