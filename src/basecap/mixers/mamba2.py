"""Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality").

x -> in_proj -> (z, x, B, C, dt); causal depthwise conv (d_conv=4) + SiLU over (x, B, C);
multi-head SSM with one scalar decay per head, a_t = exp(dt_t A_h) (A_log per head, A
initialised uniformly in [1, 16]), one group (B, C shared by all heads), D skip per head;
gated RMSNorm norm(y * SiLU(z)) before out_proj. Defaults: expand 2, head_dim 64, d_state 64,
dt log-uniform in [1e-3, 1e-1] through the inverse-softplus bias (as Mamba-1).

Ablation switches (PAPER.md section 4):
- ``decay``: ``data_dependent`` (exp(dt_t A_h)), ``shared`` (exp(A_h softplus(dt_bias_h)), the
  same for every input; dt_t still scales the input), ``none`` (a = 1, no A parameter).
- ``short_conv``: with ``false`` the conv is dropped and only its SiLU is kept.
- ``out_norm``: with ``false`` the gated RMSNorm becomes a plain y * SiLU(z).

``impl="ref"`` runs the plain step-by-step recurrence; ``"chunked"`` the chunked SSD
algorithm of ``basecap.ops.ssm.ssd_chunked``; ``"fast"`` (CUDA only) fla's ``chunk_simple_gla``
through ``kernels/fla.py``; ``"auto"`` is "fast" on CUDA when fla imports, else "chunked"
(docs/kernels.md). The backbone pairs Mamba-2 with no MLP (``default_mlp``). Equations:
docs/mixers/mamba.md.
"""

from __future__ import annotations

from typing import Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..ops.norm import RMSNorm
from ..ops.short_conv import ShortConv
from ..ops.ssm import ssd_chunked, ssd_ref
from .base import Mixer, MixerConfig, State
from .kit.recurrent import check_ranges, conv_bytes, conv_or_silu, conv_state, init_A_log, init_dt_bias


class Mamba2Config(MixerConfig):
    name: Literal["mamba2"] = "mamba2"
    d_state: int = Field(64, gt=0)
    head_dim: int = Field(64, gt=0, description="P: channels per head")
    expand: float = Field(2, gt=0, description="d_inner = expand * d_model, rounded to a multiple of head_dim")
    d_conv: int = Field(4, gt=0)
    A_init_min: float = Field(1.0, gt=0)
    A_init_max: float = Field(16.0, gt=0)
    dt_min: float = Field(1e-3, gt=0)
    dt_max: float = Field(1e-1, gt=0)
    dt_init_floor: float = Field(1e-4, gt=0)
    decay: Literal["data_dependent", "shared", "none"] = "data_dependent"
    short_conv: bool = True
    out_norm: bool = True
    norm_eps: float = Field(1e-5, gt=0)
    chunk_size: int = Field(64, gt=0)
    impl: Literal["ref", "chunked", "fast", "auto"] = "auto"

    @model_validator(mode="after")
    def _check(self):
        return check_ranges(self, ("dt_min", "dt_max"), ("A_init_min", "A_init_max"))

    def default_mlp(self) -> str:
        return "none"


