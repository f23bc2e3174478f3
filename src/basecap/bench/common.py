"""Timing helpers shared by the benchmarks: warm-up, then the median of repeats."""

from __future__ import annotations

import statistics
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


def fwd_bwd(module, x):
    def step():
        x.grad = None
        y, _ = module(x)
        y.sum().backward()
    return step


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))
