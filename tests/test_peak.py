"""MFU's denominator (basecap.peak): the measurement that settles, the store in the data home, the nominal CPU
limit, the data-sheet figures of GPUs, and a step above the peak said as such."""

import json

import pytest
import torch

import basecap.peak as P
from basecap.config import validate_run
from basecap.peak import datasheet_flops, measure_until_stable, mfu_fields, mfu_text, nominal_cpu_limit, peak_flops
from basecap.train import train

FLOP = 2.0 * P.PEAK_MATMUL_SIZE**3  # one product of the default size


def _timer(seconds):
    """A fake product timer returning ``seconds`` in turn (after the two warm-ups, which it also serves)."""
    it = iter([1.0, 1.0, *seconds])
    return lambda a, b, out: next(it)


def test_the_measurement_stops_once_the_fastest_has_settled(monkeypatch):
    monkeypatch.setattr(P, "_operands", lambda *a: (None, None, None))
    # 0.5 s, then faster until 0.2 s, then 8 products no faster than 2% above it: stops after the 8th
    times = [0.5, 0.4, 0.3, 0.2, 0.21, 0.2, 0.199, 0.25, 0.3, 0.2, 0.2, 0.22] + [0.1] * 50
    m = measure_until_stable(torch.device("cpu"), min_products=5, patience=8, tol=0.02, timer=_timer(times))
    assert m["products"] == 12 and m["stable"]
    assert m["flops"] == pytest.approx(FLOP / 0.199)  # the fastest seen, not the median and not the 0.1 s that never ran
    assert m["median"] == pytest.approx((FLOP / 0.21 + FLOP / 0.22) / 2)  # the 6th and 7th fastest of 12


def test_a_product_that_keeps_getting_faster_restarts_the_count(monkeypatch):
    monkeypatch.setattr(P, "_operands", lambda *a: (None, None, None))
    times = [1.0 / (1.05 ** i) for i in range(20)] + [0.5] * 30  # 5% faster each time: never stable while it lasts
    m = measure_until_stable(torch.device("cpu"), min_products=5, patience=3, tol=0.02, timer=_timer(times))
    assert m["products"] == 23 and m["flops"] == pytest.approx(FLOP / min(times))


def test_an_unsettled_measurement_says_so(monkeypatch):
    monkeypatch.setattr(P, "_operands", lambda *a: (None, None, None))
    times = [1.0 / (1.1 ** i) for i in range(200)]
    m = measure_until_stable(torch.device("cpu"), min_products=5, patience=3, max_s=0.0, timer=_timer(times))
    assert m["products"] == 1 and not m["stable"]


def test_the_peak_is_measured_once_per_machine_and_thread_count_and_stored(monkeypatch, tmp_path):
    calls = []

    def fake(device, dtype):
        calls.append((torch.get_num_threads(), dtype))
        return {"flops": 1e11 * torch.get_num_threads(), "median": 9e10, "wall_flops": 8e10, "products": 12, "stable": True}

    monkeypatch.setattr(P, "measure_until_stable", fake)
    threads = torch.get_num_threads()
    cpu = torch.device("cpu")
    try:
        first = peak_flops(cpu, home=tmp_path)
        assert first["per_device"] == 1e11 * threads and len(calls) == 1
        stored = json.loads((tmp_path / "peak.json").read_text())
        key = f"{P.cpu_model()} (cpu, {threads} thread(s)), float32"
        assert list(stored) == [key] == [first["stored"]] and stored[key]["flops"] == 1e11 * threads
        assert "measured_at" in stored[key] and stored[key]["products"] == 12
        assert peak_flops(cpu, home=tmp_path) == first and len(calls) == 1  # read back, not measured again
        torch.set_num_threads(threads + 1)
        assert peak_flops(cpu, home=tmp_path)["per_device"] == 1e11 * (threads + 1) and len(calls) == 2  # its own entry
        torch.set_num_threads(threads)
        assert peak_flops(cpu, home=tmp_path) == first and len(calls) == 2  # both entries kept
        assert len(json.loads((tmp_path / "peak.json").read_text())) == 2
        peak_flops(cpu, home=tmp_path, refresh=True)
        assert len(calls) == 3
        stored = json.loads((tmp_path / "peak.json").read_text())
        del stored[key]["wall_flops"]  # an entry of the wall-time-only measurement is measured again
        (tmp_path / "peak.json").write_text(json.dumps(stored))
        peak_flops(cpu, home=tmp_path)
        assert len(calls) == 4
        (tmp_path / "peak.json").write_text("{not json")  # a damaged store is measured again, not an error
        assert peak_flops(cpu, home=tmp_path)["per_device"] == 1e11 * threads and len(calls) == 5
    finally:
        torch.set_num_threads(threads)


