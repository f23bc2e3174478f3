"""Retrieval sequences mixed into training (``data.retrieval``): the passkey prompt (Mohtashami & Jaggi 2023,
"Landmark Attention") and RULER's single needle (Hsieh et al. 2024), made by the generators the ``passkey`` and
``niah`` suites use (``synthetic/needle.py``), each followed by its answer and filling one training window.

A retrieval window of T + 1 tokens holds, from position 0: the prompt (prefix, haystack with the needle at a depth
drawn uniformly from [0, 1], question), filled to T - len(answer) tokens of the corpus tokenizer exactly as the
suites fill theirs (``fill_prompt``); then `` <answer>`` and a newline (the suites stop at a newline) and the
end-of-text id; then, for the few tokens the prompt left free, the start of a random stretch of the haystack
domain's training split (windows straddle documents anyway). The passkey haystack is the suites' noise sentences;
the needle's is sentences of the training split of a training domain (the suites read the test split, so no
sentence of a test haystack was trained on). Numbers are the needle's values (``value_kind = "number"``, the suite's
default).

With ``min_prompt_len`` (``data.retrieval.min_prompt_len``) a window packs several prompts instead, one after the other,
each with its answer, newline and end-of-text id: each prompt's task is drawn anew and its length (answer included)
log-uniformly between ``min_prompt_len`` and what is left of the window, until less than ``min_prompt_len`` is left,
which the haystack domain's text fills. The answers a window supervises grow from one to several, and short haystacks
(the needle a few dozen tokens back) come beside long ones: a curriculum inside every window. The suites test the
same prompts, one per context.

Which rows of a step are retrieval windows, which task each is and every draw inside it are functions of
(seed, step, row) alone, so the batch of a step stays a pure function of the seed and the step.
"""

from __future__ import annotations

import math
import random
import re
from typing import Iterator, Sequence

import numpy as np

from ..config_base import ConfigError
from .corpus import Corpus
from .synthetic import fill_prompt, niah_parts, noise_sentences, passkey_parts

TASKS = ("passkey", "niah")
_STREAM = 7  # the row draw's seed stream, apart from the window draw's (loader.TrainBatches.windows)


def corpus_sentences(corpus: Corpus, domain: str, split: str, seed: int, window: int = 4096) -> Iterator[str]:
    """Endless sentences of corpus text, read in decoded windows from a seeded offset."""
    toks = corpus.tokens(domain, split)
    if len(toks) < 16:
        raise ValueError(f"corpus {domain}/{split} is too small for a haystack")
    pos = random.Random(seed).randrange(len(toks))
    while True:
        chunk = np.asarray(toks[pos : pos + window])
        pos = (pos + window) % max(1, len(toks) - 1)
        text = corpus.tokenizer.decode([int(t) for t in chunk if int(t) != corpus.eot_id])
        for s in re.split(r"(?<=[.!?])\s+|\n+", text)[1:-1]:
            s = s.strip()
            if s:
                yield s


