"""Long-context suites.

* Passkey retrieval (Mohtashami & Jaggi 2023) and single needle-in-a-haystack (S-NIAH, RULER,
  Hsieh et al. 2024) over a grid of context lengths x needle depths; a prompt counts as solved when
  the greedy continuation contains the answer. Heatmap PNG + JSON.
* Length extrapolation: mean loss per bucket of positions on held-out windows longer than the
  training context (default 4x), per domain. Line plot + JSON.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..data.retrieval import corpus_sentences  # held-out sentences for the haystack (training mixes in the same prompts)
from ..data.synthetic import fill_prompt, niah_parts, noise_sentences, passkey_parts
from .recall import answer_contained

if TYPE_CHECKING:
    from .suites import Subject


def default_lengths(subject: Any) -> list[int]:
    s = subject.seq_len
    return [s // 2, s, 2 * s]


def heatmap(grid: dict, lengths: list[int], depths: list[float], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = np.array([[grid[str(L)][f"{d:g}"] if grid[str(L)][f"{d:g}"] is not None else np.nan for L in lengths] for d in depths])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.0 + 0.5 * len(depths)))
    im = ax.imshow(a, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(L) for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    for i in range(len(depths)):
        for j in range(len(lengths)):
            ax.text(j, i, "-" if np.isnan(a[i, j]) else f"{a[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.05)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class PasskeyOptions:
    """The ``passkey`` suite's options: ``samples`` prompts of a ``digits``-digit passkey per cell of ``lengths``
    (tokens; default half, one and two training contexts; or ``factors`` x the training context) x ``depths``, in a
    ``haystack`` of noise or of ``domain``'s ``split`` text; greedy outputs of up to ``max_new_tokens`` tokens,
    ``batch_size`` prompts at a time."""

    lengths: Sequence[int] | None = None
    depths: Sequence[float] = DEPTHS
    samples: int = 4
    seed: int = 0
    haystack: str = "noise"
    domain: str | None = None
    split: str = "test"
    digits: int = 5
    max_new_tokens: int = 10
    batch_size: int = 8
    factors: Sequence[float] | None = None


@dataclass(frozen=True)
class NiahOptions:
    """The ``niah`` suite's options: as passkey's, with a needle of ``value_kind`` (number | word | uuid) in corpus
    text by default (noise when the subject has no corpus)."""

    lengths: Sequence[int] | None = None
    depths: Sequence[float] = DEPTHS
    samples: int = 4
    seed: int = 0
    value_kind: str = "number"
    haystack: str = "corpus"
    domain: str | None = None
    split: str = "test"
    max_new_tokens: int = 24
    batch_size: int = 8
    factors: Sequence[float] | None = None


def grid_lengths(subject: Any, name: str, opts: PasskeyOptions | NiahOptions) -> list[int]:
    """The context lengths of a retrieval grid (``lengths``, or ``factors`` x the training context, or the default
    ones), after checking the options."""
    from ..config_base import ConfigError

    lengths, factors = opts.lengths, opts.factors
    if factors is not None:  # lengths as multiples of the training context, so one study file serves every size
        if lengths is not None:
            raise ConfigError(f"{name}: give lengths or factors, not both")
        if not factors or any(not isinstance(f, (int, float)) or isinstance(f, bool) or f <= 0 for f in factors):
            raise ConfigError(f"{name}: factors must be positive numbers, got {factors!r}")
        lengths = [round(f * subject.seq_len) for f in factors]
    out = [int(L) for L in (lengths or default_lengths(subject))]
    if opts.haystack not in ("noise", "corpus"):
        raise ConfigError(f"{name}: haystack must be 'noise' or 'corpus', got {opts.haystack!r}")
    if opts.haystack == "corpus" and subject.corpus is None:
        raise ConfigError(f"{name}: haystack='corpus' needs the run's corpus")
    return out


def retrieval_cell(
    subject: Subject, name: str, make_parts: Callable[[random.Random], tuple], opts: PasskeyOptions | NiahOptions, L: int, d: float
) -> dict:
    """One cell of a retrieval grid: ``samples`` prompts of ``L`` tokens with the needle at depth ``d``, answered
    greedily; ``{"cell": ...}`` (None when no prompt was made) and ``{"skipped": reason}`` when one could not be."""
    from .suites import greedy_generate

    rng = random.Random(f"{name}-{opts.seed}-{L}-{d:g}")
    sents = (
        noise_sentences()
        if opts.haystack == "noise"
        else corpus_sentences(subject.corpus, opts.domain or subject.corpus.domains[0], opts.split, rng.randrange(2**31))
    )
    prompts, answers, ntoks = [], [], []
    out: dict = {"cell": None}
    for _ in range(opts.samples):
        prefix, needle, question, answer = make_parts(rng)
        try:
            text, n, _ = fill_prompt(subject.encode, prefix, needle, question, sents, L, depth=d)
        except ValueError as e:
            out["skipped"] = str(e)
            break
        prompts.append(subject.encode(text))
        answers.append(answer)
        ntoks.append(n)
    if not prompts:
        return out
    outs = greedy_generate(subject, prompts, opts.max_new_tokens, stop=("\n",), batch_size=opts.batch_size)
    hits = [answer_contained(o, a) for o, a in zip(outs, answers)]
    acc = sum(hits) / len(hits)
    out["cell"] = {
        "length": L,
        "depth": d,
        "accuracy": acc,
        "mean_tokens": float(np.mean(ntoks)),
        "example": {"answer": answers[0], "output": outs[0]},
    }
    return out


def retrieval_grid(
    subject: Subject, out_dir: Path, name: str, make_parts: Callable[[random.Random], tuple], opts: PasskeyOptions | NiahOptions
) -> dict:
    """Accuracy of a retrieval task (``make_parts(rng)`` -> prefix, needle, question, answer) over the grid of
    context lengths x needle depths; heatmap ``eval_<name>.png`` in ``out_dir``."""
    lengths = grid_lengths(subject, name, opts)
    depths = [float(d) for d in opts.depths]
    limit = subject.max_positions()
    grid: dict[str, dict[str, float | None]] = {}
    cells, skipped = [], {}
    for L in lengths:
        grid[str(L)] = {}
        for d in depths:
            grid[str(L)][f"{d:g}"] = None
            if limit is not None and L + opts.max_new_tokens > limit:
                skipped[str(L)] = f"learned absolute positions end at {limit}"
                continue
            got = retrieval_cell(subject, name, make_parts, opts, L, d)
            if "skipped" in got:
                skipped[str(L)] = got["skipped"]
            if got["cell"] is not None:
                grid[str(L)][f"{d:g}"] = got["cell"]["accuracy"]
                cells.append(got["cell"])
    per_len = {
        L: (np.mean([v for v in row.values() if v is not None]) if any(v is not None for v in row.values()) else None) for L, row in grid.items()
    }
    png = heatmap(grid, lengths, depths, f"{name} ({subject.name}, {opts.haystack} haystack)", out_dir / f"eval_{name}.png")
    return {
        "lengths": lengths,
        "depths": depths,
        "samples": opts.samples,
        "seed": opts.seed,
        "haystack": opts.haystack,
        "accuracy": grid,
        "accuracy_by_length": {k: (float(v) if v is not None else None) for k, v in per_len.items()},
        "mean_accuracy": float(np.mean([c["accuracy"] for c in cells])) if cells else None,
        "cells": cells,
        "skipped_lengths": skipped,
        "plot": png.name,
        "train_seq_len": subject.seq_len,
    }


def passkey_suite(subject: Subject, out_dir: Path, opts: PasskeyOptions) -> dict:
    """Passkey retrieval over ``lengths`` (tokens; default half, one and two training contexts; or ``factors`` x the
    training context) x ``depths``."""
    return retrieval_grid(subject, out_dir, "passkey", lambda r: passkey_parts(r, opts.digits), opts)


def niah_suite(subject: Subject, out_dir: Path, opts: NiahOptions) -> dict:
    """RULER single needle (value_kind number | word | uuid; haystack corpus text or noise); lengths as passkey's."""
    if opts.haystack == "corpus" and subject.corpus is None:
        opts = replace(opts, haystack="noise")
    res = retrieval_grid(subject, out_dir, "niah", lambda r: niah_parts(r, opts.value_kind), opts)
    return {"value_kind": opts.value_kind, **res}


