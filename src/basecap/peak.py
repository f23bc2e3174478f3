"""The peak FLOP/s that MFU is measured against (docs/performance.md, "The peak").

CPU: a careful matmul measurement, made once per machine (its CPU model), dtype and thread count and stored
in the data home (``$BASECAP_HOME/peak.json``): square products are timed one by one until the fastest has
not improved by more than ``STABLE_TOL`` over ``PATIENCE`` products in a row (at least ``MIN_PRODUCTS``, at
most ``MAX_S`` seconds). Each product counts at the faster of its wall-clock rate and its rate per CPU-second
times the thread count: a thread the scheduler sets aside accrues no CPU time, so on a machine shared with
other jobs the second stays near the hardware's figure where the first falls (at load 8 on 2 cores: 17
against 145 GFLOP/s at 2 threads, 175 on the idle machine). Every run and benchmark reads the stored figure, so one busy moment at a run's
start no longer sets every MFU it reports; ``basecap peak --refresh`` measures again. Beside it, where
``/proc/cpuinfo`` tells, the CPU's nominal limit: cores x clock x fp32 lanes x 2 FMA units x 2 FLOP.

CUDA: the data sheet's dense peak of the device for the dtype (``DATASHEET``); a device not in the table is
measured like a CPU (bf16 under autocast) and cached the same way.

A step whose model FLOP/s exceed the peak has no meaningful MFU: its record carries ``mfu_above_peak``
instead of ``mfu`` and the progress bar says so (``mfu_fields``, ``mfu_text``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from .atomic import write_json

PEAK_FILE = "peak.json"
PEAK_MATMUL_SIZE = 2048  # 17 GFLOP per product: about 0.1-0.2 s on one core of a recent x86 CPU
MIN_PRODUCTS = 10
PATIENCE = 8
STABLE_TOL = 0.02
MAX_S = 60.0
FMA_UNITS = 2  # not readable from /proc/cpuinfo; 2 on recent x86 server cores, so the nominal figure is an upper bound

# dense (no sparsity) data-sheet peaks, TFLOP/s, by a substring of torch.cuda.get_device_name; first match wins
DATASHEET: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bf16": 756, "tf32": 378, "fp32": 51}),
    ("H100 NVL", {"bf16": 835, "tf32": 418, "fp32": 60}),
    ("GH200", {"bf16": 989, "tf32": 495, "fp32": 67}),
    ("H200", {"bf16": 989, "tf32": 495, "fp32": 67}),
    ("H100", {"bf16": 989, "tf32": 495, "fp32": 67}),  # SXM
    ("A100", {"bf16": 312, "tf32": 156, "fp32": 19.5}),
    ("L40S", {"bf16": 362, "tf32": 183, "fp32": 91.6}),
    ("L4", {"bf16": 121, "tf32": 60, "fp32": 30.3}),
    ("A10", {"bf16": 125, "tf32": 62.5, "fp32": 31.2}),
]

_PEAKS: dict[tuple, float] = {}


def matmul_peak_flops(
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    size: int = PEAK_MATMUL_SIZE,
    reps: int = 3,
    cached: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """A quick probe: FLOP/s (2 size^3 per product) of a square ``size`` matmul in ``dtype`` on ``device`` at the
    current thread count, the fastest of ``reps`` after one warm-up. ``clock=time.process_time`` gives FLOPs per
    CPU-second of this process instead (CPU only). Cached per process unless ``cached`` is False. MFU's
    denominator is ``peak_flops`` (careful, stored); ``basecap bench train`` shows this probe beside it."""
    key = (str(device), dtype, size, reps, torch.get_num_threads(), clock)
    if key not in _PEAKS or not cached:
        a, b, out = _operands(device, dtype, size)
        times = [_time_product(a, b, out, clock) for _ in range(reps + 1)][1:]
        _PEAKS[key] = 2.0 * size**3 / min(times)
    return _PEAKS[key]


def _operands(device, dtype, size):
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, device=device, generator=g).to(dtype) for _ in range(2))
    return a, b, torch.empty_like(a)


def _time_product(a, b, out, clock=time.perf_counter) -> float:
    if a.is_cuda:
        torch.cuda.synchronize(a.device)
    t = clock()
    torch.mm(a, b, out=out)
    if a.is_cuda:
        torch.cuda.synchronize(a.device)
    return clock() - t


def _wall_and_cpu(a, b, out) -> tuple[float, float | None]:
    """Wall seconds and (CPU only) process CPU seconds of one product."""
    if a.is_cuda:
        return _time_product(a, b, out), None
    w, c = time.perf_counter(), time.process_time()
    torch.mm(a, b, out=out)
    return time.perf_counter() - w, time.process_time() - c


def measure_until_stable(
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    size: int = PEAK_MATMUL_SIZE,
    min_products: int = MIN_PRODUCTS,
    patience: int = PATIENCE,
    tol: float = STABLE_TOL,
    *,
    max_s: float = MAX_S,
    timer: Callable | None = None,
) -> dict:
    """Time square products one by one (after two warm-ups) until the fastest has not improved by more than
    ``tol`` over ``patience`` products in a row, with at least ``min_products``, stopping after ``max_s``
    seconds. A product's rate is the faster of 2 size^3 / wall seconds and 2 size^3 x threads / CPU seconds.
    Returns the fastest rate (``flops``), the median, the fastest wall-clock rate alone (``wall_flops``), the
    count and whether it settled (``stable``). ``timer(a, b, out)`` gives (wall, CPU or None) seconds of one
    product, or wall seconds alone (tests pass a fake)."""
    a, b, out = _operands(device, dtype, size)
    timer = timer or _wall_and_cpu
    threads = torch.get_num_threads()
    for _ in range(2):
        timer(a, b, out)
    rates, walls, best, since, start = [], [], 0.0, 0, time.perf_counter()
    stable = False
    while True:
        wall, cpu = _pair(timer(a, b, out))
        walls.append(2.0 * size**3 / max(wall, 1e-12))
        rate = max(walls[-1], 2.0 * size**3 * threads / max(cpu, 1e-12) if cpu else 0.0)
        rates.append(rate)
        since = 0 if rate > best * (1 + tol) else since + 1
        best = max(best, rate)
        if len(rates) >= min_products and since >= patience:
            stable = True
            break
        if time.perf_counter() - start > max_s:
            break
    return {"flops": best, "median": statistics.median(rates), "wall_flops": max(walls), "products": len(rates), "stable": stable}


def _pair(t) -> tuple[float, float | None]:
    return (t[0], t[1]) if isinstance(t, tuple) else (t, None)


# ---- the machine ----------------------------------------------------------------------------------------
def _cpuinfo(path: str | Path = "/proc/cpuinfo") -> list[dict[str, str]]:
    """One dict per logical CPU of /proc/cpuinfo ([] where there is none)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    cpus = []
    for block in text.strip().split("\n\n"):
        entry = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                entry[key.strip()] = value.strip()
        if entry:
            cpus.append(entry)
    return cpus


