"""The `decay` suite: per layer and head, the mean log decay a trained model applies per token, its half-life and the
share of tokens that keep 99% (Mixer.log_decay); a model without a per-token decay is refused by name."""

import math

import pytest
import torch
import torch.nn.functional as F

from basecap.config_base import ConfigError
from basecap.eval.decay import OPEN, head_summary
from basecap.eval.suites import Subject, run_suite
from basecap.model import LM, ModelConfig
from test_eval_suites import TinyCorpus


@pytest.fixture(scope="module")
def corpus():
    return TinyCorpus()


def subject(corpus, mixer):
    torch.manual_seed(0)
    model = LM(ModelConfig(vocab_size=corpus.vocab_size, d_model=32, n_layers=2, max_seq_len=32, mixer=mixer))
    return Subject(model=model.eval(), tokenizer=corpus.tokenizer, corpus=corpus, seq_len=32, name="tiny")


def test_head_summary_by_hand():
    g = torch.tensor([[[-0.1, -0.3, 0.0, -0.005]]])  # [B=1, H=1, T=4]
    (h,) = head_summary(g)
    mean = (-0.1 - 0.3 + 0.0 - 0.005) / 4
    assert h["mean_log_decay"] == pytest.approx(mean) and h["half_life"] == pytest.approx(math.log(0.5) / mean)
    assert h["open_share"] == pytest.approx(0.5)  # 0.0 and -0.005 keep at least 99%
    assert OPEN == pytest.approx(math.log(0.99))
    # per key channel [B, H, T, K]: every channel of every token counts
    (h,) = head_summary(torch.full((2, 1, 3, 4), -0.2))
    assert h["mean_log_decay"] == pytest.approx(-0.2)
    assert head_summary(torch.zeros(1, 1, 3))[0]["half_life"] == math.inf


def test_forgetting_attention_decay_is_its_forget_gate(corpus, tmp_path):
    sub = subject(corpus, {"name": "forgetting_attn", "head_dim": 8})
    res = run_suite(sub, "decay", out_dir=tmp_path, windows=2, batch_size=1)
    assert (tmp_path / "eval_decay.json").is_file()
    assert [lay["layer"] for lay in res["layers"]] == [0, 1] and res["tokens"] == 64 and res["domain"] == "prose"
    # the suite's numbers are the gate's own on the layer's input
    mixer = sub.model.blocks[0].mixer
    seen = {}
    hook = mixer.register_forward_hook(lambda m, inp, out: seen.setdefault("x", inp[0]))
    ids = torch.as_tensor(corpus.tokens("prose", "validation")[:64].astype("int64")).view(2, 32)
    with torch.no_grad():
        sub.model(ids)
    hook.remove()
    want = F.logsigmoid(mixer.f_proj(seen["x"]).float() + mixer.f_bias.float())  # [B, T, H]
    got = res["layers"][0]["heads"]
    assert [h["mean_log_decay"] for h in got] == pytest.approx(want.mean(dim=(0, 1)).tolist(), rel=1e-5)


def test_mamba2_decay_is_dt_times_a(corpus):
    sub = subject(corpus, {"name": "mamba2"})
    m = sub.model.blocks[0].mixer
    x = torch.randn(2, 5, 32)
    dt = F.softplus(m.in_proj(x)[..., -m.n_heads :] + m.dt_bias)
    assert torch.allclose(m.log_decay(x), (dt * -torch.exp(m.A_log)).transpose(1, 2))
    assert (m.log_decay(x) <= 0).all()


def test_a_model_without_a_decay_is_refused_by_name(corpus, tmp_path):
    with pytest.raises(ConfigError, match=r"decay: no layer's mixer \(Attention\) has a per-token decay"):
        run_suite(subject(corpus, {"name": "attention", "head_dim": 8}), "decay", out_dir=tmp_path)
