"""The unigram baseline: the smoothed training-mixture distribution, its loss on the evaluation windows,
the count cache in the corpus folder, a read-only corpus."""

import json
import shutil

import numpy as np
import pytest
import torch
from torch import nn

from basecap.data import baselines, load_corpus
from basecap.data.baselines import COUNTS_FILE, train_token_counts, unigram_logprobs, unigram_losses
from basecap.data.loader import eval_windows
from basecap.eval.ood import DomainEvaluator

T = 32


@pytest.fixture
def corpus(tiny_corpus, tmp_path):
    """A private copy of the tiny corpus, so cache files written here touch no other test."""
    shutil.copytree(tiny_corpus.dir, tmp_path / "corpus")
    (tmp_path / "corpus" / COUNTS_FILE).unlink(missing_ok=True)
    return load_corpus(tmp_path / "corpus")


def test_mixture_is_add_half_smoothed_per_domain_and_weighted():
    counts = {"a": np.array([3, 1, 0]), "b": np.array([0, 0, 4])}
    p = np.exp(unigram_logprobs(counts, {"a": 1.0, "b": 3.0, "c": 0.0}))
    expect = 0.25 * (np.array([3, 1, 0]) + 0.5) / 5.5 + 0.75 * (np.array([0, 0, 4]) + 0.5) / 5.5
    assert p == pytest.approx(expect, rel=1e-12) and p.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no domain a positive weight"):
        unigram_logprobs(counts, {"a": 0.0})


def test_unigram_loss_on_the_evaluation_windows(corpus):
    w = {"prose": 3.0, "code": 1.0}
    V = corpus.vocab_size
    counts = {d: np.bincount(np.asarray(corpus.tokens(d, "train"), dtype=np.int64), minlength=V) for d in w}
    p = sum(w[d] / 4 * (counts[d] + 0.5) / (counts[d].sum() + 0.5 * V) for d in w)
    got = unigram_losses(corpus, w, ["prose", "code"], "validation", T, 10 * T)
    for d in ("prose", "code"):
        toks = np.asarray(corpus.tokens(d, "validation"))
        targets = np.concatenate([toks[s + 1 : s + T + 1] for s in eval_windows(corpus, d, "validation", T, 10 * T)])
        assert got[d] == pytest.approx(-np.log(p[targets]).mean(), rel=1e-12)
    assert got["prose"] < got["code"]  # mostly prose: code tokens are rarer under it


def test_counts_are_cached_in_the_corpus_and_reused(corpus, monkeypatch):
    first = train_token_counts(corpus, ["prose"])
    cache = json.loads((corpus.dir / COUNTS_FILE).read_text())
    assert cache["tokens"] == {"prose": corpus.split_info("prose", "train")["tokens"]} == {"prose": int(first["prose"].sum())}
    train_token_counts(corpus, ["code"])  # a new domain joins the cache, the old one stays
    assert set(json.loads((corpus.dir / COUNTS_FILE).read_text())["counts"]) == {"prose", "code"}

    fresh = load_corpus(corpus.dir)
    monkeypatch.setattr(fresh, "tokens", lambda *a: pytest.fail("the cached counts were not used"))
    again = train_token_counts(fresh, ["prose", "code"])
    assert np.array_equal(again["prose"], first["prose"])


def test_a_stale_cache_is_recounted(corpus):
    want = train_token_counts(corpus, ["prose"])["prose"]
    cache = json.loads((corpus.dir / COUNTS_FILE).read_text())
    cache["counts"]["prose"][0] += 1
    (corpus.dir / COUNTS_FILE).write_text(json.dumps(cache))
    assert np.array_equal(train_token_counts(load_corpus(corpus.dir), ["prose"])["prose"], want)


def test_a_read_only_corpus_is_counted_in_memory(corpus, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(baselines, "atomic_write", refuse)
    losses = unigram_losses(corpus, {"prose": 1.0}, ["code"], "validation", T, 4 * T)
    assert np.isfinite(losses["code"]) and not (corpus.dir / COUNTS_FILE).exists()


class UnigramModel(nn.Module):
    """Ignores its context: the same logits (log-probabilities) at every position."""

    def __init__(self, logp):
        super().__init__()
        self.logp = torch.as_tensor(logp, dtype=torch.float32)

    def forward(self, idx, state=None, *, targets=None, reduction="mean"):
        logits = self.logp.expand(*idx.shape, -1)
        if targets is None:
            return logits, None
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)
        return (loss.view_as(targets) if reduction == "none" else loss), None


def test_evaluator_records_the_baseline_a_unigram_model_reaches(corpus):
    w = {"prose": 1.0}
    ev = DomainEvaluator(corpus, ["prose", "code"], "validation", T, 4, 8 * T, train_weights=w)
    logp = unigram_logprobs(train_token_counts(corpus, ["prose"]), w)
    res = ev.evaluate(UnigramModel(logp))
    for d in ("prose", "code"):
        assert res[d]["unigram_loss"] == pytest.approx(res[d]["loss"], rel=1e-5)
    assert "unigram_loss" not in DomainEvaluator(corpus, ["code"], "validation", T, 4, 8 * T).evaluate(UnigramModel(logp))["code"]


def test_a_truncated_shard_is_refused_when_the_corpus_opens(tiny_corpus, tmp_path):
    """A damaged shard (a full disk, a partial copy) is caught on open, naming the file and the verify command."""
    from basecap.config_base import ConfigError
    from basecap.data.corpus import Corpus

    copy = tmp_path / tiny_corpus.dir.name
    shutil.copytree(tiny_corpus.dir, copy)
    info = Corpus(copy).manifest["domains"]["prose"]["splits"]["train"]
    with open(copy / info["file"], "r+b") as f:
        f.truncate(10)
    with pytest.raises(ConfigError, match="10 bytes.*basecap data verify"):
        Corpus(copy)
