"""MFU: the arithmetic, the matmul peak, what a training run records, and the train benchmark's figures."""

import json
import statistics
import time

import pytest
import torch

from basecap.config import validate_run
from basecap.peak import cpu_model, peak_path
from basecap.peak import matmul_peak_flops
from basecap.train import mfu, train


def test_mfu_arithmetic():
    # 1000 tokens/s x 3 MFLOP per token = 3 GFLOP/s, half of a 6 GFLOP/s peak
    assert mfu(1000.0, 3e6, 6e9) == pytest.approx(0.5)
    assert mfu(0.0, 3e6, 6e9) == 0.0
    assert mfu(2000.0, 3e6, 6e9) == pytest.approx(2 * mfu(1000.0, 3e6, 6e9))


def test_matmul_peak_is_measured_once_per_process_and_thread_count(monkeypatch):
    import basecap.peak as T

    monkeypatch.setattr(T, "_PEAKS", {})
    cpu = torch.device("cpu")
    calls = {"n": 0}
    mm = torch.mm

    def counting_mm(*a, **k):
        calls["n"] += 1
        return mm(*a, **k)

    monkeypatch.setattr(torch, "mm", counting_mm)
    peak = matmul_peak_flops(cpu, size=64, reps=3)
    assert peak > 0 and calls["n"] == 4  # one warm-up + 3 timed
    assert matmul_peak_flops(cpu, size=64, reps=3) == peak and calls["n"] == 4
    matmul_peak_flops(cpu, size=64, reps=3, cached=False)
    assert calls["n"] == 8
    matmul_peak_flops(cpu, size=64, reps=1)
    assert calls["n"] == 10
    assert matmul_peak_flops(cpu, size=64, reps=1, clock=time.process_time) > 0  # FLOPs per CPU-second: its own entry
    assert calls["n"] == 12


def _cfg(recipe, **train_over):
    return validate_run({
        "name": "m", "seed": 0,
        "data": {"recipe": str(recipe), "train_weights": {"prose": 1.0}, "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 2, "max_seq_len": 32, "mixer": {"name": "attention", "head_dim": 8}},
        "train": {"steps": 3, "batch_size": 4, "warmup_steps": 1, "checkpoint_every": 100, "progress": False, **train_over},
        "eval": {"every": 100, "max_tokens": 256, "batch_size": 4},
    })


def test_a_run_records_tokens_per_s_and_mfu_against_the_given_peak(tiny_corpus, tiny_recipe_path, tmp_path):
    train(_cfg(tiny_recipe_path, peak_flops=2e12), tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["peak_flops"] == {"per_device": 2e12, "source": "train.peak_flops"}
    steps = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "train"]
    assert len(steps) == 3
    for r in steps:
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * 3 * info["flops_per_token"] / 2e12, rel=1e-12)
    assert info["speed"] == {"steps": 2, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps[1:]),
                             "mfu": pytest.approx(statistics.median(r["mfu"] for r in steps[1:]), rel=1e-12)}


def test_a_run_without_a_peak_measures_one(tiny_corpus, tiny_recipe_path, tmp_path):
    train(_cfg(tiny_recipe_path, steps=1), tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["peak_flops"]["per_device"] > 0
    stored = json.loads(peak_path().read_text())[info["peak_flops"]["stored"]]  # the data home's measurement, not a probe of its own
    assert info["peak_flops"]["per_device"] == stored["flops"]
    assert info["peak_flops"]["source"].startswith(f"stored: {cpu_model()} (cpu, {torch.get_num_threads()} thread(s)), float32, 2048^3 matmul")
    assert 0 < info["speed"]["mfu"] == pytest.approx(
        info["speed"]["tokens_per_s"] * 3 * info["flops_per_token"] / info["peak_flops"]["per_device"])


def test_train_benchmark_reports_mfu(tiny_corpus, tiny_recipe_path, tmp_path):
    from basecap.bench.train import main

    res = main(["--recipe", str(tiny_recipe_path), "--d-model", "32", "--layers", "1", "--seq-len", "32", "--batch", "4",
                "--steps", "4", "--windows", "1", "--peak-size", "128", "--threads", "1", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "train.json").read_text()) == json.loads(json.dumps(res))
    assert len(res["probe_flops_windows"]) == 1 and res["probe_flops_windows"][0] > 0
    assert res["peak_flops"] == json.loads(peak_path().read_text())[f"{cpu_model()} (cpu, 1 thread(s)), float32"]["flops"]
    assert res["trainer_logged_mfu"] == pytest.approx(res["trainer_mfu"], rel=1e-9)  # one denominator for the trainer and the bench
    assert res["trainer_mfu"] == pytest.approx(res["trainer_tokens_per_s"] * res["train_flops_per_token"] / res["peak_flops"])
    assert res["trainer_flops_per_s"] == pytest.approx(res["trainer_tokens_per_s"] * res["train_flops_per_token"])
    assert res["plain_mfu"] > 0 and res["plain_cpu_mfu"] > 0 and res["trainer_logged_mfu"] > 0 and res["threads"] == 1