def cpu_model(cpuinfo: list[dict[str, str]] | None = None) -> str:
    cpus = _cpuinfo() if cpuinfo is None else cpuinfo
    name = next((c["model name"] for c in cpus if "model name" in c), None)
    return name or platform.processor() or platform.machine() or "unknown CPU"


def nominal_cpu_limit(threads: int, cpuinfo: list[dict[str, str]] | None = None) -> dict | None:
    """The CPU's fp32 FLOP/s limit for ``threads`` threads: physical cores in use x clock x fp32 SIMD lanes
    x ``FMA_UNITS`` x 2 (an FMA is two FLOPs), from /proc/cpuinfo; None where it does not tell. The clock is
    the one /proc/cpuinfo reports (under a hypervisor often the base clock, so turbo can beat the figure)."""
    cpus = _cpuinfo() if cpuinfo is None else cpuinfo
    if not cpus or "cpu MHz" not in cpus[0]:
        return None
    flags = set(cpus[0].get("flags", cpus[0].get("Features", "")).split())
    lanes = 16 if "avx512f" in flags else 8 if ("avx2" in flags or "avx" in flags) else 4 if flags & {"sse2", "asimd"} else None
    if lanes is None:
        return None
    cores = len({(c.get("physical id"), c.get("core id")) for c in cpus}) if "core id" in cpus[0] else len(cpus)
    used = max(1, min(threads, cores))
    ghz = float(cpus[0]["cpu MHz"]) / 1e3
    flops = used * ghz * 1e9 * lanes * FMA_UNITS * 2
    return {"flops": flops, "text": f"{used} core(s) x {ghz:.2f} GHz x {lanes} fp32 lanes x {FMA_UNITS} FMA units x 2 = {flops / 1e9:.0f} GFLOP/s"}


