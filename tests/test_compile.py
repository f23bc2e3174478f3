"""train.compile: compiled training equals eager within tolerance, resumes exactly, leaves evaluation and the
state dict as they are; a mixer that does not compile is refused when the config is checked."""

import json

import pytest
import torch

from basecap.compile import check_compile, compile_blockers, compile_for_training, is_compiled
from basecap.config import validate_run
from basecap.config_base import ConfigError
from basecap.mixers import mixer_class, mixer_names
from basecap.model import build_model
from basecap.train import train


def _cfg(recipe, mixer="attention", steps=4, **train_over):
    return validate_run({
        "name": "c", "seed": 0,
        "data": {"recipe": str(recipe), "train_weights": {"prose": 1.0}, "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 1, "max_seq_len": 32, "mixer": {"name": mixer, "head_dim": 8}},
        "train": {"steps": steps, "batch_size": 4, "warmup_steps": 1, "min_lr_ratio": 1.0, "checkpoint_every": 2,
                  "progress": False, "lr": 3e-3, "peak_flops": 1e15, **train_over},
        "eval": {"every": 100, "max_tokens": 512, "batch_size": 4},
    })


def _losses(run_dir):
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if r["kind"] == "train"], [r for r in recs if r["kind"] == "eval"]


def test_every_mixer_says_whether_it_compiles():
    for name in mixer_names():
        ok = mixer_class(name).compiles
        assert ok is True or (isinstance(ok, str) and ok), name


def test_a_mixer_that_does_not_compile_is_refused_at_config_time(monkeypatch, tiny_recipe_path):
    cls = mixer_class("attention")
    monkeypatch.setattr(cls, "compiles", "a data-dependent Python loop")
    cfg = _cfg(tiny_recipe_path, compile=True)
    assert compile_blockers(cfg.model) == ["attention: a data-dependent Python loop"]
    with pytest.raises(ConfigError, match="train.compile: .*attention: a data-dependent Python loop"):
        check_compile(cfg)
    check_compile(_cfg(tiny_recipe_path, compile=False))  # off: nothing to refuse


def test_an_experiment_with_such_a_mixer_fails_before_training(monkeypatch, tmp_path, tiny_recipe_path):
    from basecap.experiment import resolve_experiment

    monkeypatch.setattr(mixer_class("attention"), "compiles", "not today")
    exp = tmp_path / "e.toml"
    exp.write_text(f"""
name = "e"
seeds = [0]
[data]
recipe = "{tiny_recipe_path}"
train_weights = {{prose = 1.0}}
seq_len = 32
[model]
d_model = 32
n_layers = 1
max_seq_len = 32
mixer = {{name = "attention", head_dim = 8}}
[train]
steps = 2
warmup_steps = 1
batch_size = 4
compile = true
[[runs]]
name = "a"
""")
    with pytest.raises(ConfigError, match="not today"):
        resolve_experiment(exp)


def test_only_training_calls_are_compiled_and_the_state_dict_keeps_its_keys(tiny_recipe_path):
    torch.manual_seed(0)
    model = build_model(_cfg(tiny_recipe_path).model, 64)
    keys = list(model.state_dict())
    calls = []
    compile_for_training(model, _cfg(tiny_recipe_path, compile=True), log=calls.append)
    assert is_compiled(model) and list(model.state_dict()) == keys and "torch.compile" in calls[0]
    model.eval()
    x = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        loss, _ = model(x, targets=x)  # eager: no compilation for evaluation shapes
    assert torch.isfinite(loss)
    plain = build_model(_cfg(tiny_recipe_path).model, 64)
    assert compile_for_training(plain, _cfg(tiny_recipe_path), log=calls.append) is plain and not is_compiled(plain)


def test_compiled_training_matches_eager_and_resumes_exactly(tiny_corpus, tiny_recipe_path, tmp_path):
    quiet = lambda *_: None  # noqa: E731
    train(_cfg(tiny_recipe_path), tmp_path / "eager", corpus=tiny_corpus, log=quiet)
    train(_cfg(tiny_recipe_path, compile=True), tmp_path / "compiled", corpus=tiny_corpus, log=quiet)
    eager, eager_ev = _losses(tmp_path / "eager")
    compiled, compiled_ev = _losses(tmp_path / "compiled")
    assert len(compiled) == 4
    assert compiled == pytest.approx(eager, rel=1e-5)  # the same sums, fused in another order
    for a, b in zip(compiled_ev, eager_ev):
        assert a["in_domain_loss"] == pytest.approx(b["in_domain_loss"], rel=1e-5)
    # stopped after its step-2 checkpoint, resumed
    train(_cfg(tiny_recipe_path, compile=True), tmp_path / "resumed", corpus=tiny_corpus, log=quiet, stop_at=2)
    msgs = []
    train(_cfg(tiny_recipe_path, compile=True), tmp_path / "resumed", corpus=tiny_corpus, log=msgs.append)
    assert any("resuming from step_00000002" in m for m in msgs)
    assert _losses(tmp_path / "resumed")[0] == compiled  # exact, every step


def test_the_train_benchmark_compares_compiled_and_eager_steps(tiny_recipe_path, tmp_path, capsys):
    from basecap.bench.train import main

    res = main(["--recipe", str(tiny_recipe_path), "--d-model", "32", "--layers", "1", "--seq-len", "32", "--batch", "4",
                "--steps", "4", "--windows", "1", "--peak-size", "128", "--threads", "1", "--compile", "--out", str(tmp_path)])
    c = res["compile"]
    assert c["eager_tokens_per_s"] > 0 and c["compiled_tokens_per_s"] > 0 and c["speedup"] > 0 and c["speedup_cpu"] > 0
    assert len(c["warmup_s"]) == 1 and c["warmup_s"][0] > 0  # the first compiled step compiles
    assert c["loss_max_rel_err"] < 1e-5
    assert "train.compile" in capsys.readouterr().out
