"""RWKV channel mixing, the feed-forward block of RWKV-5/6 "Eagle/Finch" (Peng et al. 2024,
arXiv 2404.05892) and RWKV-7 "Goose" (Peng et al. 2025, arXiv 2503.14456).

    x'_t = x_t + (x_{t-1} - x_t) * mu_k                       (token shift, learned per channel)
    y_t  = down(relu(up(x'_t))^2)                             (squared ReLU)
    v5/6: y_t *= sigmoid(receptance(x_t + (x_{t-1} - x_t) * mu_r))

``version`` 5 and 6 are the same function (RWKV-5 writes the mix as ``x mu + x_prev (1 - mu)``);
7 drops the receptance gate and widens the hidden layer to 4x. The backbone builds this block
from ``{"name": "rwkv_cmix"}`` alone, so the defaults (v6: gated, 3.5x) serve all three mixers;
set ``version = 7`` for the RWKV-7 paper's block. The decode state is the last input token.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..config_base import Strict
from ..ops.wkv import depth_ratios, orthogonal_init_, token_shift
from .kit.recurrent import keep_init


class RWKVChannelMixConfig(Strict):
    name: Literal["rwkv_cmix"] = "rwkv_cmix"
    version: Literal[5, 6, 7] = 6
    hidden_mult: float | None = Field(None, gt=0, description="hidden = mult * d_model, rounded to a multiple of 8; default 3.5 (v5/6) or 4 (v7)")
    init_n_layers: int = Field(12, gt=0, description="depth the init ramps assume (the block is not told the model's n_layers)")


class RWKVChannelMix(nn.Module):
    config_class = RWKVChannelMixConfig
    out_projections = ("down",)
    match_field = "hidden_mult"

    def __init__(self, d_model: int, cfg: RWKVChannelMixConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__()
        self.cfg, self.d_model = cfg, d_model
        mult = cfg.hidden_mult or (4.0 if cfg.version == 7 else 3.5)
        hidden = max(8, int(round(mult * d_model / 8)) * 8)  # RWKV floors to 32: the same for d_model % 64 == 0
        _, ratio_1_to_almost0 = depth_ratios(layer_idx, cfg.init_n_layers)
        ddd = torch.arange(d_model) / d_model
        power = ratio_1_to_almost0**4 if cfg.version == 7 else ratio_1_to_almost0
        self.mix_k = nn.Parameter(1.0 - ddd**power)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)  # the backbone's scaled residual init
        orthogonal_init_(self.up.weight, 1.0)
        special = [self.mix_k, self.up.weight]
        self.receptance = None
        if cfg.version != 7:
            self.mix_r = nn.Parameter(1.0 - ddd**ratio_1_to_almost0)
            self.receptance = nn.Linear(d_model, d_model, bias=False)
            nn.init.zeros_(self.receptance.weight)
            special += [self.mix_r, self.receptance.weight]
        keep_init(*special)

    def forward(self, x: torch.Tensor, state=None):
        prev, last = token_shift(x, None if state is None else state["shift"])
        xx = prev - x
        y = self.down(F.relu(self.up(x + xx * self.mix_k)).square())
        if self.receptance is not None:
            y = torch.sigmoid(self.receptance(x + xx * self.mix_r)) * y
        return y, (None if state is None else {"shift": last})

    def init_state(self, batch: int, device="cpu", dtype=torch.float32):
        return {"shift": torch.zeros(batch, self.d_model, device=device, dtype=dtype)}

    def state_size(self, seq_len: int) -> int:
        return self.d_model * 4
