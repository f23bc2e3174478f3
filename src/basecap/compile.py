"""``train.compile = true``: the training forward and backward through ``torch.compile`` (inductor: C++ and
OpenMP on CPU, Triton on CUDA). When it pays and when not: docs/performance.md, "Compiling the model".

Only the training call is compiled. ``compile_for_training`` replaces the model's ``forward`` on the
instance by a function that runs the compiled forward while the model trains with gradients enabled and the
eager one otherwise, so:
- evaluation and decoding stay eager (no recompilation for their shapes, and the same evaluation numerics
  as an eager run);
- the state dict keeps its keys, so a compiled run's checkpoints are an eager run's (resume either way);
- DDP and FSDP wrap the module as before.

Each mixer says whether it compiles (``Mixer.compiles``: True, or the reason it does not). ``check_compile``
refuses ``train.compile = true`` with such a mixer when the experiment is validated, before anything trains.
"""

from __future__ import annotations

from typing import Any

import torch

from .config_base import ConfigError
from .mixers import mixer_class


def compile_blockers(model_cfg: Any) -> list[str]:
    """``"<mixer>: <reason>"`` for every mixer of the model (hybrid layers included) that does not compile."""
    mixers = [model_cfg.mixer, *getattr(model_cfg, "layer_mixers", {}).values()]
    out = []
    for m in mixers:
        ok = mixer_class(m.name).compiles
        if ok is not True and f"{m.name}: {ok}" not in out:
            out.append(f"{m.name}: {ok}")
    return out


def check_compile(cfg: Any) -> None:
    """Refuse ``train.compile = true`` for a run with a mixer that does not compile (ConfigError naming it)."""
    if not cfg.train.compile:
        return
    blockers = compile_blockers(cfg.model)
    if blockers:
        raise ConfigError(
            f"train.compile: {cfg.run_id if hasattr(cfg, 'run_id') else cfg.name}: these mixers do not compile "
            f"({'; '.join(blockers)}); set train.compile = false"
        )
    if not hasattr(torch, "compile"):
        raise ConfigError("train.compile: this torch has no torch.compile")


def compile_for_training(model: torch.nn.Module, cfg: Any, log=print) -> torch.nn.Module:
    """With ``cfg.train.compile``, make ``model``'s training calls run compiled (in place; returns the model).
    The first training step pays the compilation (tens of seconds on CPU); later steps reuse it."""
    if not cfg.train.compile:
        return model
    check_compile(cfg)
    # one process trains the runs of a study one after the other: a fresh cache per run, so the models before
    # it never push this one past dynamo's recompile limit (past it, dynamo runs the forward eagerly, silently)
    torch._dynamo.reset()
    eager = model.forward
    compiled = torch.compile(eager)

    def forward(*args, **kwargs):
        if model.training and torch.is_grad_enabled():
            return compiled(*args, **kwargs)
        return eager(*args, **kwargs)

    model.forward = forward  # an instance attribute: nn.Module.__call__ finds it before the class's forward
    model._basecap_eager_forward = eager  # type: ignore[assignment]  # a plain attribute on the module (nn.Module types unknown ones as Tensor | Module)
    log(f"[{cfg.run_id}] train.compile: the training forward/backward runs through torch.compile (the first step compiles; evaluation stays eager)")
    return model


def is_compiled(model: torch.nn.Module) -> bool:
    return hasattr(model, "_basecap_eager_forward")
