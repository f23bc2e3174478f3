"""The ``decay`` suite: how fast a trained model forgets, per layer and head.

A mixer with a data-dependent per-token decay declares it (``Mixer.log_decay(x)``: log of the factor its state or
its attention weights are multiplied by at each token, ``<= 0``; Forgetting Transformer's forget gate, Mamba-2's
``dt A``, Gated DeltaNet's and Kimi Delta Attention's ``g``). The suite runs the trained model on held-out text
(the validation split of a domain), takes each layer's decay on its own input, and reports per head: the mean log
decay per token, the half-life it implies (``ln 0.5 / mean``: the tokens after which a past token's weight has
halved on average), and the share of tokens that keep at least 99% (``g >= ln 0.99``, the gate held open). An
architecture that can select any past token in principle may still learn to forget within a few tokens; this says
whether it did. Writes ``eval_decay.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ..config_base import ConfigError

if TYPE_CHECKING:
    from .suites import Subject

OPEN = math.log(0.99)  # a token whose decay keeps at least 99% of what came before counts as the gate held open


@dataclass(frozen=True)
class DecayOptions:
    """``windows`` windows of ``seq_len`` tokens (default: the run's training context) from the start of ``domain``'s
    validation split (default: the run's first training domain)."""

    domain: str | None = None
    windows: int = 8
    seq_len: int | None = None
    batch_size: int = 8


def head_summary(g: torch.Tensor) -> list[dict]:
    """Per head of ``g`` (``[B, H, T]`` or ``[B, H, T, K]``, log decays): mean log decay, half-life, share open."""
    g = g.float().flatten(start_dim=2) if g.dim() == 4 else g.float()  # [B, H, T*K]
    out = []
    for h in range(g.shape[1]):
        x = g[:, h]
        mean = float(x.mean())
        out.append(
            {"mean_log_decay": mean, "half_life": math.log(0.5) / mean if mean < 0 else math.inf, "open_share": float((x >= OPEN).float().mean())}
        )
    return out


def decay_suite(subject: Subject, out_dir: Path, opts: DecayOptions) -> dict:
    from ..mixers.base import Mixer

    model = subject.model
    mixers: list[Mixer] = [cast(Any, b).mixer for b in model.blocks]
    probe = torch.zeros(1, 1, model.cfg.d_model, device=subject.device)
    with torch.no_grad():
        has = [i for i, m in enumerate(mixers) if m.log_decay(probe) is not None]
    if not has:
        names = sorted({type(m).__name__ for m in mixers})
        raise ConfigError(f"decay: no layer's mixer ({', '.join(names)}) has a per-token decay (Mixer.log_decay); nothing to measure")
    if subject.corpus is None:
        raise ConfigError("decay: needs the run's corpus (held-out text)")
    domain = opts.domain or (subject.config.data.in_domains()[0] if subject.config is not None else subject.corpus.domains[0])
    T = opts.seq_len or subject.seq_len or model.cfg.max_seq_len
    toks = np.asarray(subject.corpus.tokens(domain, "validation")[: opts.windows * T], dtype=np.int64)
    if len(toks) < opts.windows * T:
        raise ConfigError(f"decay: {domain}'s validation split has {len(toks)} tokens, fewer than {opts.windows} x {T}")
    ids = torch.as_tensor(toks).view(opts.windows, T).to(subject.device)
    got: dict[int, list[torch.Tensor]] = {i: [] for i in has}

    def hook(i: int) -> Any:
        def f(mod: torch.nn.Module, inp: tuple, out: Any) -> None:
            got[i].append(mod.log_decay(inp[0]).detach().cpu())  # type: ignore[operator]

        return f

    handles = [mixers[i].register_forward_hook(hook(i)) for i in has]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for s in range(0, opts.windows, opts.batch_size):
                model(ids[s : s + opts.batch_size])
    finally:
        for hd in handles:
            hd.remove()
        model.train(was_training)
    layers: list[dict[str, Any]] = [{"layer": i, "mixer": type(mixers[i]).__name__, "heads": head_summary(torch.cat(got[i]))} for i in has]
    for lay in layers:
        half = ", ".join(f"{h['half_life']:.1f}" for h in lay["heads"])
        opened = ", ".join(f"{h['open_share']:.2f}" for h in lay["heads"])
        print(f"decay layer {lay['layer']} ({lay['mixer']}): half-life {half} tokens; open {opened}")
    return {"domain": domain, "tokens": int(ids.numel()), "seq_len": T, "open_threshold": OPEN, "layers": layers}