CPUINFO = [{"processor": str(i), "model name": "Some CPU", "cpu MHz": "2600.000", "physical id": "0", "core id": str(i),
            "flags": "fpu sse2 avx avx2 fma avx512f"} for i in range(2)]


def test_the_nominal_limit_is_cores_times_clock_times_lanes_times_fma():
    one = nominal_cpu_limit(1, CPUINFO)
    assert one["flops"] == pytest.approx(1 * 2.6e9 * 16 * 2 * 2)
    assert nominal_cpu_limit(2, CPUINFO)["flops"] == pytest.approx(2 * one["flops"])
    assert nominal_cpu_limit(8, CPUINFO)["flops"] == pytest.approx(2 * one["flops"])  # no more cores than there are
    avx2 = [dict(c, flags="sse2 avx avx2 fma") for c in CPUINFO]
    assert nominal_cpu_limit(1, avx2)["flops"] == pytest.approx(2.6e9 * 8 * 2 * 2)
    smt = [dict(c, **{"core id": "0"}) for c in CPUINFO]  # two hyperthreads of one core
    assert nominal_cpu_limit(2, smt)["flops"] == pytest.approx(one["flops"])
    assert nominal_cpu_limit(1, []) is None and nominal_cpu_limit(1, [{"model name": "x"}]) is None
    assert P.cpu_model(CPUINFO) == "Some CPU"


def test_gpus_take_the_data_sheet():
    assert datasheet_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert datasheet_flops("NVIDIA H100 PCIe", torch.bfloat16) == 756e12
    assert datasheet_flops("NVIDIA H200", torch.bfloat16) == 989e12
    assert datasheet_flops("NVIDIA A100-SXM4-80GB", torch.float32, tf32=False) == 19.5e12
    assert datasheet_flops("NVIDIA A100-SXM4-80GB", torch.float32, tf32=True) == 156e12
    assert datasheet_flops("Some Future GPU", torch.bfloat16) is None


def test_an_mfu_above_the_peak_is_said_not_printed():
    assert mfu_fields(0.42) == {"mfu": 0.42} and mfu_text(0.42) == "42%" and mfu_text(0.421, 1) == "42.1%"
    assert mfu_fields(1.0) == {"mfu": 1.0}
    assert mfu_fields(1.7) == {"mfu_above_peak": 1.7} and mfu_text(1.7) == "above peak"


def test_a_run_above_its_peak_records_no_mfu(tiny_corpus, tiny_recipe_path, tmp_path):
    cfg = validate_run({
        "name": "m", "seed": 0, "data": {"recipe": str(tiny_recipe_path), "train_weights": {"prose": 1.0}, "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 1, "max_seq_len": 32, "mixer": {"name": "attention", "head_dim": 8}},
        "train": {"steps": 3, "batch_size": 4, "warmup_steps": 1, "checkpoint_every": 100, "progress": False, "log_every": 1,
                  "peak_flops": 1.0},
        "eval": {"every": 100, "max_tokens": 256, "batch_size": 4},
    })
    lines = []
    train(cfg, tmp_path / "r", corpus=tiny_corpus, log=lines.append)
    steps = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "train"]
    assert steps and all("mfu" not in r and r["mfu_above_peak"] > 1 for r in steps)
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert "mfu" not in info["speed"] and info["speed"]["mfu_above_peak"] > 1
    assert any("MFU above peak" in x for x in lines) and not any("MFU 1" in x for x in lines)


def test_the_peak_command_prints_the_stored_figure(monkeypatch, tmp_path, capsys):
    from basecap.cli import main

    monkeypatch.setenv("BASECAP_HOME", str(tmp_path))
    monkeypatch.setattr(P, "measure_until_stable", lambda d, t: {"flops": 1.5e11, "median": 1e11, "wall_flops": 1e11, "products": 11, "stable": True})
    threads = torch.get_num_threads()
    try:
        assert main(["peak", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "1 thread(s): 150.0 GFLOP/s" in out and "fastest of 11 by wall or CPU time (stable" in out and str(tmp_path / "peak.json") in out


def test_a_product_counts_at_its_cpu_time_rate_when_the_scheduler_delayed_it(monkeypatch):
    """A product that took 1 s of wall time but 0.2 s of CPU on each of the threads ran at FLOP / 0.2 s while it
    ran: a shared machine's descheduled time does not lower the peak."""
    monkeypatch.setattr(P, "_operands", lambda *a: (None, None, None))
    threads = torch.get_num_threads()
    it = iter([(1.0, 1.0)] * 2 + [(1.0, 0.2 * threads)] * 3 + [(0.5, 0.9 * threads)] * 20)
    m = measure_until_stable(torch.device("cpu"), min_products=3, patience=3, timer=lambda a, b, out: next(it))
    assert m["flops"] == pytest.approx(FLOP / 0.2) and m["wall_flops"] == pytest.approx(FLOP / 0.5)
