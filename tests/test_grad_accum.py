"""Gradient accumulation is a memory knob only: micro-batches give the same training-loss sequence and the
same final weights as one big batch. In float64, so the comparison can be tight."""

import json

import pytest
import torch
from safetensors.torch import load_file

from basecap.checkpoint import latest_good_checkpoint
from basecap.config import validate_run
from basecap.train import train

STEPS = 6


def run_cfg(recipe, grad_accum):
    return validate_run({
        "name": "accum", "seed": 0,
        "data": {"recipe": str(recipe), "train_weights": {"prose": 1.0}, "seq_len": 16},
        "model": {"d_model": 16, "n_layers": 2, "max_seq_len": 16, "mixer": {"name": "attention", "head_dim": 8}},
        "train": {"steps": STEPS, "batch_size": 8, "grad_accum": grad_accum, "warmup_steps": 2, "checkpoint_every": STEPS,
                  "progress": False, "lr": 3e-3},
        "eval": {"every": STEPS, "max_tokens": 64, "batch_size": 4},
    })


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the model is built in float64
    yield
    torch.set_default_dtype(before)


def trained(cfg, run_dir, corpus):
    train(cfg, run_dir, corpus=corpus, log=lambda *_: None)
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ckpt = latest_good_checkpoint(run_dir / "checkpoints", log=lambda *_: None)
    weights = {k: v for f in sorted(ckpt.glob("*.safetensors")) for k, v in load_file(f).items()}
    return [r["loss"] for r in recs if r["kind"] == "train"], weights


@pytest.mark.parametrize("grad_accum", [2, 4])
def test_accumulation_gives_the_big_batch_losses_and_weights(grad_accum, tiny_corpus, tiny_recipe_path, tmp_path, float64):
    big_losses, big = trained(run_cfg(tiny_recipe_path, 1), tmp_path / "big", tiny_corpus)
    acc_losses, acc = trained(run_cfg(tiny_recipe_path, grad_accum), tmp_path / "acc", tiny_corpus)
    assert len(big_losses) == STEPS and big_losses[-1] < big_losses[0]
    assert acc_losses == pytest.approx(big_losses, rel=1e-12, abs=0)  # measured 1.5e-16
    assert set(acc) == set(big) and all(v.dtype == torch.float64 for v in big.values())
    moved = max(float((big[k] - acc[k]).abs().max()) for k in big)
    assert moved < 1e-12  # weights of size ~1: float64 rounding only (measured 2e-16 and 2e-15)
