"""Batches from a built corpus: random training windows and fixed evaluation windows.

Training: the batch of step ``s`` is a pure function of (seed, s, rank, world_size), so a resumed
run sees exactly the data it would have seen, and every architecture trained with the same seed
sees the identical data order (paired comparisons). Each step draws one global batch of
``batch_size * world_size`` windows; rank ``r`` takes rows ``[r * batch_size, (r + 1) * batch_size)``,
so the union over ranks does not depend on how many ranks share it.
"""

from __future__ import annotations

import numbers
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from ..config_base import ConfigError
from .corpus import Corpus
from .retrieval import RetrievalSequences


def check_domains(fields: dict[str, Iterable[str]], known: Sequence[str], source: str = "corpus") -> None:
    """The one check of domain names: every name listed under each field (e.g. ``data.train_weights``)
    must be one of ``known`` (the domains of a corpus, or of the recipe it will be built from)."""
    for field, names in fields.items():
        bad = [d for d in names if d not in known]
        if bad:
            raise ConfigError(f"{field}: unknown domain(s) {bad}; the {source} has: {', '.join(known)}")


class TrainBatches:
    """Windows of ``seq_len + 1`` tokens from the train splits, domains drawn by ``weights``. With ``retrieval``
    (``data.retrieval``: fraction, tasks, haystack_domain) some rows of every step are retrieval prompts with their
    answers instead (``data/retrieval.py``)."""

    def __init__(
        self,
        corpus: Corpus,
        weights: dict[str, float],
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        *,
        world_size: int = 1,
        split: str = "train",
        retrieval=None,
    ):
        check_domains({"training weights": weights}, corpus.domains)
        bad = {d: w for d, w in weights.items() if not (isinstance(w, numbers.Real) and 0 <= w < float("inf"))}
        if bad:
            raise ConfigError(f"training weights must be finite and >= 0, got {bad}")
        if seq_len < 1 or batch_size < 1:
            raise ConfigError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is not in [0, world_size={world_size})")
        self.domains = [d for d in corpus.domains if weights.get(d, 0) > 0]
        if not self.domains:
            raise ConfigError(f"training weights {weights} give no domain a positive weight")
        w = np.array([float(weights[d]) for d in self.domains])
        self.probs = w / w.sum()
        self.shards = [corpus.tokens(d, split) for d in self.domains]
        for d, s in zip(self.domains, self.shards):
            if len(s) < seq_len + 1:
                raise ConfigError(f"domain {d!r} {split} split has {len(s)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
        self.max_start = np.array([len(s) - seq_len - 1 for s in self.shards], dtype=np.int64)
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.retrieval = None
        if retrieval is not None:
            domain = retrieval.haystack_domain or self.domains[0]
            self.retrieval = RetrievalSequences(
                corpus, retrieval.fraction, retrieval.tasks, domain, seq_len, seed, min_prompt_len=retrieval.min_prompt_len
            )

    def windows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(domain index, start) of this rank's windows for ``step``."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, step])))
        n = self.batch_size * self.world_size
        dom = rng.choice(len(self.domains), size=n, p=self.probs)
        start = rng.integers(0, self.max_start[dom] + 1)
        rows = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        return dom[rows], start[rows]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) LongTensors [B, T]; y is x shifted by one token."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        dom, start = self.windows(step)
        T = self.seq_len
        rows = [np.asarray(self.shards[d][s : s + T + 1], dtype=np.int64) for d, s in zip(dom, start)]
        if self.retrieval is not None:
            first = self.rank * self.batch_size
            for r in self.retrieval.rows(step, self.batch_size * self.world_size):
                if first <= r < first + self.batch_size:
                    rows[r - first] = self.retrieval.window(step, int(r))
        w = torch.from_numpy(np.stack(rows))
        return w[:, :-1], w[:, 1:]


def eval_windows(corpus: Corpus, domain: str, split: str = "validation", seq_len: int = 256, max_tokens: int | None = 65536) -> np.ndarray:
    """Start of every evaluation window of ``domain``/``split``: fixed, spread over the whole split.

    n = min(max_tokens, len - 1) // T windows (all of the split when ``max_tokens`` is None). The
    split is cut into n equal strata of (len - 1) // n >= T tokens and window i starts at a random
    offset inside stratum i, so the windows sample every part of the split (every document, not the
    first few) and their predicted tokens never overlap. The offsets come from a generator seeded by
    (domain, split) only: every run, every evaluation step and every evaluator sees the same windows.
    """
    n_tokens = len(corpus.tokens(domain, split))
    available = max(n_tokens - 1, 0) // seq_len
    n = available if max_tokens is None else min(max_tokens // seq_len, available)
    if n <= 0:
        raise ValueError(f"{domain}/{split} has {n_tokens} tokens: not one window of {seq_len} + 1 (max_tokens={max_tokens})")
    stratum = (n_tokens - 1) // n
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(f"{domain}\0{split}".encode()))))
    return np.arange(n, dtype=np.int64) * stratum + rng.integers(0, stratum - seq_len + 1, size=n)


def eval_batches(
    corpus: Corpus, domain: str, split: str = "validation", seq_len: int = 256, batch_size: int = 8, max_tokens: int | None = 65536
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The windows of :func:`eval_windows` in batches of (x, y) LongTensors [B, T], in split order.

    A window starting at s holds tokens [s, s + T] (x the first T, y the last T). The same arguments give
    the same batches.
    """
    check_domains({"evaluation domain": [domain]}, corpus.domains)
    tokens = corpus.tokens(domain, split)
    starts = eval_windows(corpus, domain, split, seq_len, max_tokens)
    for b in range(0, len(starts), batch_size):
        w = torch.from_numpy(np.stack([np.asarray(tokens[s : s + seq_len + 1], dtype=np.int64) for s in starts[b : b + batch_size]]))
        yield w[:, :-1], w[:, 1:]
