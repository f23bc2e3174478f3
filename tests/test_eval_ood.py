"""Evaluation: fixed windows spread over each split, known-answer loss and bits per byte, window losses,
the in-domain weighting."""

import math

import numpy as np
import pytest
import torch

from basecap.data.loader import eval_batches, eval_windows
from basecap.eval.ood import DomainEvaluator, in_domain_loss
from basecap.model import ModelConfig, build_model

T = 32


def zero_logit_model(vocab_size):
    model = build_model(ModelConfig(d_model=16, n_layers=1, max_seq_len=T, mixer={"name": "attention", "head_dim": 8}), vocab_size)
    torch.nn.init.zeros_(model.head.weight)  # logits are exactly 0: every token has probability 1/V
    return model


def test_windows_are_fixed_spread_over_the_split_and_never_overlap(tiny_corpus):
    n_tokens = len(tiny_corpus.tokens("code", "validation"))
    starts = eval_windows(tiny_corpus, "code", "validation", T, max_tokens=20 * T)
    assert len(starts) == 20 and np.all(np.diff(starts) >= T)  # predicted tokens [s+1, s+T] never overlap
    stratum = (n_tokens - 1) // 20
    assert np.array_equal(starts // stratum, np.arange(20))  # one window in each of 20 equal strata
    assert starts[-1] + T + 1 <= n_tokens and starts[-1] > n_tokens - 2 * stratum  # reaches the end of the split
    assert np.array_equal(starts, eval_windows(tiny_corpus, "code", "validation", T, max_tokens=20 * T))
    assert not np.array_equal(starts % stratum, eval_windows(tiny_corpus, "code", "test", T, max_tokens=20 * T) % stratum)
    everything = eval_windows(tiny_corpus, "code", "validation", T, max_tokens=None)
    assert len(everything) == (n_tokens - 1) // T and np.all(np.diff(everything) >= T)
    assert len(eval_windows(tiny_corpus, "code", "validation", T, max_tokens=10**9)) == len(everything)
    with pytest.raises(ValueError, match="not one window"):
        eval_windows(tiny_corpus, "code", "validation", T, max_tokens=T - 1)


def test_batches_hold_the_windows(tiny_corpus):
    toks = np.asarray(tiny_corpus.tokens("prose", "validation"))
    starts = eval_windows(tiny_corpus, "prose", "validation", T, max_tokens=7 * T)
    batches = list(eval_batches(tiny_corpus, "prose", "validation", seq_len=T, batch_size=3, max_tokens=7 * T))
    assert [b[0].shape for b in batches] == [(3, T), (3, T), (1, T)]
    x, y = torch.cat([b[0] for b in batches]).numpy(), torch.cat([b[1] for b in batches]).numpy()
    for row_x, row_y, s in zip(x, y, starts):
        assert np.array_equal(row_x, toks[s : s + T]) and np.array_equal(row_y, toks[s + 1 : s + T + 1])


def test_two_evaluators_see_the_same_windows(tiny_corpus):
    a, b = (DomainEvaluator(tiny_corpus, ["prose", "code"], "validation", T, 4, 10 * T) for _ in range(2))
    for d in ("prose", "code"):
        assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a.batches[d], b.batches[d]))


def test_zero_logits_give_ln_v_and_bpb_from_the_bytes_evaluated(tiny_corpus):
    V = tiny_corpus.vocab_size
    ev = DomainEvaluator(tiny_corpus, ["prose", "code"], "validation", T, 4, 10 * T)
    res = ev.evaluate(zero_logit_model(V))
    tb = tiny_corpus.token_bytes()
    for d, r in res.items():
        targets = torch.cat([y for _, y in ev.batches[d]]).numpy()
        n_bytes = int(tb[targets].sum())
        assert r["tokens"] == targets.size == 10 * T and r["bytes"] == n_bytes
        assert r["loss"] == pytest.approx(math.log(V), rel=1e-6)
        assert r["bpb"] == pytest.approx(math.log(V) / math.log(2) * r["tokens"] / n_bytes, rel=1e-6)
        # the evaluated text, not the whole split's bytes per token
        split_ratio = tiny_corpus.split_info(d, "validation")["bytes"] / tiny_corpus.split_info(d, "validation")["tokens"]
        assert n_bytes != pytest.approx(split_ratio * r["tokens"], rel=1e-9)
        assert len(r["window_losses"]) == 10 and np.allclose(r["window_losses"], math.log(V), rtol=1e-6)


def test_window_losses_average_to_the_loss(tiny_corpus):
    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=16, n_layers=1, max_seq_len=T, mixer={"name": "attention", "head_dim": 8}),
                        tiny_corpus.vocab_size)
    ev = DomainEvaluator(tiny_corpus, ["code"], "validation", T, 4, 6 * T)
    res = ev.evaluate(model)["code"]
    assert np.mean(res["window_losses"]) == pytest.approx(res["loss"], abs=1e-6)
    assert np.ptp(res["window_losses"]) > 0
    with torch.no_grad():  # the same numbers from the whole logits
        plain = torch.cat([torch.nn.functional.cross_entropy(model(x)[0].transpose(1, 2), y, reduction="none").mean(1)
                           for x, y in ev.batches["code"]])
    assert res["window_losses"] == pytest.approx(plain.tolist(), abs=2e-6)


def test_token_bytes_sum_to_the_documents_bytes(tiny_corpus):
    tb = tiny_corpus.token_bytes()
    assert tb[tiny_corpus.eot_id] == 0
    for d in tiny_corpus.domains:
        for split in ("train", "validation"):
            toks = np.asarray(tiny_corpus.tokens(d, split))
            assert int(tb[toks].sum()) == tiny_corpus.split_info(d, split)["bytes"]
    ids = tiny_corpus.tokenizer.encode("naïve café — 東京\n    return x", add_special_tokens=False).ids
    assert int(tb[ids].sum()) == len("naïve café — 東京\n    return x".encode("utf-8"))


def test_in_domain_loss_is_the_train_weighted_mean():
    res = {"a": {"loss": 1.0, "u": 5.0}, "b": {"loss": 3.0, "u": 7.0}, "c": {"loss": 10.0, "u": 9.0}}
    assert in_domain_loss(res, {"a": 3.0, "b": 1.0, "c": 0.0}) == pytest.approx((3 * 1.0 + 3.0) / 4)
    assert in_domain_loss(res, {"a": 0.5, "b": 0.5}) == pytest.approx(2.0)
    assert in_domain_loss(res, {"a": 3.0, "b": 1.0}, key="u") == pytest.approx((3 * 5.0 + 7.0) / 4)
    assert in_domain_loss(res, {"a": 1.0, "missing": 5.0}) == pytest.approx(1.0)  # domains not evaluated do not count
