"""The sequence-mixer contract every architecture implements.

A mixer maps ``x [B, T, D] -> y [B, T, D]``. ``forward(x, state=None)`` returns ``(y, state)``:
with ``state=None`` (training) the returned state is ``None``; given a state from
``init_state`` (or a previous call) it returns the *new* state and never mutates the old one,
so "prefill, then decode token by token" equals one full forward.

State is a ``dict[str, Tensor | int]``. Tensors are per batch row along dim 0; ints are
bookkeeping (e.g. the number of tokens seen). ``state_size(seq_len)`` is the number of bytes one
sequence's state occupies after ``seq_len`` tokens, in fp32; for recurrent mixers it does not
depend on ``seq_len``, for attention it grows with the cache.
"""

from __future__ import annotations

import importlib
from typing import ClassVar, Literal

import torch
from torch import nn

from ..config_base import Strict

State = dict[str, "torch.Tensor | int"]
Impl = Literal["ref", "chunked", "fast", "auto"]


class MixerConfig(Strict):
    """Base of every mixer's own typed config. ``name`` selects the registry entry."""

    name: str

    # Whether the backbone should add learned absolute position embeddings at the input.
    def wants_absolute_positions(self) -> bool:
        return False

    # The feed-forward block the original architecture pairs with this mixer.
    def default_mlp(self) -> str:
        return "swiglu"


class Mixer(nn.Module):
    """Interface (documentation + shared helpers); subclasses implement the four methods."""

    config_class: ClassVar[type[MixerConfig]]
    # Config overrides the contract tests run (each merged over {"name": ...}); tiny shapes.
    test_variants: ClassVar[list[dict]] = [{}]
    # Values of ``impl`` this mixer implements; the first is the oracle the others are tested against.
    impls: ClassVar[tuple[str, ...]] = ("ref",)
    # The module of ``basecap.kernels`` behind ``impl = "fast"`` ("fla", "top1_cuda"); None: no fast form.
    fast_kernels: ClassVar[str | None] = None
    # Whether the training form runs under ``torch.compile`` (train.compile): True, or why it does not (basecap.compile).
    compiles: ClassVar[bool | str] = True

    def __init__(self, d_model: int, cfg: MixerConfig, layer_idx: int = 0, max_seq_len: int = 2048):
        super().__init__()
        self.d_model = d_model
        self.cfg = cfg
        self.layer_idx = layer_idx
        self.max_seq_len = max_seq_len

    def forward(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State | None]:
        raise NotImplementedError

    def init_state(self, batch: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> State:
        raise NotImplementedError

    def state_size(self, seq_len: int) -> int:
        raise NotImplementedError

    def flops_per_token(self, seq_len: int) -> float:
        """Forward multiply-adds x2 per token beyond the linear layers (e.g. attention scores)."""
        return 0.0

    def resolve_impl(self, x: torch.Tensor) -> str:
        """The form this call runs: ``cfg.impl``, with "auto" resolved to "fast" on CUDA where the fast
        kernels run and to "chunked" elsewhere. The kernels module decides (and logs once) whether
        "fast" runs; it depends on the device and the installation, never on the sequence length, and
        "fast" where it cannot run is a configuration error. The kernels module is imported only for
        a CUDA input or an explicit "fast", so a CPU run never imports Triton."""
        impl = self.cfg.impl  # type: ignore[attr-defined]  # declared by each mixer's config (Impl), not the base
        if self.fast_kernels is not None and (impl == "fast" or (impl == "auto" and x.is_cuda)):
            kernels = importlib.import_module(f"..kernels.{self.fast_kernels}", __package__)
            return kernels.resolve_impl(self.cfg.name, impl, x)
        return "chunked" if impl == "auto" else impl


def state_bytes(state: State) -> int:
    """Bytes of tensor state for one sequence (tensors are [B, ...])."""
    total = 0
    for v in state.values():
        if isinstance(v, torch.Tensor):
            total += v[0].numel() * v.element_size() if v.dim() > 0 else 0
    return total
