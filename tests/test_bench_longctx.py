"""``basecap bench longctx``: the CPU analogue of the paper's long-context speed row, at tiny lengths."""

from __future__ import annotations

import json
import math

import pytest
import torch

from basecap.bench import longctx

OPTS = {
    "d_model": 64,
    "layers": 1,
    "head_dim": 32,
    "vocab": 64,
    "chunk_len": 16,
    "reps": 2,
    "single_step_s": 60,
    "warmup_len": 16,
    "decode_tokens": 2,
    "mem_limit_gib": 16,
    "budget_s": 0,
    "threads": [1],
    "lengths": [64],
    "variants": ["transformer_pp", "top1_chunk_approx"],
}


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("variant", ["transformer_pp", "top1_chunk_approx"])
def test_one_measurement_of_each_kind(variant):
    T = 80
    train = longctx.measure({"variant": variant, "kind": "train", "T": T, "threads": 1, "options": OPTS})
    assert len(train["step_s_all"]) == 2 and train["step_s_min"] <= train["step_s_median"]
    assert train["tokens_per_s"] == pytest.approx(T / train["step_s_median"]) and train["peak_rss_growth_bytes"] >= 0
    dec = longctx.measure({"variant": variant, "kind": "decode", "T": T, "threads": 1, "options": OPTS})
    assert dec["decode_tokens_per_s"] == pytest.approx(1 / dec["decode_s_per_token_median"]) and dec["prefill_s"] > 0
    assert len(dec["decode_s_per_token_all"]) == 2 and dec["decode_s_per_token_min"] == min(dec["decode_s_per_token_all"])
    kv = 2 * 2 * 32 * 4  # k and v, 2 heads of 32, fp32, one layer
    sums = 2 * 32 * 8 * math.ceil(T / 16) / T if variant == "top1_chunk_approx" else 0  # Approx's float64 key sum per chunk
    assert dec["state_bytes_per_token"] == pytest.approx(kv + sums)
    one = longctx.measure({"variant": variant, "kind": "train", "T": T, "threads": 1, "options": {**OPTS, "single_step_s": 0}})
    assert one["reps"] == len(one["step_s_all"]) == 1  # a step over --single-step-s is not repeated


def _fake(spec, timeout):
    """Made-up timings: Transformer++ quadratic in T, Top-1 linear; Transformer++ training out of memory from 4096."""
    quad, T = spec["variant"] == "transformer_pp", spec["T"]
    if quad and spec["kind"] == "train" and T >= 4096 and spec["options"].get("oom"):
        return {"status": "out_of_memory", "reason": "made up"}
    step = 1e-6 * T * T if quad else 1e-4 * T
    if spec["kind"] == "train":
        return {"status": "ok", "step_s_min": step, "step_s_median": step, "step_s_all": [step], "tokens_per_s": T / step, "peak_rss_growth_bytes": T}
    return {
        "status": "ok",
        "prefill_s": step / 3,
        "decode_s_per_token_min": 1e-3,
        "decode_s_per_token_median": 1e-3 * (T / 1024 if quad else 1),
        "decode_tokens_per_s": 1e3 / (T / 1024 if quad else 1),
        "state_bytes": 4096 * T,
        "state_bytes_per_token": 4096,
        "held_rss_bytes_per_token": 4000,
        "peak_rss_growth_bytes": T,
    }


def test_no_length_is_dropped_silently_over_the_budget():
    o = {**OPTS, "lengths": [1024, 2048, 4096], "threads": [1, 2], "budget_s": 12}
    rows = longctx.run_grid(o, _fake, log=lambda *_: None)
    assert len(rows) == 2 * 3 * 2 * 2  # threads x T x kind x variant, each once
    by = {(r["threads"], r["T"], r["kind"], r["variant"]): r for r in rows}
    over = by[(1, 4096, "train", "transformer_pp")]  # even one step, 4.2 s x the FLOP ratio, is over the 12 s budget
    assert over["status"] == "over_budget" and over["predicted_s"] > 12 and "1 x 2048's step" in over["reason"]
    assert by[(1, 4096, "train", "top1_chunk_approx")]["status"] == "ok"
    assert by[(1, 4096, "decode", "transformer_pp")]["status"] == "ok"  # a forward fits where the training step did not
    rat = {(r["threads"], r["T"]): r for r in longctx.ratios(rows, "transformer_pp")}
    assert rat[(1, 2048)]["train_speedup"] == pytest.approx((1e-6 * 2048**2) / (1e-4 * 2048))
    assert rat[(1, 4096)]["train_speedup"] is None and rat[(1, 4096)]["decode_speedup"] == pytest.approx(4.0)
    res = {"analogue": longctx.ANALOGUE, "meta": _meta(o), "rows": rows, "ratios": list(rat.values())}
    table = longctx.markdown(res)
    assert "not run: over budget, predicted" in table and "| 2 | 4,096 |" in table and "20.48x" in table


