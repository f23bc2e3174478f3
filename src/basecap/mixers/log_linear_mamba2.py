"""Log-linear Mamba-2 (Guo, Yang, Goel, Xing, Dao & Kim 2025, "Log-Linear Attention", arXiv 2506.04342).

Mamba-2 (``mamba2.py``: in_proj -> z, x, B, C, dt; short conv + SiLU; one scalar decay per head; one group;
D skip; gated RMSNorm) whose single state is replaced by a Fenwick-tree hierarchy of states. The past of
position t is cut into the power-of-two segments of the Fenwick decomposition of t; pair (t, s), s <= t, lies
at level ``lev(t, s) = bit_length(t XOR s)`` (0: s = t; l >= 1: the segment of 2^(l-1) tokens that bit l-1 of
t stands for), and the output weighs each level with its own data-dependent scale lambda_t^(l) >= 0:

    y_t = sum_{s<=t} lambda_t^(lev(t,s)) exp(l_{s+1} + ... + l_t) (C_t . B_s) X_s + D x_t,   X_s = dt_s x_s
    lambda_t^(l) = softplus(L[h, l] * dl_t[h, l])   (dl: n_levels more outputs of in_proj per head, L init 1)

Levels ``l >= n_levels`` weigh 0 (as fla's kernel does); with ``level_weights = "none"`` every level weighs 1
and the mixer computes exactly Mamba-2. The decode state holds one [H, P, N] state per level of the current
position: ``bit_length(t)`` of them after t tokens, so it grows as log2 T (``state_size``).

Forms (``impl``): ``"ref"`` the step-by-step recurrence that keeps the Fenwick states (merge on carry, like
a binary counter) in fp32; ``"chunked"`` exact blocks of ``chunk_size`` tokens, each the quadratic masked
form inside plus the read-out of the incoming level states, carried block to block (a block as long as
the sequence is the plain quadratic form); ``"fast"`` (CUDA) fla's ``chunk_log_linear_attn`` in training
through ``kernels/fla.py`` (with a state, the chunked form runs). Equations and tests:
docs/mixers/log_linear_mamba2.md.
"""

from __future__ import annotations

from typing import Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..ops.norm import RMSNorm
from ..ops.short_conv import ShortConv
from .base import LINEAR, Mixer, MixerConfig, State
from .kit.recurrent import check_ranges, conv_bytes, conv_or_silu, conv_state, init_A_log, init_dt_bias, keep_init

Tensor = torch.Tensor


# ---- the Fenwick levels ---------------------------------------------------------------------------------


def bit_length(x: Tensor) -> Tensor:
    """``int.bit_length`` of every element of a non-negative int64 tensor (0 -> 0), by binary search over shifts."""
    n = torch.zeros_like(x)
    for shift in (32, 16, 8, 4, 2, 1):
        high = (x >> shift) > 0
        n = n + high * shift
        x = torch.where(high, x >> shift, x)
    return n + (x > 0)


def levels(t: Tensor, s: Tensor) -> Tensor:
    """Level of the pair (t, s) of absolute positions, ``bit_length(t XOR s)``: 0 when s = t, else l where
    t and s first differ at bit l - 1, i.e. s lies in the segment of 2^(l-1) tokens for bit l - 1 of t."""
    return bit_length(torch.bitwise_xor(t, s))


def _level_weights(lam: Tensor, width: int) -> Tensor:
    """``lam [B, T, H, L]`` extended with zeros to ``width`` levels: levels without a weight weigh 0."""
    return F.pad(lam, (0, width - lam.shape[-1])) if width > lam.shape[-1] else lam


