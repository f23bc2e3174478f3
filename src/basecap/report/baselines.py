"""The unigram baseline of a run, for the report: from its evaluation records when they carry it, else
computed from its corpus when that is built in the data home (runs evaluated before the records carried
it), else unknown. See docs/metrics.md (baselines, context gain)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runs import Run

NEAR_UNIGRAM_NATS = 1.0  # a run that gains less than this over word frequencies is "near unigram"


def run_unigram(run: Run) -> dict[str, float] | None:
    """Unigram loss of the run's training mixture on each evaluated domain's windows, or None."""
    if not run.evals:
        return None
    last = run.evals[-1]["domains"]
    if last and all("unigram_loss" in v for v in last.values()):
        return {d: float(v["unigram_loss"]) for d, v in last.items()}
    cfg = run.info.get("config", {})
    corpus = (run.info.get("corpus") or {}).get("dir")
    try:
        weights = tuple(sorted(cfg["data"]["train_weights"].items()))
        key = (corpus, weights, tuple(last), cfg["eval"]["split"], cfg["data"]["seq_len"], cfg["eval"]["max_tokens"])
    except (KeyError, TypeError):
        return None
    return _from_corpus(*key) if corpus else None


@lru_cache(maxsize=64)
def _from_corpus(
    corpus_name: str, weights: tuple[tuple[str, float], ...], domains: tuple[str, ...], split: str, seq_len: int, max_tokens: int | None
) -> dict[str, float] | None:
    from ..config_base import ConfigError
    from ..data.baselines import find_corpus, unigram_losses

    try:
        corpus = find_corpus(corpus_name)
        if corpus is None:
            return None
        return unigram_losses(corpus, dict(weights), list(domains), split, seq_len, max_tokens)
    except (ConfigError, ValueError, OSError):
        return None


def unigram_in_domain(unigram: dict[str, float], weights: dict[str, float]) -> float | None:
    """The baseline's in-domain loss, weighted as the model's (sum_d w_d U_d / sum_d w_d over training domains)."""
    w = {d: v for d, v in weights.items() if v > 0}
    if not w or any(d not in unigram for d in w):
        return None
    return sum(unigram[d] * v for d, v in w.items()) / sum(w.values())