def test_after_running_out_of_memory_the_longer_lengths_say_why_they_were_not_run():
    o = {**OPTS, "lengths": [1024, 4096, 8192], "oom": True}
    rows = longctx.run_grid(o, _fake, log=lambda *_: None)
    by = {(r["T"], r["kind"], r["variant"]): r for r in rows}
    assert by[(4096, "train", "transformer_pp")]["status"] == "out_of_memory"
    assert (by[(8192, "train", "transformer_pp")]["status"], by[(8192, "train", "transformer_pp")]["reason"]) == (
        "skipped",
        "out_of_memory at T=4096",
    )
    assert by[(8192, "decode", "transformer_pp")]["status"] == "ok"


def _meta(o):
    return {
        "device": "cpu",
        "reference": "transformer_pp",
        "model": {"d_model": 64, "layers": 1, "vocab": 64, "chunk_len": 16, "params": 1},
        "options": o,
        "command": "basecap bench longctx",
        "load_average_start": 0.0,
    }


def test_the_command_writes_its_json_and_table(tmp_path):
    argv = "--lengths 64 96 --threads 1 --d-model 64 --head-dim 32 --layers 1 --vocab 64 --chunk-len 16 --reps 1 --warmup-len 16"
    res = longctx.main([*argv.split(), "--decode-tokens", "2", "--in-process", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "speed.json").read_text())
    assert saved["schema"] == "basecap.bench.longctx/1" and saved["paper"]["claim"] == "speed_100k_top1_chunk"
    assert "CPU analogue" in saved["analogue"] and saved["meta"]["reference"] == "transformer_pp"
    assert [(r["T"], r["kind"], r["variant"], r["status"]) for r in saved["rows"]] == [
        (T, k, v, "ok") for T in (64, 96) for k in ("train", "decode") for v in ("transformer_pp", "top1_chunk_approx")
    ]
    assert all(r["train_speedup"] > 0 and r["decode_speedup"] > 0 for r in saved["ratios"]) and len(res["ratios"]) == 2
    assert all(r["flop_ratio"] > 1 for r in saved["ratios"])  # Transformer++'s attention term grows with T, Approx's by T / C
    table = (tmp_path / "speed.md").read_text()
    assert table.startswith("**CPU analogue") and table.count("| 1 | 64 |") == 2


def test_a_fresh_process_reports_running_out_of_memory():
    spec = {"variant": "transformer_pp", "kind": "train", "T": 4096, "threads": 1, "options": {**OPTS, "mem_limit_gib": 0.001}}
    res = longctx.run_child(spec, timeout=120)
    assert res["status"] == "out_of_memory" and "more than 0.001 GiB" in res["reason"]


def test_training_comes_first_and_the_shortest_predicted_measurement_next():
    calls = []
    o = {**OPTS, "lengths": [1024, 2048, 4096]}
    rows = longctx.run_grid(o, lambda spec, t: calls.append((spec["kind"], spec["variant"], spec["T"])) or _fake(spec, t), log=lambda *_: None)
    assert calls[:5] == [("train", "transformer_pp", 1024)] + [("train", "top1_chunk_approx", T) for T in (1024, 2048, 4096)] + [
        ("train", "transformer_pp", 2048)
    ]
    assert {k for k, _, _ in calls[6:]} == {"decode"}
    assert [(r["T"], r["kind"], r["variant"]) for r in rows] == [
        (T, k, v) for T in (1024, 2048, 4096) for k in ("train", "decode") for v in ("transformer_pp", "top1_chunk_approx")
    ]


def test_a_step_whose_repeats_would_not_fit_is_timed_once():
    seen = {}
    o = {**OPTS, "lengths": [1024, 2048, 4096], "budget_s": 20}
    rows = longctx.run_grid(
        o,
        lambda spec, t: seen.setdefault((spec["variant"], spec["T"], spec["kind"]), spec["options"]["reps"]) and _fake(spec, t),
        log=lambda *_: None,
    )
    assert seen[("transformer_pp", 2048, "train")] == 2 and seen[("transformer_pp", 4096, "train")] == 1  # 2 x 14.5 s > 20 s left
    assert all(r["status"] == "ok" for r in rows)