@torch.no_grad()
def position_losses(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 4) -> torch.Tensor:
    """Mean next-token loss at every position over ``windows`` [N, T+1] -> [T]."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    total = torch.zeros(windows.shape[1] - 1, dtype=torch.float64)
    for s in range(0, len(windows), batch_size):
        w = windows[s : s + batch_size].to(dev)
        loss, _ = model(w[:, :-1], targets=w[:, 1:], reduction="none")  # [B, T]
        total += loss.sum(0).double().cpu()
    model.train(was_training)
    return total / len(windows)


@dataclass(frozen=True)
class ExtrapolationOptions:
    """The ``extrapolation`` suite's options: ``windows`` held-out windows of ``length`` tokens (default ``factor`` x
    the training context) per domain of ``domains`` (default all) from ``split``, drawn by ``seed``; losses averaged
    per ``bucket`` positions (default a quarter of the training context); ``batch_size`` windows at a time."""

    factor: float = 4.0
    length: int | None = None
    windows: int = 8
    bucket: int | None = None
    domains: Sequence[str] | None = None
    split: str = "test"
    seed: int = 0
    batch_size: int = 2


def extrapolation_suite(subject: Any, out_dir: Path, opts: ExtrapolationOptions) -> dict:
    """Loss per position bucket on held-out windows of ``length`` tokens (default ``factor`` x the
    training context), per domain. Buckets default to a quarter of the training context."""
    from ..config_base import ConfigError

    if subject.corpus is None:
        raise ConfigError("extrapolation needs the run's corpus (held-out text)")
    T = int(opts.length or opts.factor * subject.seq_len)
    limit = subject.max_positions()
    if limit is not None and T > limit:
        raise ConfigError(f"extrapolation: this model learns absolute positions up to {limit} tokens; it cannot read {T}-token windows")
    bucket = int(opts.bucket or max(1, subject.seq_len // 4))
    domains = list(opts.domains or subject.corpus.domains)
    out: dict[str, dict] = {}
    for d in domains:
        toks = subject.corpus.tokens(d, opts.split)
        n = min(opts.windows, (len(toks) - 1) // (T + 1))
        if n < 1:
            out[d] = {"error": f"{d}/{opts.split} has {len(toks)} tokens, fewer than one {T + 1}-token window"}
            continue
        starts = sorted(np.random.default_rng([opts.seed, len(toks)]).choice((len(toks) - 1) // (T + 1), size=n, replace=False))
        w = torch.stack([torch.from_numpy(np.asarray(toks[s * (T + 1) : (s + 1) * (T + 1)], dtype=np.int64)) for s in starts])
        per_pos = position_losses(subject.model, w, opts.batch_size)
        edges = list(range(0, T, bucket))
        losses = [float(per_pos[a : a + bucket].mean()) for a in edges]
        inside = per_pos[: subject.seq_len].mean().item()
        beyond = per_pos[subject.seq_len :].mean().item() if T > subject.seq_len else None
        out[d] = {"bucket_start": edges, "loss": losses, "windows": n, "loss_within_train_len": inside, "loss_beyond_train_len": beyond}
    png = _plot_extrapolation(out, bucket, subject, out_dir / "eval_extrapolation.png")
    ok = [v for v in out.values() if "loss" in v]
    mean = lambda key: float(np.mean([v[key] for v in ok])) if ok and ok[0][key] is not None else None  # noqa: E731
    return {
        "length": T,
        "train_seq_len": subject.seq_len,
        "bucket": bucket,
        "split": opts.split,
        "seed": opts.seed,
        "mean_loss_within_train_len": mean("loss_within_train_len"),
        "mean_loss_beyond_train_len": mean("loss_beyond_train_len"),
        "domains": out,
        "plot": png.name,
    }


def _plot_extrapolation(res: dict, bucket: int, subject: Any, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for d, v in res.items():
        if "loss" in v:
            ax.plot([s + bucket / 2 for s in v["bucket_start"]], v["loss"], marker="o", ms=3, label=d)
    ax.axvline(subject.seq_len, color="grey", ls="--", lw=1, label="train length")
    ax.set_xlabel("position (tokens)")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"length extrapolation: {subject.name}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
