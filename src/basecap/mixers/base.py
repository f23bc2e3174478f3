"""The sequence-mixer contract every architecture implements.

A mixer maps ``x [B, T, D] -> y [B, T, D]``. ``forward(x, state=None)`` returns ``(y, state)``:
with ``state=None`` (training) the returned state is ``None``; given a state from
``init_state`` (or a previous call) it returns the *new* state and never mutates the old one,
so "prefill, then decode token by token" equals one full forward.

State is a ``dict[str, Tensor | int]``. Tensors are per batch row along dim 0; ints are
bookkeeping (e.g. the number of tokens seen). ``state_size(seq_len)`` is the number of bytes one
sequence's state occupies after ``seq_len`` tokens, in fp32; for recurrent mixers it does not
depend on ``seq_len``, for attention it grows with the cache.

Besides these methods a mixer declares how the rest of basecap treats it (docs/adding_a_mixer.md,
"Declarations"): which of its layers write into the residual stream (``out_projections``, for the
initialisation), which config field parameter matching widens (``match_field``), whether it compiles
(``compiles``), the chunk its training form keeps a state per (``chunk_size()``) and its asymptotic cost
(``cost()``, ``cost_modes``). The first three have no default: reading one a mixer does not declare is a
ConfigError naming the mixer and the declaration.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from ..config_base import ConfigError, Strict

State = dict[str, "torch.Tensor | int"]
Impl = Literal["ref", "chunked", "fast", "auto"]

# the cost strings ``cost()`` reads off a mixer's FLOP accounting ("O(<train>) train, O(<decode>) per decoded token";
# T the context, W a window, C a chunk; basecap.catalog.cost_exponent parses them)
QUADRATIC = "O(T^2) train, O(T) per decoded token"
LINEAR = "O(T) train, O(1) per decoded token"
WINDOWED = "O(T W) train, O(W) per decoded token"


class _Required:
    """A declaration with no default: reading it from a class that does not make it (itself or through a base
    other than ``Mixer``) raises a ConfigError naming the class, the declaration and what it means."""

    def __init__(self, meaning: str):
        self.meaning = meaning
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type) -> Any:
        # not AttributeError: nn.Module's __getattr__ would replace this message with a bare "no attribute"
        raise ConfigError(
            f"mixer {owner.__module__}.{owner.__qualname__} does not declare {self.name} ({self.meaning}); see docs/adding_a_mixer.md, 'Declarations'"
        )


def required(meaning: str) -> Any:
    """A class attribute every mixer must declare (``out_projections = required("...")`` in ``Mixer``)."""
    return _Required(meaning)


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
    # ---- declarations (docs/adding_a_mixer.md, "Declarations") ----
    # The dotted names (relative to the mixer) of the nn.Linear layers that write into the residual stream: the
    # backbone initialises them with std / sqrt(2 n_layers) (GPT-2), every other Linear and Embedding with std.
    out_projections: ClassVar[tuple[str, ...]] = required(
        "the names of its nn.Linear layers that write into the residual stream, e.g. ('o_proj',), or ()"
    )
    # The float config field parameter matching solves on when the model's feed-forward block has no width to
    # match with (Mamba's "expand"); None: the mixer has no width of its own and is matched through its MLP only.
    match_field: ClassVar[str | None] = required(
        "the float config field parameter matching widens when the model has no feed-forward block (e.g. 'expand'), "
        "or None when it is matched through its feed-forward block only"
    )
    # Whether the training form runs under ``torch.compile`` (train.compile): True, or why it does not (basecap.compile).
    compiles: ClassVar[bool | str] = required("True when its training form runs under torch.compile, else the reason it does not")
    # The config switch that changes the algorithm's cost and the cost string of each of its values (Top-1 Chunk:
    # ("selection", {"exact": ..., "approx": ...})); None: one algorithm, its cost read off flops_per_token (cost()).
    cost_modes: ClassVar[tuple[str, dict[str, str]] | None] = None

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

    def log_decay(self, x: torch.Tensor) -> torch.Tensor | None:
        """The log of the per-token decay the mixer applies to what came before (``<= 0``; ``[B, H, T]``, or
        ``[B, H, T, K]`` per key channel), computed from the mixer's input ``x`` ``[B, T, d_model]`` as its forward
        does; None for a mixer without a data-dependent decay (attention, a fixed window). The ``decay`` suite reads
        it (basecap.eval.decay)."""
        return None

    def flops_per_token(self, seq_len: int) -> float:
        """Forward multiply-adds x2 per token beyond the linear layers (e.g. attention scores)."""
        return 0.0

    def chunk_size(self) -> int | None:
        """The chunk length of the chunked training form, which keeps one recurrent state per chunk for the
        backward pass (basecap.plan counts them): the config's ``chunk_size`` where it has that field (the one
        spelling every mixer uses), else None. Override when the chunk is spelled otherwise; a mixer with a
        constant-size state and no chunk is refused by the plan."""
        return self.cfg.chunk_size if "chunk_size" in type(self.cfg).model_fields else None  # type: ignore[attr-defined]

    def cost(self, seq_len: int) -> str:
        """The asymptotic cost of this mixer with its config's switches: the string ``cost_modes`` gives the
        switch's value, else read off ``flops_per_token`` at T/4 and T: QUADRATIC when it grows, else LINEAR.
        Override to name another form (a window: WINDOWED)."""
        if self.cost_modes is not None:
            switch, costs = self.cost_modes
            return costs[getattr(self.cfg, switch)]
        f1, f4 = self.flops_per_token(seq_len // 4), self.flops_per_token(seq_len)
        growth = f4 / f1 if f1 else 1.0
        return QUADRATIC if growth > 1.5 else LINEAR

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
