"""The long-context study (experiments/paper/longctx_cpu.toml) and the retrieval suites' ``factors`` option."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from basecap.config_base import ConfigError
from basecap.eval.suites import Subject, run_suite
from basecap.experiment import resolve_experiment
from basecap.model import LM, ModelConfig

STUDY = Path(__file__).resolve().parents[1] / "experiments/paper/longctx_cpu.toml"


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _subject(corpus, seq_len: int) -> Subject:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=corpus.vocab_size, d_model=32, n_layers=1, max_seq_len=seq_len, mixer={"name": "attention", "head_dim": 8})
    return Subject(model=LM(cfg).eval(), tokenizer=corpus.tokenizer, corpus=corpus, seq_len=seq_len, name="tiny")


def test_the_study_trains_at_1k_with_retrieval_prompts_and_tests_at_1_to_16x():
    exp, runs = resolve_experiment(STUDY, [])
    design_1, design_2 = {"transformer_pp", "top1_chunk", "mamba2"}, {"transformer_pp_packed", "top1_chunk_packed"}
    assert {rc.name for rc in runs} == design_1 | design_2 and exp.reference == "transformer_pp"
    for rc in runs:
        assert rc.data.seq_len == rc.model.max_seq_len == 1024 and (rc.model.d_model, rc.model.n_layers) == (128, 4)
        assert rc.data.retrieval is not None and rc.data.retrieval.tasks == ["passkey", "niah"]
        # design 2 packs several prompts into each retrieval window; design 1 fills a window with one
        assert rc.data.retrieval.min_prompt_len == (160 if rc.name in design_2 else None)
    for name in ("top1_chunk", "top1_chunk_packed"):
        top1 = next(rc for rc in runs if rc.name == name).model.mixer
        assert (top1.selection, top1.own_chunk, top1.chunk_len) == ("approx", "candidate", 1024 // 16)
    suites = {s["suite"]: s for s in exp.suites}
    assert suites["passkey"]["factors"] == suites["niah"]["factors"] == [1, 4, 8, 16]
    assert suites["extrapolation"]["factor"] == 16


def test_the_studys_suite_options_run(tiny_corpus, tmp_path):
    """Every option of the study's suites is accepted and runs (a tiny model, fewer prompts and lengths), so a typo
    fails here rather than after a run has trained."""
    exp, _ = resolve_experiment(STUDY, [])
    s = _subject(tiny_corpus, 100)
    for spec in exp.suites:
        options = {k: v for k, v in spec.items() if k != "suite"}
        if "samples" in options:
            options |= {"depths": [0.5], "samples": 1, "factors": options["factors"][:2]}
        else:
            options |= {"factor": 4}
        res = run_suite(s, spec["suite"], out_dir=tmp_path, **options)
        if "factors" in options:  # lengths are multiples of the training context; 100 tokens cannot hold a prompt
            assert res["lengths"] == [100, 400] and list(res["skipped_lengths"]) == ["100"]
            assert res["accuracy_by_length"]["400"] is not None
        else:
            assert res["length"] == 400


def test_factors_and_lengths_are_exclusive_and_factors_positive(tiny_corpus, tmp_path):
    s = _subject(tiny_corpus, 100)
    with pytest.raises(ConfigError, match="passkey: give lengths or factors, not both"):
        run_suite(s, "passkey", out_dir=tmp_path, lengths=[400], factors=[4])
    for bad in ([], [0], [-1], [True], ["4"]):
        with pytest.raises(ConfigError, match="niah: factors must be positive numbers"):
            run_suite(s, "niah", out_dir=tmp_path, factors=bad)
    res = run_suite(s, "passkey", out_dir=tmp_path, factors=[3.5], depths=[0.0], samples=1)
    assert res["lengths"] == [350]
