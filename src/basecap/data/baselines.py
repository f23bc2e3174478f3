"""The unigram baseline: the loss of a model that ignores its context.

The training mixture's unigram distribution is each training domain's token frequencies in its train
split, add-0.5 smoothed over the vocabulary, mixed by the training weights (the way training batches
draw domains). Its cross-entropy on a domain's evaluation windows (the same windows the models are
scored on) is what a model gets from word frequencies alone; a model's *context gain* is that loss
minus its own. See docs/metrics.md.

Token counts are computed once per corpus and cached in the corpus folder (``unigram_counts.json``,
written atomically); they do not depend on the weights, so every mixture reuses them. A read-only
corpus is counted in memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..atomic import atomic_write
from .corpus import Corpus, load_corpus
from .loader import eval_windows

SMOOTHING = 0.5  # add-1/2 (Jeffreys prior, Krichevsky-Trofimov): see docs/metrics.md
COUNTS_FILE = "unigram_counts.json"
COUNTS_FORMAT = "basecap-unigram-counts/1"
_CHUNK = 1 << 24


def train_token_counts(corpus: Corpus, domains: list[str]) -> dict[str, np.ndarray]:
    """Each domain's token counts [vocab_size] in its train split, from the corpus cache when it holds them."""
    path = corpus.dir / COUNTS_FILE
    cached = _read_counts(path, corpus)
    missing = [d for d in domains if d not in cached]
    for d in missing:
        tokens = corpus.tokens(d, "train")
        counts = np.zeros(corpus.vocab_size, dtype=np.int64)
        for i in range(0, len(tokens), _CHUNK):  # bounded memory on large shards
            counts += np.bincount(np.asarray(tokens[i : i + _CHUNK], dtype=np.int64), minlength=corpus.vocab_size)
        cached[d] = counts
    if missing:
        try:
            atomic_write(
                path,
                json.dumps(
                    {
                        "format": COUNTS_FORMAT,
                        "split": "train",
                        "vocab_size": corpus.vocab_size,
                        "tokens": {d: int(c.sum()) for d, c in cached.items()},
                        "counts": {d: c.tolist() for d, c in cached.items()},
                    },
                    separators=(",", ":"),
                ),
            )
        except OSError:
            pass  # a read-only corpus: the counts stay in memory
    return {d: cached[d] for d in domains}


def _read_counts(path: Path, corpus: Corpus) -> dict[str, np.ndarray]:
    """The cached counts that still match the corpus (same vocabulary, same train-split sizes)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if data.get("format") != COUNTS_FORMAT or data.get("vocab_size") != corpus.vocab_size:
        return {}
    out = {}
    for d, counts in data.get("counts", {}).items():
        if d in corpus.domains and data["tokens"].get(d) == corpus.split_info(d, "train")["tokens"] == sum(counts):
            out[d] = np.asarray(counts, dtype=np.int64)
    return out


def unigram_logprobs(counts: dict[str, np.ndarray], weights: dict[str, float], smoothing: float = SMOOTHING) -> np.ndarray:
    """log p(token) [V] of the mixture: sum over training domains of w_d / sum(w) x (n_d(v) + a) / (N_d + a V)."""
    w = {d: float(v) for d, v in weights.items() if v > 0}
    if not w:
        raise ValueError(f"training weights {weights} give no domain a positive weight")
    total = sum(w.values())
    p = sum(w[d] / total * (counts[d] + smoothing) / (counts[d].sum() + smoothing * len(counts[d])) for d in w)
    return np.log(p)


def unigram_losses(
    corpus: Corpus, weights: dict[str, float], domains: list[str], split: str, seq_len: int, max_tokens: int | None
) -> dict[str, float]:
    """Cross-entropy (nats/token) of the training mixture's unigram distribution on each domain's
    evaluation windows (:func:`basecap.data.loader.eval_windows` with the same arguments)."""
    train = [d for d, v in weights.items() if v > 0]
    logp = unigram_logprobs(train_token_counts(corpus, train), weights)
    out = {}
    for d in domains:
        tokens = corpus.tokens(d, split)
        starts = eval_windows(corpus, d, split, seq_len, max_tokens)
        targets = np.concatenate([np.asarray(tokens[s + 1 : s + seq_len + 1], dtype=np.int64) for s in starts])
        out[d] = float(-logp[targets].mean())
    return out


def find_corpus(name: str, home: str | os.PathLike | None = None) -> Corpus | None:
    """The built corpus folder ``name`` in the data home, or None when it is not there (nothing is built)."""
    from .build import data_home

    folder = data_home(home) / "corpora" / name
    return load_corpus(folder) if (folder / "manifest.json").is_file() else None