def log_linear_ref(X: Tensor, log_a: Tensor, Bm: Tensor, Cm: Tensor, lam: Tensor, S0: Tensor | None = None, pos: int = 0) -> tuple[Tensor, Tensor]:
    """The recurrence, one token at a time, keeping the Fenwick states. X [B,T,H,P]; log_a [B,T,H]; Bm, Cm
    [B,T,N]; lam [B,T,H,L] (levels >= L weigh 0); S0 [B,K,H,P,N] the states of levels 1..K of position
    ``pos`` (K = bit_length(pos)), or None at position 0. Returns y [B,T,H,P] and the states of position
    pos + T, [B, bit_length(pos + T), H, P, N].

    Before token p the states hold the segments of p (level l non-zero only where bit l-1 of p is set).
    Token p: every state decays by a_p; the token itself is level 0; y_p reads each level with its weight.
    Then p -> p + 1 carries like a binary counter: with j trailing ones in p, levels 0..j merge into level
    j + 1 (empty before, as bit j of p is 0) and levels 1..j empty."""
    Bsz, T, H, P = X.shape
    N = Bm.shape[-1]
    lam = _level_weights(lam, (pos + T - 1).bit_length() + 1)
    S = S0 if S0 is not None else X.new_zeros(Bsz, 0, H, P, N)  # S[:, i] is level i + 1
    ys = []
    for t in range(T):
        p = pos + t
        own = X[:, t, :, :, None] * Bm[:, t, None, None, :]  # level 0: the token itself
        a = torch.exp(log_a[:, t])[:, None, :, None, None]
        S = torch.cat([own[:, None], a * S], dim=1)  # levels 0 .. K, decayed to token p
        read = (S @ Cm[:, t, None, None, :, None]).squeeze(-1)  # [B, K+1, H, P]: S_l C_p
        ys.append((read * lam[:, t, :, : S.shape[1]].transpose(1, 2)[..., None]).sum(1))
        j = 0
        while (p >> j) & 1:
            j += 1
        if S.shape[1] < j + 2:  # level j + 1 is new
            S = torch.cat([S, torch.zeros_like(S[:, :1])], dim=1)
        merged = S[:, : j + 2].sum(1, keepdim=True)  # levels 0 .. j and the empty level j + 1
        S = torch.cat([torch.zeros_like(S[:, 1 : j + 1]), merged, S[:, j + 2 :]], dim=1)  # levels 1 .. j empty
    return (torch.stack(ys, dim=1) if ys else X.new_zeros(Bsz, 0, H, P)), S


def _block(X: Tensor, log_a: Tensor, Bm: Tensor, Cm: Tensor, lam: Tensor, S: Tensor, pos: int, final_state: bool) -> tuple[Tensor, Tensor | None]:
    """Tokens pos .. pos + T - 1 at once, exactly: the quadratic masked form among them plus the read-out
    of the incoming level states ``S [B, K, H, P, N]`` (those of position ``pos``); returns y and (if
    ``final_state``) the level states of position pos + T. ``lam`` must cover every level that occurs."""
    Bsz, T, H, P = X.shape
    K = S.shape[1]
    dev = X.device
    p = torch.arange(pos, pos + T, device=dev)
    cum = log_a.cumsum(1)  # [B,T,H]: log decay from the block start through t
    cumh = cum.transpose(1, 2)  # [B,H,T]
    # 1. inside the block: y_t = sum_{s<=t} lam_t^(lev(t,s)) exp(cum_t - cum_s) (C_t . B_s) X_s
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    decay = torch.exp((cumh[..., :, None] - cumh[..., None, :]).masked_fill(~causal, float("-inf")))  # [B,H,T,T]
    lev = levels(p[:, None], p[None, :])  # [T,T]
    weight = torch.gather(lam.transpose(1, 2), 3, lev.expand(Bsz, H, T, T))  # [B,H,T,T]: lam_t^(lev(t,s))
    scores = Cm @ Bm.transpose(-1, -2)  # [B,T,T]
    y = ((scores[:, None] * decay * weight) @ X.transpose(1, 2)).transpose(1, 2)  # [B,T,H,P]
    # 2. the incoming states: level k of position pos is level max(k, bit_length(t XOR pos)) from t >= pos
    if K:
        in_lev = torch.maximum(torch.arange(1, K + 1, device=dev)[None, :], bit_length(p ^ pos)[:, None])  # [T,K]
        w_in = torch.gather(lam, 3, in_lev[None, :, None, :].expand(Bsz, T, H, K))  # [B,T,H,K]
        read = torch.einsum("btn,bkhpn->bthkp", Cm, S)  # C_t . S_k
        y = y + (read * w_in[..., None]).sum(3) * torch.exp(cum)[..., None]
    if not final_state:
        return y, None
    # 3. the states of position pos + T: token s joins level bit_length((pos + T) XOR s), incoming level k
    # becomes level max(k, bit_length((pos + T) XOR pos)), all decayed to the block's last token
    end = pos + T
    K_out = end.bit_length()
    new_lev = F.one_hot(levels(torch.full_like(p, end), p) - 1, K_out).to(X.dtype)  # [T, K_out]
    Xw = (X * torch.exp(cum[:, -1:] - cum)[..., None]).reshape(Bsz, T, H * P)
    S_out = ((new_lev.t()[None, :, :, None] * Xw[:, None]).transpose(-1, -2) @ Bm[:, None]).view(Bsz, K_out, H, P, -1)
    if K:
        old_lev = F.one_hot(_carry_levels(K, pos, end, dev) - 1, K_out).to(X.dtype)  # [K, K_out]
        S_dec = S * torch.exp(cum[:, -1])[:, None, :, None, None]
        S_out = S_out + torch.einsum("kl,bkhpn->blhpn", old_lev, S_dec)
    return y, S_out


