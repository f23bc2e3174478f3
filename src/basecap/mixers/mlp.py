"""Feed-forward blocks. They follow the mixer contract so stateful ones (RWKV channel mixing,
which shifts tokens) decode with the same machinery; stateless ones return ``None`` state."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..config_base import Strict


class SwiGLUConfig(Strict):
    name: Literal["swiglu"] = "swiglu"
    hidden_mult: float = Field(8 / 3, gt=0, description="hidden = mult * d_model, rounded to a multiple of 8")


class SwiGLU(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020), as in Llama: down(silu(gate(x)) * up(x))."""

    config_class = SwiGLUConfig
    out_projections = ("down",)  # as a mixer's: scaled by 1/sqrt(2 n_layers) at init
    match_field = "hidden_mult"  # the width parameter matching solves on

    def __init__(self, d_model: int, cfg: SwiGLUConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__()
        hidden = max(8, int(round(cfg.hidden_mult * d_model / 8)) * 8)
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor, state=None):
        return self.down(F.silu(self.gate(x)) * self.up(x)), ({} if state is not None else None)

    def init_state(self, batch: int, device="cpu", dtype=torch.float32):
        return {}

    def state_size(self, seq_len: int) -> int:
        return 0


class NoMLPConfig(Strict):
    name: Literal["none"] = "none"


class NoMLP(nn.Module):
    """No feed-forward block (e.g. Mamba stacks mixers only)."""

    config_class = NoMLPConfig
    out_projections = ()
    match_field = None  # no width: the mixer's match_field is matched instead

    def __init__(self, d_model: int, cfg: NoMLPConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__()

    def forward(self, x: torch.Tensor, state=None):
        return torch.zeros_like(x), ({} if state is not None else None)

    def init_state(self, batch: int, device="cpu", dtype=torch.float32):
        return {}

    def state_size(self, seq_len: int) -> int:
        return 0
