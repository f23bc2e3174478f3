"""Multi-query associative recall (MQAR) from Zoology (Arora, Eyuboglu et al. 2023, "Zoology:
Measuring and Improving Recall in Efficient Language Models", arXiv 2312.04927).

A sequence starts with ``num_kv_pairs`` key-value pairs (keys from the lower half of the
vocabulary, values from the upper half, keys unique within a sequence), followed by queries: each
key appears once more, at a gap after the context drawn from a power law
(p(gap = g) proportional to (g + 1) ** (power_a - 1), gaps distinct, so short gaps dominate as in
natural text), and the model must predict its value at the query position. Every other position is
filled with random tokens (``random_non_queries``) and carries the ignore label -100.

Generation is vectorised numpy with a private ``Generator`` per (seed, split, setting), so data are
identical across runs, processes and machines, and train and test never share a stream.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch

IGNORE = -100
SPLIT_IDS = {"train": 0, "test": 1}


@dataclass
class MQARBatch:
    """Token ids ``inputs`` [N, T] and ``targets`` [N, T] (-100 except at query positions), plus
    the ground truth used by the tests: ``keys``/``values`` [N, K] in context order and the
    input position of each key's query ``query_pos`` [N, K]."""

    inputs: torch.Tensor
    targets: torch.Tensor
    keys: np.ndarray
    values: np.ndarray
    query_pos: np.ndarray
    num_kv_pairs: int
    seq_len: int


def gap_distribution(space: int, power_a: float) -> np.ndarray:
    """p(gap) for gap = 0 .. space-1: proportional to (gap + 1) ** (power_a - 1)."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def _rng(seed: int, split: str, seq_len: int, num_kv_pairs: int, vocab_size: int) -> np.random.Generator:
    return np.random.default_rng([seed, SPLIT_IDS[split], seq_len, num_kv_pairs, vocab_size, zlib.crc32(b"mqar")])


def _distinct(rng: np.random.Generator, n: int, k: int, population: int, logp: np.ndarray | None = None) -> np.ndarray:
    """[n, k] draws without replacement from range(population) per row (Gumbel top-k: sequential
    sampling without replacement, with weights exp(logp) when given)."""
    out = np.empty((n, k), dtype=np.int64)
    rows = max(1, (1 << 22) // max(population, 1))
    for s in range(0, n, rows):
        m = min(rows, n - s)
        g = rng.gumbel(size=(m, population))
        if logp is not None:
            g += logp
        out[s : s + m] = np.argpartition(-g, k - 1, axis=1)[:, :k] if k < population else np.argsort(-g, axis=1)
    return out


def mqar(
    num_examples: int,
    seq_len: int = 64,
    num_kv_pairs: int = 4,
    vocab_size: int = 256,
    power_a: float = 0.01,
    random_non_queries: bool = True,
    *,
    seed: int = 0,
    split: str = "train",
) -> MQARBatch:
    """One MQAR setting: ``num_examples`` sequences of ``seq_len`` tokens with ``num_kv_pairs`` pairs."""
    if split not in SPLIT_IDS:
        raise ValueError(f"split must be one of {sorted(SPLIT_IDS)}, got {split!r}")
    if seq_len % 2:
        raise ValueError(f"seq_len must be even, got {seq_len}")
    if 4 * num_kv_pairs > seq_len:
        raise ValueError(f"num_kv_pairs={num_kv_pairs} needs seq_len >= {4 * num_kv_pairs} (context + queries), got {seq_len}")
    key_vocab = vocab_size // 2
    if num_kv_pairs > key_vocab - 1 or num_kv_pairs > vocab_size - key_vocab:
        raise ValueError(f"vocab_size={vocab_size} is too small for {num_kv_pairs} distinct keys and values")
    rng = _rng(seed, split, seq_len, num_kv_pairs, vocab_size)
    n, k = num_examples, num_kv_pairs
    keys = 1 + _distinct(rng, n, k, key_vocab - 1)  # [N, K] in 1 .. key_vocab-1
    values = key_vocab + _distinct(rng, n, k, vocab_size - key_vocab)  # [N, K]
    context = 2 * k
    space = (seq_len - context) // 2
    gaps = _distinct(rng, n, k, space, np.log(gap_distribution(space, power_a)))  # [N, K]
    query_pos = context + 2 * gaps  # input position of each query key

    seq = np.zeros((n, seq_len + 1), dtype=np.int64)
    seq[:, 0:context:2] = keys
    seq[:, 1:context:2] = values
    np.put_along_axis(seq, query_pos, keys, axis=1)
    inputs = seq[:, :-1].copy()
    targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
    np.put_along_axis(targets, query_pos, values, axis=1)
    if random_non_queries:
        fill = np.ones((n, seq_len), dtype=bool)
        fill[:, :context] = False
        np.put_along_axis(fill, query_pos, False, axis=1)
        inputs[fill] = rng.integers(0, vocab_size, size=int(fill.sum()))
    return MQARBatch(torch.from_numpy(inputs), torch.from_numpy(targets), keys, values, query_pos, k, seq_len)


def mqar_mixture(
    settings: list[tuple[int, int]],
    num_examples: int,
    vocab_size: int = 256,
    power_a: float = 0.01,
    seed: int = 0,
    split: str = "train",
    *,
    random_non_queries: bool = True,
) -> list[MQARBatch]:
    """One ``MQARBatch`` per (seq_len, num_kv_pairs) setting, ``num_examples`` each."""
    return [mqar(num_examples, T, K, vocab_size, power_a, random_non_queries, seed=seed, split=split) for T, K in settings]