class RetrievalSequences:
    """The retrieval windows of one training data order: ``rows(step, n)`` picks which of a step's ``n`` (global)
    rows are retrieval windows, ``window(step, row)`` builds one ([T + 1] int64 token ids)."""

    def __init__(
        self,
        corpus: Corpus,
        fraction: float,
        tasks: Sequence[str],
        domain: str,
        seq_len: int,
        seed: int = 0,
        *,
        min_prompt_len: int | None = None,
    ):
        if not 0 < fraction <= 1:
            raise ConfigError(f"data.retrieval.fraction must be in (0, 1], got {fraction}")
        bad = [t for t in tasks if t not in TASKS]
        if bad or not tasks:
            raise ConfigError(f"data.retrieval.tasks: {list(tasks)}; allowed: {list(TASKS)} (at least one)")
        if domain not in corpus.domains:
            raise ConfigError(f"data.retrieval.haystack_domain: unknown domain {domain!r}; the corpus has: {', '.join(corpus.domains)}")
        self.corpus, self.fraction, self.tasks, self.domain = corpus, float(fraction), list(tasks), domain
        self.seq_len, self.seed = int(seq_len), int(seed)
        self.shard = corpus.tokens(domain, "train")
        if len(self.shard) < self.seq_len + 1:
            raise ConfigError(f"data.retrieval.haystack_domain: {domain}/train has {len(self.shard)} tokens, fewer than seq_len + 1")
        self.min_prompt_len = min_prompt_len
        if min_prompt_len is not None and not 0 < min_prompt_len <= self.seq_len + 1:
            raise ConfigError(f"data.retrieval.min_prompt_len must be in [1, seq_len + 1 = {self.seq_len + 1}], got {min_prompt_len}")
        for task in self.tasks:  # a context too short for a prompt fails here, before any training
            for length, what in [(self.seq_len + 1, f"seq_len {self.seq_len}"), (min_prompt_len, f"min_prompt_len {min_prompt_len}")]:
                if length is None:
                    continue
                try:
                    self._prompt(task, random.Random(f"check-{task}"), length)
                except ValueError as e:
                    raise ConfigError(f"data.retrieval: {what} cannot hold a {task} prompt: {e}") from None

    def encode(self, text: str) -> list[int]:
        return self.corpus.tokenizer.encode(text, add_special_tokens=False).ids

    def count(self, n: int) -> int:
        """Retrieval windows among ``n`` rows: ``fraction x n`` rounded half up, at least one."""
        return max(1, int(self.fraction * n + 0.5))

    def rows(self, step: int, n: int) -> np.ndarray:
        """The sorted global rows of ``step`` (of ``n``) that are retrieval windows."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, step, _STREAM])))
        return np.sort(rng.choice(n, size=self.count(n), replace=False))

    def window(self, step: int, row: int) -> np.ndarray:
        """The retrieval window of global row ``row`` of ``step``: [seq_len + 1] int64."""
        rng = random.Random(f"retrieval-{self.seed}-{step}-{row}")
        if self.min_prompt_len is None:
            return self._fill(self._prompt(rng.choice(self.tasks), rng, self.seq_len + 1), rng)
        ids: list[int] = []
        while self.seq_len + 1 - len(ids) >= self.min_prompt_len:
            left = self.seq_len + 1 - len(ids)
            length = round(math.exp(rng.uniform(math.log(self.min_prompt_len), math.log(left))))
            try:
                ids += self._prompt(rng.choice(self.tasks), rng, min(max(length, self.min_prompt_len), left))
            except ValueError:  # a needle drawn longer than the one checked at min_prompt_len: text fills the rest
                break
        return self._fill(ids, rng)

    def _prompt(self, task: str, rng: random.Random, length: int) -> list[int]:
        """One prompt of ``task`` with its answer, newline and end-of-text id, at most ``length`` tokens (a ValueError
        when even its haystack-free parts are longer)."""
        depth = rng.random()
        prefix, needle, question, answer = passkey_parts(rng) if task == "passkey" else niah_parts(rng, "number")
        sentences = noise_sentences() if task == "passkey" else corpus_sentences(self.corpus, self.domain, "train", rng.randrange(2**31))
        tail = self.encode(f" {answer}\n") + [self.corpus.eot_id]
        text, _, _ = fill_prompt(self.encode, prefix, needle, question, sentences, length - len(tail), depth=depth)
        return self.encode(text) + tail

    def _fill(self, ids: list[int], rng: random.Random) -> np.ndarray:
        """``ids`` followed by the start of a random stretch of the haystack domain's training split: [seq_len + 1]."""
        free = self.seq_len + 1 - len(ids)
        start = rng.randrange(len(self.shard) - free + 1)
        return np.concatenate([np.asarray(ids, dtype=np.int64), np.asarray(self.shard[start : start + free], dtype=np.int64)])