def datasheet_flops(device_name: str, dtype: torch.dtype, tf32: bool | None = None) -> float | None:
    """FLOP/s of the data sheet for a CUDA device and the training dtype; None for a device not in the table."""
    if tf32 is None:
        tf32 = torch.backends.cuda.matmul.allow_tf32
    kind = "bf16" if dtype in (torch.bfloat16, torch.float16) else "tf32" if tf32 else "fp32"
    for pattern, spec in DATASHEET:
        if pattern in device_name:
            return spec[kind] * 1e12
    return None


# ---- the store --------------------------------------------------------------------------------------------
def peak_path(home: str | os.PathLike | None = None) -> Path:
    from .data.build import data_home

    return data_home(home) / PEAK_FILE


def store_key(device: torch.device, dtype: torch.dtype, threads: int, machine: str) -> str:
    """The key of a stored peak: the machine (on a CPU, with its thread count) and the dtype."""
    where = f"{machine} ({device.type}, {threads} thread(s))" if device.type == "cpu" else machine
    return f"{where}, {str(dtype).removeprefix('torch.')}"


def read_store(home=None) -> dict:
    try:
        data = json.loads(peak_path(home).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def peak_flops(device: torch.device, dtype: torch.dtype = torch.float32, refresh: bool = False, home=None, log=None) -> dict:
    """MFU's denominator for one device: ``{"per_device", "source", ...}``. CUDA devices in ``DATASHEET`` take
    its figure; everything else the stored measurement for this machine, dtype and thread count, measured
    (``measure_until_stable``) and stored when there is none or ``refresh`` is set."""
    threads = torch.get_num_threads()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        sheet = datasheet_flops(name, dtype)
        if sheet is not None:
            return {"per_device": sheet, "source": f"data sheet: {name}, {str(dtype).removeprefix('torch.')} dense"}
        machine = name
    else:
        machine = cpu_model()
    key = store_key(device, dtype, threads, machine)
    entry = None if refresh else read_store(home).get(key)
    if entry is None or "wall_flops" not in entry:  # none yet, or measured by wall time alone (before CPU-time rates)
        if log:
            log(f"measuring the peak FLOP/s of {key} (once per machine; basecap peak --refresh measures again)")
        m = measure_until_stable(device, dtype)
        entry = {
            "flops": m["flops"],
            "median": m["median"],
            "wall_flops": m.get("wall_flops"),
            "products": m["products"],
            "stable": m["stable"],
            "size": PEAK_MATMUL_SIZE,
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        }
        if device.type == "cpu":
            entry["nominal"] = nominal_cpu_limit(threads)
        store = read_store(home)  # read again: another process may have stored other entries meanwhile
        store[key] = entry
        path = peak_path(home)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, store)
    return {"per_device": entry["flops"], "source": _source(key, entry), "stored": key}


def _source(key: str, entry: dict) -> str:
    settled = "stable" if entry.get("stable") else "NOT stable (time limit)"
    load = f", load average {entry['load_average']:.1f}" if entry.get("load_average") is not None else ""
    text = (
        f"stored: {key}, {entry['size']}^3 matmul, fastest of {entry['products']} by wall or CPU time ({settled}; median "
        f"{entry['median'] / 1e9:.1f} GFLOP/s), measured {entry['measured_at']}{load}"
    )
    nominal = entry.get("nominal")
    if nominal:
        text += f"; nominal limit {nominal['text']}"
    return text


# ---- MFU above the peak ---------------------------------------------------------------------------------------
def mfu_fields(util: float) -> dict:
    """A step's MFU as a metrics record holds it: ``{"mfu": u}``, or ``{"mfu_above_peak": u}`` when u > 1 (the
    step was timed wrong, or the stored peak is too low: ``basecap peak --refresh``)."""
    return {"mfu": util} if util <= 1.0 else {"mfu_above_peak": util}


def mfu_text(util: float, digits: int = 0) -> str:
    return f"{100 * util:.{digits}f}%" if util <= 1.0 else "above peak"
