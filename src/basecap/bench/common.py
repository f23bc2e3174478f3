"""Helpers shared by the benchmarks: timing (warm-up, then the median of repeats), peak memory
(CUDA allocator, or resident-set growth in a fresh process on CPU) and plotting."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch


def median_time(fn, reps: int = 3, warmup: int = 1, budget_s: float | None = None) -> float:
    """Median wall time of ``fn()`` in seconds after ``warmup`` calls; stops early past ``budget_s``."""
    for _ in range(warmup):
        fn()
    times, start = [], time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_memory_cuda(step, device: torch.device) -> int:
    """Growth of CUDA ``max_memory_allocated`` (bytes) during ``step()``."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) - base


def rss_kb(field: str) -> int:
    """A field of this process's ``/proc/self/status`` in kB (``VmRSS``, ``VmHWM``, ``VmSize``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_rss_growth(step) -> dict:
    """Peak resident-set growth (bytes) during ``step()`` in this process: Linux's high-water mark,
    reset through ``/proc/self/clear_refs``; where that is refused, ``ru_maxrss`` (then only a lower
    bound if the process had been larger before)."""
    base = rss_kb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        how, before = "VmHWM", None
    except OSError:
        how, before = "ru_maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step()
    peak = rss_kb("VmHWM") if how == "VmHWM" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_bytes": (peak - base) * 1024, "method": how, "lower_bound": before is not None and before > base}


def run_probe(module: str, spec: dict, threads: int) -> dict:
    """``python -m module --probe JSON`` in a fresh process; returns the JSON of its last output line.
    glibc's mmap threshold is pinned at 64 KiB there, so freed tensors leave the resident set at once
    and a high-water mark measures live memory rather than allocator history."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-m", module, "--probe", json.dumps(spec)], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fwd_bwd(module, x):
    def step():
        x.grad = None
        y, _ = module(x)
        y.sum().backward()

    return step


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (imported on first use: plotting is optional)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