def _carry_levels(K: int, pos: int, end: int, device) -> Tensor:
    """Where the K level states of position ``pos`` sit for position ``end`` > pos: level max(k, bit_length(end XOR pos))."""
    return torch.arange(1, K + 1, device=device).clamp(min=(end ^ pos).bit_length())


def log_linear_chunked(
    X: Tensor,
    log_a: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    lam: Tensor,
    S0: Tensor | None = None,
    pos: int = 0,
    chunk_size: int = 64,
    final_state: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Same contract and results as ``log_linear_ref``: blocks of ``chunk_size`` tokens (``_block``), the level
    states carried from block to block. With ``final_state=False`` (training) the last block's new states
    are not formed and None is returned for them."""
    Bsz, T, H, P = X.shape
    S = S0 if S0 is not None else X.new_zeros(Bsz, 0, H, P, Bm.shape[-1])
    lam = _level_weights(lam, (pos + T - 1).bit_length() + 1)
    ys = []
    S_out: Tensor | None = S
    for t0 in range(0, T, chunk_size):
        t1 = min(t0 + chunk_size, T)
        part = slice(t0, t1)
        y, S_out = _block(X[:, part], log_a[:, part], Bm[:, part], Cm[:, part], lam[:, part], S, pos + t0, final_state or t1 < T)
        ys.append(y)
        if S_out is not None:
            S = S_out
    return torch.cat(ys, dim=1), (S_out if final_state else None)


# ---- the mixer --------------------------------------------------------------------------------------------


class LogLinearMamba2Config(MixerConfig):
    name: Literal["log_linear_mamba2"] = "log_linear_mamba2"
    d_state: int = Field(64, gt=0)
    head_dim: int = Field(64, gt=0, description="P: channels per head")
    expand: float = Field(2, gt=0, description="d_inner = expand * d_model, rounded to a multiple of head_dim")
    d_conv: int = Field(4, gt=0)
    A_init_min: float = Field(1.0, gt=0)
    A_init_max: float = Field(16.0, gt=0)
    dt_min: float = Field(1e-3, gt=0)
    dt_max: float = Field(1e-1, gt=0)
    dt_init_floor: float = Field(1e-4, gt=0)
    n_levels: int = Field(
        15, ge=1, description="levels with a weight: 0 (the token itself) to n_levels - 1; position t < 2^(n_levels-1) reaches all it has"
    )
    level_weights: Literal["data_dependent", "none"] = "data_dependent"
    decay: Literal["data_dependent", "shared", "none"] = "data_dependent"
    short_conv: bool = True
    out_norm: bool = True
    norm_eps: float = Field(1e-5, gt=0)
    chunk_size: int = Field(256, gt=0, description="tokens per exact block of the chunked form (256: one quadratic block at the small size)")
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"

    @model_validator(mode="after")
    def _check(self):
        return check_ranges(self, ("dt_min", "dt_max"), ("A_init_min", "A_init_max"))

    def default_mlp(self) -> str:
        return "none"


class LogLinearMamba2(Mixer):
    config_class = LogLinearMamba2Config
    cfg: LogLinearMamba2Config
    impls = ("ref", "chunked")
    out_projections = ("o_proj",)
    match_field = "expand"
    compiles = True
    # every switch value once, as Mamba-2's variants, plus the unweighted levels; 4 levels in the first (from
    # position 8 on, the far past reaches levels without a weight), 15 elsewhere
    test_variants = [
        {"head_dim": 16, "d_state": 8, **switches}
        for switches in (
            {"n_levels": 4},
            {"decay": "shared", "out_norm": False},
            {"decay": "none"},
            {"decay": "none", "short_conv": False},
            {"level_weights": "none"},
        )
    ]
    fast_kernels = "fla"

    def __init__(self, d_model: int, cfg: LogLinearMamba2Config, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        P = cfg.head_dim
        E, N = max(P, round(cfg.expand * d_model / P) * P), cfg.d_state
        H = E // P
        L = cfg.n_levels if cfg.level_weights == "data_dependent" else 0
        self.d_inner, self.d_state, self.head_dim, self.n_heads, self.n_weighted = E, N, P, H, L
        self.in_proj = nn.Linear(d_model, 2 * E + 2 * N + H + H * L, bias=False)  # z, x, B, C, dt, dl
        self.conv = ShortConv(E + 2 * N, cfg.d_conv, activation=True) if cfg.short_conv else None
        self.dt_bias = nn.Parameter(init_dt_bias(H, cfg.dt_min, cfg.dt_max, cfg.dt_init_floor))
        if cfg.decay != "none":
            self.A_log = nn.Parameter(init_A_log(H, cfg.A_init_min, cfg.A_init_max))
        if L:
            # L[h, l] of lambda = softplus(L * dl), ones at init; flat, so that it is not weight-decayed (fla's layer
            # exempts it from decay too) and the backbone's init leaves it alone
            self.level_scale = nn.Parameter(torch.ones(H * L))
            keep_init(self.level_scale)
        self.D = nn.Parameter(torch.ones(H))
        self.norm = RMSNorm(E, eps=cfg.norm_eps) if cfg.out_norm else None
        self.o_proj = nn.Linear(E, d_model, bias=False)

    def level_weights(self, dl: Tensor, pos: int) -> Tensor:
        """lambda [B, T, H, levels]: softplus(L * dl), or ones over every level that occurs (``level_weights = "none"``)."""
        Bsz, T = dl.shape[:2]
        H, L = self.n_heads, self.n_weighted
        if L:
            return F.softplus(self.level_scale.view(H, L) * dl.view(Bsz, T, H, L))
        return dl.new_ones(1, 1, 1, 1).expand(Bsz, T, H, (pos + T - 1).bit_length() + 1)

    def forward(self, x: Tensor, state: State | None = None):
        cfg = self.cfg
        Bsz, T, _ = x.shape
        E, N, P, H = self.d_inner, self.d_state, self.head_dim, self.n_heads
        z, xBC, dt, dl = self.in_proj(x).split([E, E + 2 * N, H, H * self.n_weighted], dim=-1)
        xBC, conv_state_new = conv_or_silu(self.conv, xBC, state)
        xs, Bm, Cm = xBC.split([E, N, N], dim=-1)
        xs = xs.reshape(Bsz, T, H, P)
        dt = F.softplus(dt + self.dt_bias)  # [B,T,H]
        if cfg.decay == "data_dependent":
            log_a = dt * -torch.exp(self.A_log)
        elif cfg.decay == "shared":
            log_a = (-torch.exp(self.A_log) * F.softplus(self.dt_bias)).expand(Bsz, T, H)
        else:
            log_a = dt.new_zeros(Bsz, T, H)
        X = xs * dt[..., None]  # [B,T,H,P]
        pos = 0 if state is None else int(state["pos"])
        lam = self.level_weights(dl, pos)
        S0 = None if state is None else cast(Tensor, state["levels"])
        impl = self.resolve_impl(x)
        S: Tensor | None
        if impl == "ref":
            y, S = log_linear_ref(X, log_a, Bm, Cm, lam, S0, pos)
        elif impl == "fast" and state is None:
            from ..kernels.fla import log_linear_attn

            y, S = log_linear_attn(X, log_a, Bm, Cm, lam), None
        else:  # fla's op keeps its own kind of state (the raw tokens of the open chunk): with a state, chunked
            y, S = log_linear_chunked(X, log_a, Bm, Cm, lam, S0, pos, chunk_size=cfg.chunk_size, final_state=state is not None)
        y = (y + xs * self.D[:, None]).reshape(Bsz, T, E)
        y = y * F.silu(z)
        if self.norm is not None:
            y = self.norm(y)
        new_state = None if state is None else {"levels": cast(Tensor, S), "pos": pos + T, **conv_state_new}
        return self.o_proj(y), new_state

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        levels = torch.zeros(batch, 0, self.n_heads, self.head_dim, self.d_state, device=device, dtype=dtype)
        return {"levels": levels, "pos": 0, **conv_state(self.conv, batch, device, dtype)}

    def state_size(self, seq_len: int) -> int:
        """After ``seq_len`` tokens: one [H, P, N] state per level of position seq_len, bit_length(seq_len) of them
        (popcount(seq_len) non-zero; the others are the empty slots a later carry fills), plus the conv cache."""
        return max(seq_len, 0).bit_length() * self.d_inner * self.d_state * 4 + conv_bytes(self.conv)

    def cost(self, seq_len: int) -> str:
        """LINEAR, the closest string the catalog's grammar (T, T^2, C, W) has: the form is O(T log T) in training
        (each chunk reads the log2 T level states entering it) and O(log T) per decoded token (the level states).
        Reading it off ``flops_per_token`` could say QUADRATIC at long chunks, where the log factor looks like growth."""
        return LINEAR

    def flops_per_token(self, seq_len: int) -> float:
        """FLOPs of the chunked training form per token (chunk C): inside a chunk the scores C.B (2 C N), the decay
        mask, level-weight gather and their products (3 C H), weights @ X (2 C E); the read-out of the K level
        states entering the chunk (2 K E N, plus 2 K E for their weights), K averaged over the chunks of a
        sequence of ``seq_len`` (bit_length of each chunk's start); conv, dt, lambda (3 H L), D skip, gate and
        norm. The step-by-step (decoding) form reads bit_length(t) + 1 levels per token: about (3 K + 4) E N."""
        E, N, H, L = self.d_inner, self.d_state, self.n_heads, self.n_weighted
        T = max(seq_len, 1)
        C = min(self.cfg.chunk_size, T)
        K = sum(min(C, T - t0) * t0.bit_length() for t0 in range(0, T, C)) / T
        conv = 2 * self.cfg.d_conv * (E + 2 * N) if self.conv is not None else 0
        return float(2 * C * N + 3 * C * H + 2 * C * E + 2 * K * E * N + 2 * K * E + 3 * H * L + conv + 12 * E)
