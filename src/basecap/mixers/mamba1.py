"""Mamba-1 selective state-space mixer (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling
with Selective State Spaces").

x -> in_proj -> (x, z); x -> causal depthwise conv (d_conv=4) + SiLU -> selective SSM with
input-dependent dt (low rank, softplus), B, C and S4D-real A; D skip; gate by SiLU(z); out_proj.
Defaults follow the paper: expand 2, d_state 16, dt_rank ceil(d_model/16), dt initialised
log-uniformly in [1e-3, 1e-1] through the inverse-softplus bias, A = -(1..N) per channel.

Ablation switches (PAPER.md section 4):
- ``decay``: ``data_dependent`` (a_t = exp(dt_t A)), ``shared`` (a = exp(A softplus(dt_bias)),
  the same for every input; dt_t still scales the input), ``none`` (a = 1: no forgetting,
  no A parameter).
- ``short_conv``: with ``false`` the conv is dropped and only its SiLU is kept.

``impl="ref"`` runs the plain step-by-step recurrence; ``"chunked"``/``"auto"`` the chunked scan
of ``basecap.ops.ssm.selective_scan``. The backbone pairs Mamba with no MLP (``default_mlp``),
as in the paper's language models. Equations: docs/mixers/mamba.md.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..ops.short_conv import ShortConv
from ..ops.ssm import selective_scan, selective_scan_ref
from .base import Mixer, MixerConfig, State
from .kit.recurrent import check_ranges, conv_bytes, conv_or_silu, conv_state, init_dt_bias, keep_init


class Mamba1Config(MixerConfig):
    name: Literal["mamba1"] = "mamba1"
    d_state: int = Field(16, gt=0)
    expand: float = Field(2, gt=0, description="d_inner = expand * d_model, rounded to a multiple of " + "8")
    d_conv: int = Field(4, gt=0)
    dt_rank: int | None = Field(None, gt=0, description="default: ceil(d_model / 16)")
    dt_min: float = Field(1e-3, gt=0)
    dt_max: float = Field(1e-1, gt=0)
    dt_init_floor: float = Field(1e-4, gt=0)
    decay: Literal["data_dependent", "shared", "none"] = "data_dependent"
    short_conv: bool = True
    chunk_size: int = Field(64, gt=0)
    impl: Literal["ref", "chunked", "auto"] = "auto"

    @model_validator(mode="after")
    def _check(self):
        return check_ranges(self, ("dt_min", "dt_max"))

    def default_mlp(self) -> str:
        return "none"


class Mamba1(Mixer):
    config_class = Mamba1Config
    cfg: Mamba1Config
    impls = ("ref", "chunked")
    out_projections = ("out_proj",)
    match_field = "expand"
    compiles = True
    # every switch value once; short_conv=false on the no-decay variant, as the paper ablates it
    test_variants = [
        {"d_state": 4, **switches}
        for switches in (
            {},
            {"decay": "shared"},
            {"decay": "none"},
            {"decay": "none", "short_conv": False},
        )
    ]

    def __init__(self, d_model: int, cfg: Mamba1Config, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        E, N = max(8, round(cfg.expand * d_model / 8) * 8), cfg.d_state
        R = cfg.dt_rank or math.ceil(d_model / 16)
        self.d_inner, self.d_state, self.dt_rank = E, N, R
        self.in_proj = nn.Linear(d_model, 2 * E, bias=False)
        self.conv = ShortConv(E, cfg.d_conv, activation=True) if cfg.short_conv else None
        self.x_proj = nn.Linear(E, R + 2 * N, bias=False)
        # dt = softplus(dt_proj(x) + dt_bias); the bias is a parameter of the recurrence (its init sets the
        # time scales), kept separate so no nn.Linear in the backbone carries a bias
        self.dt_proj = nn.Linear(R, E, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(E))
        with torch.no_grad():
            nn.init.uniform_(self.dt_proj.weight, -(R**-0.5), R**-0.5)
            self.dt_bias.copy_(init_dt_bias(E, cfg.dt_min, cfg.dt_max, cfg.dt_init_floor))
        keep_init(self.dt_proj)
        if cfg.decay != "none":  # S4D-real: A[e, n] = -(n + 1)
            self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(E, 1))
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = nn.Linear(E, d_model, bias=False)

    def forward(self, x: torch.Tensor, state: State | None = None):
        cfg = self.cfg
        xi, z = self.in_proj(x).chunk(2, dim=-1)  # [B,T,E] each
        xi, conv_state_new = conv_or_silu(self.conv, xi, state)
        dt_low, Bm, Cm = self.x_proj(xi).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(self.dt_proj(dt_low) + self.dt_bias)  # [B,T,E]
        if cfg.decay == "data_dependent":
            g, A = dt, -torch.exp(self.A_log)  # a_t = exp(dt_t A)
        elif cfg.decay == "shared":
            g, A = None, -torch.exp(self.A_log) * F.softplus(self.dt_bias)[:, None]  # a = exp(A)
        else:
            g, A = None, None  # a = 1
        h0 = None if state is None else state["ssm"]
        if cfg.impl == "ref":
            y, h = selective_scan_ref(dt * xi, Bm, Cm, g, A, h0)
        else:
            y, h = selective_scan(dt * xi, Bm, Cm, g, A, h0, chunk_size=cfg.chunk_size)
        y = (y + xi * self.D) * F.silu(z)
        return self.out_proj(y), (None if state is None else {"ssm": h, **conv_state_new})

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        ssm = torch.zeros(batch, self.d_inner, self.d_state, device=device, dtype=dtype)
        return {"ssm": ssm, **conv_state(self.conv, batch, device, dtype)}

    def state_size(self, seq_len: int) -> int:
        return self.d_inner * self.d_state * 4 + conv_bytes(self.conv)

    def flops_per_token(self, seq_len: int) -> float:
        """Recurrent-form FLOPs: per (channel, state) element, the decay dt*A and its exp (2;
        data-dependent only, a shared decay is computed once and not per token), the input w*B
        (1), a*h + u (2, or 1 without decay) and the C contraction (2); plus the conv, dt, D
        skip and gate per channel."""
        E, N = self.d_inner, self.d_state
        per_elem = {"data_dependent": 7, "shared": 5, "none": 4}[self.cfg.decay]
        conv = 2 * self.cfg.d_conv if self.conv is not None else 0
        return float(per_elem * E * N + (conv + 10) * E)
