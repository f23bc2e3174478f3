"""RWKV-5 "Eagle" time mixing (Peng et al. 2024, "Eagle and Finch: RWKV with Matrix-Valued States
and Dynamic Recurrence", arXiv 2404.05892).

Multi-head matrix-valued state with a static per-channel decay ``w = exp(-exp(decay))`` and a
bonus ``u`` for the current token; r, k, v, g read a token-shifted input through learned static
mixes; SiLU output gate; GroupNorm over heads:

    x^c_t = x_t mu_c + x_{t-1} (1 - mu_c),  c in {r, k, v, g}
    wkv_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T),   S_t = diag(w) S_{t-1} + k_t v_t^T
    out_t = o_proj(GroupNorm(wkv_t) * silu(g_t))

Defaults follow the paper: head size 64, depth-ramped mix / decay / bonus inits, GroupNorm eps
``1e-5 * 8**2``. Init ramps assume ``init_n_layers`` layers. impl "ref" is the step-by-step
recurrence, "chunked" (= "auto") the chunked form in ``basecap.ops.wkv``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..ops.wkv import depth_ratios, orthogonal_init_, token_shift, wkv6_chunked, wkv6_recurrent
from .base import Mixer, MixerConfig, State


class RWKV5Config(MixerConfig):
    name: Literal["rwkv5"] = "rwkv5"
    head_size: int = Field(64, gt=0, description="per-head key = value size; d_model must be a multiple")
    head_size_divisor: float = Field(8.0, gt=0, description="GroupNorm eps = 1e-5 * divisor**2 (RWKV's ln_x)")
    init_n_layers: int = Field(12, gt=0, description="depth the init ramps assume (mixers are not told n_layers)")
    impl: Literal["ref", "chunked", "auto"] = "auto"
    chunk_size: int = Field(16, gt=0)

    def default_mlp(self) -> str:
        return "rwkv_cmix"


class RWKV5(Mixer):
    config_class = RWKV5Config
    impls = ("ref", "chunked")
    test_variants = [{"head_size": 8}]

    def __init__(self, d_model: int, cfg: RWKV5Config, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__(d_model, cfg, layer_idx, max_seq_len)
        if d_model % cfg.head_size:
            raise ValueError(f"rwkv5.head_size={cfg.head_size} must divide d_model={d_model}")
        D, K = d_model, cfg.head_size
        H = self.n_heads = D // K
        self.head_size = K
        ratio_0_to_1, ratio_1_to_almost0 = depth_ratios(layer_idx, cfg.init_n_layers)
        ddd = torch.arange(D) / D
        n = torch.arange(D) / max(D - 1, 1)
        self.mix_r = nn.Parameter(ddd ** (0.5 * ratio_1_to_almost0))
        self.mix_k = nn.Parameter(ddd**ratio_1_to_almost0)
        self.mix_v = nn.Parameter(ddd**ratio_1_to_almost0 + 0.3 * ratio_0_to_1)
        self.mix_g = nn.Parameter(ddd ** (0.5 * ratio_1_to_almost0))
        self.time_decay = nn.Parameter((-6 + 5 * n ** (0.7 + 1.3 * ratio_0_to_1)).view(H, K))
        zigzag = ((torch.arange(D) + 1) % 3 - 1) * 0.1
        self.bonus = nn.Parameter((ratio_0_to_1 * (1 - n) + zigzag).view(H, K))

        self.r_proj, self.k_proj, self.v_proj, self.g_proj, self.o_proj = (nn.Linear(D, D, bias=False) for _ in range(5))
        for proj, scale in ((self.r_proj, 1.0), (self.k_proj, 0.1), (self.v_proj, 1.0), (self.g_proj, 0.1)):
            orthogonal_init_(proj.weight, scale)
            proj.weight._no_reinit = True
        self.ln_x = nn.GroupNorm(H, D, eps=1e-5 * cfg.head_size_divisor**2)
        nn.init.constant_(self.ln_x.weight, ((1 + min(layer_idx, cfg.init_n_layers - 1)) / cfg.init_n_layers) ** 0.7)
        self.ln_x._no_reinit = True
        for p in (self.mix_r, self.mix_k, self.mix_v, self.mix_g, self.time_decay, self.bonus):
            p._no_reinit = True

    def forward(self, x: torch.Tensor, state: State | None = None):
        B, T, D = x.shape
        H, K = self.n_heads, self.head_size
        prev, last = token_shift(x, None if state is None else state["shift"])
        r = self.r_proj(torch.lerp(prev, x, self.mix_r)).view(B, T, H, K)
        k = self.k_proj(torch.lerp(prev, x, self.mix_k)).view(B, T, H, K)
        v = self.v_proj(torch.lerp(prev, x, self.mix_v)).view(B, T, H, K)
        g = F.silu(self.g_proj(torch.lerp(prev, x, self.mix_g)))
        log_w = (-self.time_decay.exp()).expand(B, T, H, K)
        S0 = None if state is None else state["wkv"]
        if self.cfg.impl == "ref":
            y, S = wkv6_recurrent(r, k, v, log_w, self.bonus, S0)
        else:
            y, S = wkv6_chunked(r, k, v, log_w, self.bonus, S0, chunk_size=self.cfg.chunk_size)
        y = self.ln_x(y.reshape(B * T, D).to(x.dtype)).view(B, T, D)
        out = self.o_proj(y * g)
        return out, (None if state is None else {"shift": last, "wkv": S})

    def init_state(self, batch: int, device="cpu", dtype=torch.float32) -> State:
        K = self.head_size
        return {
            "shift": torch.zeros(batch, self.d_model, device=device, dtype=dtype),
            "wkv": torch.zeros(batch, self.n_heads, K, K, device=device, dtype=torch.float32),
        }

    def state_size(self, seq_len: int) -> int:
        return (self.d_model + self.n_heads * self.head_size**2) * 4

    def flops_per_token(self, seq_len: int) -> float:
        # chunked form per head: intra-chunk scores (~C/2 keys x K) and scores @ v (C x V),
        # chunk state build + state read (2 x K x V); token shift / norms ignored
        C, K = self.cfg.chunk_size, self.head_size
        return 2.0 * self.n_heads * (K * (C + 1) / 2 + C * K + 2 * K * K)