class Mamba2(Mixer):
    config_class = Mamba2Config
    cfg: Mamba2Config
    impls = ("ref", "chunked")
    out_projections = ("out_proj",)
    match_field = "expand"
    compiles = True
    # every switch value once (out_norm=false with the shared decay); short_conv=false on the no-decay
    # variant, as the paper ablates it
    test_variants = [
        {"head_dim": 16, "d_state": 8, **switches}
        for switches in (
            {},
            {"decay": "shared", "out_norm": False},
            {"decay": "none"},
            {"decay": "none", "short_conv": False},
        )
    ]
    fast_kernels = "fla"

    def __init__(self, d_model: int, cfg: Mamba2Config, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        P = cfg.head_dim
        E, N = max(P, round(cfg.expand * d_model / P) * P), cfg.d_state
        H = E // P
        self.d_inner, self.d_state, self.head_dim, self.n_heads = E, N, P, H
        self.in_proj = nn.Linear(d_model, 2 * E + 2 * N + H, bias=False)  # z, x, B, C, dt
        self.conv = ShortConv(E + 2 * N, cfg.d_conv, activation=True) if cfg.short_conv else None
        self.dt_bias = nn.Parameter(init_dt_bias(H, cfg.dt_min, cfg.dt_max, cfg.dt_init_floor))
        if cfg.decay != "none":
            self.A_log = nn.Parameter(init_A_log(H, cfg.A_init_min, cfg.A_init_max))
        self.D = nn.Parameter(torch.ones(H))
        self.norm = RMSNorm(E, eps=cfg.norm_eps) if cfg.out_norm else None
        self.out_proj = nn.Linear(E, d_model, bias=False)

    def _log_a(self, dt: torch.Tensor) -> torch.Tensor:
        """log a_t ``[B, T, H]`` from dt = softplus(dt_raw + dt_bias), by the ``decay`` switch."""
        if self.cfg.decay == "data_dependent":
            return dt * -torch.exp(self.A_log)
        if self.cfg.decay == "shared":
            return (-torch.exp(self.A_log) * F.softplus(self.dt_bias)).expand(dt.shape)
        return dt.new_zeros(dt.shape)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """log a_t = dt_t A_h per head, ``[B, H, T]`` in fp32 (by the ``decay`` switch: 0 with ``"none"``)."""
        dt = self.in_proj(x)[..., -self.n_heads :]
        return self._log_a(F.softplus(dt + self.dt_bias)).float().transpose(1, 2)

    def forward(self, x: torch.Tensor, state: State | None = None):
        cfg = self.cfg
        Bsz, T, _ = x.shape
        E, N, P, H = self.d_inner, self.d_state, self.head_dim, self.n_heads
        z, xBC, dt = self.in_proj(x).split([E, E + 2 * N, H], dim=-1)
        xBC, conv_state_new = conv_or_silu(self.conv, xBC, state)
        xs, Bm, Cm = xBC.split([E, N, N], dim=-1)
        xs = xs.reshape(Bsz, T, H, P)
        dt = F.softplus(dt + self.dt_bias)  # [B,T,H]
        log_a = self._log_a(dt)
        X = xs * dt[..., None]  # [B,T,H,P]
        h0 = None if state is None else cast(torch.Tensor, state["ssm"])
        impl = self.resolve_impl(x)
        if impl == "ref":
            y, h = ssd_ref(X, log_a, Bm, Cm, h0)
        elif impl == "fast":
            from ..kernels.fla import ssd

            y, h = ssd(X, log_a, Bm, Cm, h0)
        else:
            y, h = ssd_chunked(X, log_a, Bm, Cm, h0, chunk_size=cfg.chunk_size)
        y = (y + xs * self.D[:, None]).reshape(Bsz, T, E)
        y = y * F.silu(z)
        if self.norm is not None:
            y = self.norm(y)
        return self.out_proj(y), (None if state is None else {"ssm": h, **conv_state_new})

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        ssm = torch.zeros(batch, self.n_heads, self.head_dim, self.d_state, device=device, dtype=dtype)
        return {"ssm": ssm, **conv_state(self.conv, batch, device, dtype)}

    def state_size(self, seq_len: int) -> int:
        return self.d_inner * self.d_state * 4 + conv_bytes(self.conv)

    def flops_per_token(self, seq_len: int) -> float:
        """FLOPs of the chunked SSD form per token (chunk C, one group): scores C.B over the
        chunk (2 C N), the masked decay weights (2 C H), weights @ X (2 C E), chunk states X^T B
        (2 E N) and their read-out C h (2 E N), plus conv, dt, D skip, gate and norm per
        channel. The recurrent form (decoding) is about 5 E N per token."""
        E, N, H = self.d_inner, self.d_state, self.n_heads
        C = min(self.cfg.chunk_size, max(seq_len, 1))
        conv = 2 * self.cfg.d_conv * (E + 2 * N) if self.conv is not None else 0
        return float(2 * C * N + 2 * C * H + 2 * C * E + 4 * E * N + conv + 12 * E)
