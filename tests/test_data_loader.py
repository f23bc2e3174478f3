"""Loaders: deterministic training batches, weights, rank sharding, evaluation windows, tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_data_helpers import make_tiny_data, tiny_recipe

from basecap.config_base import ConfigError
from basecap.data import TrainBatches, build_corpus, recipe_from_dict


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    data = make_tiny_data(root / "data")
    return build_corpus(recipe_from_dict(tiny_recipe(data)), home=root / "home", log=lambda m: None)


def test_batch_shapes_and_shift(corpus):
    tb = TrainBatches(corpus, weights={"prose": 1.0}, seq_len=16, batch_size=3, seed=0)
    x, y = tb.batch(0)
    assert x.shape == y.shape == (3, 16) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < corpus.vocab_size


def test_batch_is_a_pure_function_of_seed_and_step(corpus):
    a = TrainBatches(corpus, weights={"prose": 1.0, "code": 1.0}, seq_len=16, batch_size=4, seed=7)
    b = TrainBatches(corpus, weights={"prose": 1.0, "code": 1.0}, seq_len=16, batch_size=4, seed=7)
    for step in (5, 0, 123456):  # any order: resume from any step is exact
        assert all(torch.equal(p, q) for p, q in zip(a.batch(step), b.batch(step)))
    assert not torch.equal(a.batch(0)[0], a.batch(1)[0])
    c = TrainBatches(corpus, weights={"prose": 1.0, "code": 1.0}, seq_len=16, batch_size=4, seed=8)
    assert not torch.equal(a.batch(0)[0], c.batch(0)[0])


def test_weights_are_respected(corpus):
    tb = TrainBatches(corpus, weights={"prose": 1.0, "code": 0.0}, seq_len=8, batch_size=16, seed=0)
    assert tb.domains == ["prose"]
    prose = np.asarray(corpus.tokens("prose", "train"))
    for step in range(20):
        dom, start = tb.windows(step)
        assert set(dom.tolist()) == {0}
        x, _ = tb.batch(step)
        for row, s in zip(x.numpy(), start):
            assert np.array_equal(row, prose[s : s + 8])
    mix = TrainBatches(corpus, weights={"prose": 3.0, "code": 1.0}, seq_len=8, batch_size=64, seed=0)
    share = np.mean(np.concatenate([mix.windows(s)[0] for s in range(20)]) == 0)
    assert 0.65 < share < 0.85


def test_unknown_or_bad_weights(corpus):
    with pytest.raises(ConfigError, match=r"unknown domain\(s\) \['poetry'\]; the corpus has: prose, code"):
        TrainBatches(corpus, weights={"poetry": 1.0}, seq_len=8, batch_size=2)
    with pytest.raises(ConfigError, match="no domain a positive weight"):
        TrainBatches(corpus, weights={"prose": 0.0}, seq_len=8, batch_size=2)
    with pytest.raises(ConfigError, match=">= 0"):
        TrainBatches(corpus, weights={"prose": -1.0}, seq_len=8, batch_size=2)
    with pytest.raises(ConfigError, match="fewer than seq_len"):
        TrainBatches(corpus, weights={"prose": 1.0}, seq_len=10**9, batch_size=2)


def test_ranks_split_one_global_batch(corpus):
    kw = dict(weights={"prose": 1.0, "code": 1.0}, seq_len=8, seed=3)
    whole = TrainBatches(corpus, batch_size=6, **kw).batch(11)[0]
    parts = [TrainBatches(corpus, batch_size=2, rank=r, world_size=3, **kw).batch(11)[0] for r in range(3)]
    assert torch.equal(torch.cat(parts), whole)


def test_tokenizer_round_trip(corpus):
    tok = corpus.tokenizer
    for text in ["Hello, world!\n\tIndented  twice.\n", "naïve café — 東京 🚀\n",
                 "def f(x):\n    return x ** 2  # <|endoftext|> stays text\n", " leading space", ""]:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert corpus.eot_id not in ids
        assert tok.decode(ids, skip_special_tokens=False) == text
