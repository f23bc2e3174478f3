"""data.retrieval: retrieval prompts with their answers mixed into the training batches (data/retrieval.py)."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch

from basecap.config import validate_run
from basecap.config_base import ConfigError
from basecap.data import TrainBatches
from basecap.data.retrieval import RetrievalSequences
from basecap.data.synthetic import fill_prompt, passkey_parts
from basecap.data.synthetic.needle import NOISE

T = 400  # the tiny corpus's 384-token BPE spells a prompt in about 280 tokens


def _mix(**over):
    return validate_run({"name": "x", "data": {"retrieval": {"fraction": 0.5, **over}}}).data.retrieval


def _text(corpus, ids) -> str:
    return corpus.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


@pytest.mark.parametrize("task", ["passkey", "niah"])
def test_a_retrieval_window_is_a_suite_prompt_then_its_answer_then_other_text(tiny_corpus, task):
    r = RetrievalSequences(tiny_corpus, 1.0, [task], "prose", T, seed=3)
    for step, row in ((0, 0), (5, 2)):
        w = r.window(step, row)
        assert w.shape == (T + 1,) and w.dtype == np.int64
        eot = int(np.flatnonzero(w == tiny_corpus.eot_id)[0])
        text = _text(tiny_corpus, w[:eot])
        # the suites' prompt (prefix, haystack, question) and `` <answer>\n``: the needle's value is the answer
        m = re.fullmatch(r"(.+)\n(.+)\n(.+) (\S+)\n", text, flags=re.S)
        assert m is not None, text
        prefix, body, question, answer = m.groups()
        assert answer in body and question.endswith(("The pass key is", "mentioned in the provided text is"))
        if task == "passkey":
            assert prefix.startswith("There is an important info") and f"The pass key is {answer}." in body
            hay = body.replace(f"The pass key is {answer}. Remember it. {answer} is the pass key.", "")
            assert set(filter(None, re.split(r"(?<=\.)\s+", hay.strip()))) <= set(NOISE)
        else:
            assert prefix.startswith("Some special magic numbers") and f"is: {answer}." in body
        # after the end of text: a stretch of the haystack domain's training split fills the window
        rest, shard = w[eot + 1 :], np.asarray(tiny_corpus.tokens("prose", "train"), dtype=np.int64)
        starts = np.flatnonzero(shard[: len(shard) - len(rest) + 1] == rest[0]) if len(rest) else [0]
        assert any(np.array_equal(shard[s : s + len(rest)], rest) for s in starts)


def test_the_prompt_is_filled_as_the_suites_fill_theirs(tiny_corpus):
    """The passkey prompt of a window equals fill_prompt's with the same parts, depth and length (the suites' call)."""
    r = RetrievalSequences(tiny_corpus, 1.0, ["passkey"], "prose", T, seed=0)
    w = r.window(2, 1)
    rng = random.Random("retrieval-0-2-1")
    assert rng.choice(["passkey"]) == "passkey"
    depth = rng.random()
    parts = passkey_parts(rng)
    tail = r.encode(f" {parts[3]}\n") + [tiny_corpus.eot_id]
    text, n, _ = fill_prompt(r.encode, *parts[:3], iter(NOISE * 1000), T + 1 - len(tail), depth=depth)
    assert w[:n].tolist() == r.encode(text) and w[n : n + len(tail)].tolist() == tail


def test_batches_with_retrieval_are_pure_functions_of_seed_and_step(tiny_corpus):
    mix = _mix(fraction=0.25)
    a = TrainBatches(tiny_corpus, {"prose": 1.0}, seq_len=T, batch_size=8, seed=1, retrieval=mix)
    b = TrainBatches(tiny_corpus, {"prose": 1.0}, seq_len=T, batch_size=8, seed=1, retrieval=mix)
    plain = TrainBatches(tiny_corpus, {"prose": 1.0}, seq_len=T, batch_size=8, seed=1)
    for step in (4, 0):
        x, y = a.batch(step)
        assert all(torch.equal(p, q) for p, q in zip((x, y), b.batch(step)))
        assert torch.equal(x[:, 1:], y[:, :-1])
        rows = a.retrieval.rows(step, 8)
        assert len(rows) == 2  # 0.25 x 8
        px, _ = plain.batch(step)
        for i in range(8):  # the other rows are the plain data order's, untouched
            assert torch.equal(x[i], px[i]) == (i not in rows)
            assert (x[i, :40].tolist() == a.retrieval.window(step, i)[:40].tolist()) == (i in rows)
    assert not np.array_equal(a.retrieval.rows(0, 64), a.retrieval.rows(1, 64))


def test_ranks_share_one_global_batch_with_its_retrieval_rows(tiny_corpus):
    mix = _mix(fraction=0.5, tasks=["passkey"])
    whole = TrainBatches(tiny_corpus, {"prose": 1.0}, seq_len=T, batch_size=4, seed=0, retrieval=mix).batch(3)[0]
    parts = [
        TrainBatches(tiny_corpus, {"prose": 1.0}, seq_len=T, batch_size=2, seed=0, rank=r, world_size=2, retrieval=mix).batch(3)[0] for r in (0, 1)
    ]
    assert torch.equal(torch.cat(parts), whole)


def test_counts_round_half_up_and_never_to_zero(tiny_corpus):
    r = RetrievalSequences(tiny_corpus, 0.1, ["passkey"], "prose", T)
    assert [r.count(n) for n in (1, 4, 5, 15, 16)] == [1, 1, 1, 2, 2]


def test_bad_settings_name_their_field(tiny_corpus):
    with pytest.raises(ConfigError, match=r"data.retrieval: seq_len 128 cannot hold a passkey prompt"):
        TrainBatches(tiny_corpus, {"prose": 1.0}, seq_len=128, batch_size=2, retrieval=_mix(tasks=["passkey"]))
    with pytest.raises(ConfigError, match=r"data.retrieval.haystack_domain: unknown domain 'poetry'"):
        TrainBatches(tiny_corpus, {"prose": 1.0}, seq_len=T, batch_size=2, retrieval=_mix(haystack_domain="poetry"))
    for bad, msg in (
        ({"fraction": 0}, "data.retrieval.fraction"),
        ({"tasks": []}, "data.retrieval.tasks"),
        ({"tasks": ["niah", "niah"]}, "repeated"),
    ):
        with pytest.raises(ConfigError, match=msg):
            _mix(**bad)
    with pytest.raises(ConfigError, match="data.retrieval.fractio: unknown key"):
        validate_run({"name": "x", "data": {"retrieval": {"fraction": 0.5, "fractio": 1}}})


def test_packed_windows_hold_several_suite_prompts_each_with_its_answer(tiny_corpus):
    """min_prompt_len: prompts one after another (each task drawn anew, each closed by its answer, a newline and the
    end-of-text id), lengths between min_prompt_len and what is left, then text; a pure function of seed, step, row."""
    T, least = 1200, 300
    r = RetrievalSequences(tiny_corpus, 1.0, ["passkey", "niah"], "prose", T, seed=3, min_prompt_len=least)
    counts, lengths = [], []
    for step, row in ((0, 0), (1, 3), (7, 1), (9, 2)):
        w = r.window(step, row)
        assert w.shape == (T + 1,) and np.array_equal(w, r.window(step, row))
        ends = np.flatnonzero(w == tiny_corpus.eot_id)
        begin, n = 0, 0
        for end in ends:
            text = _text(tiny_corpus, w[begin:end])
            m = re.fullmatch(r"(.+)\n(.+)\n(.+) (\S+)\n", text, flags=re.S)
            if m is None:  # the text after the last prompt may hold an end-of-text id of its own
                break
            assert m.group(4) in m.group(2) and end + 1 - begin >= least - 20
            lengths.append(end + 1 - begin)
            begin, n = end + 1, n + 1
        assert T + 1 - begin < least or n >= 1
        counts.append(n)
    assert max(counts) >= 2 and min(lengths) < 2 * least


def test_min_prompt_len_too_short_for_a_prompt_is_an_error_before_training(tiny_corpus):
    with pytest.raises(ConfigError, match=r"data.retrieval: min_prompt_len 40 cannot hold a passkey prompt"):
        TrainBatches(tiny_corpus, {"prose": 1.0}, seq_len=T, batch_size=2, retrieval=_mix(tasks=["passkey"], min_prompt_len=40))
    with pytest.raises(ConfigError, match="data.retrieval.min_prompt_len"):
        validate_run({"name": "x", "data": {"retrieval": {"fraction": 0.5, "min_prompt_len": 0}}})
