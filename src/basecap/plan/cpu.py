"""``basecap plan`` for the CPU it runs on (docs/scaling.md, "Planning for this CPU").

A run's time on a CPU is its training tokens over its training rate plus its evaluation tokens over its
evaluation rate. The evaluation is forward-only, so its rate is the training rate x training / forward FLOPs
per token (3x). Measured against 157 published runs' whole-run walls with each run's own training rate, this
accounts for the wall within -11% to +20% (median +2%): docs/scaling.md.

The training rate of a run (tokens/s at its thread count), from the first source that has one:

1. ``--mfu`` given: that MFU x this CPU's stored peak.
2. a calibration stored for this CPU, thread count and shape (``--calibrate`` measures it: a few optimizer steps
   of the run's own model at its batch and sequence length, eager, on random tokens), in the data home
   (``$BASECAP_HOME/plan_rates.json``); with ``--calibrate`` every shape is measured again.
3. published runs (``results/*/runs/*/run.json``, each with its median step rate ``speed`` and the stored peak its
   MFU was measured against): the median MFU of the runs of the same model and shape at the same thread count,
   else at another thread count, else of the same mixer at other shapes, else of every published CPU run; times
   this CPU's stored peak (``basecap peak``), over the run's training FLOPs per token.
4. nothing published: a calibration, as in 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from ..atomic import write_json
from ..config import RunConfig
from ..config_base import ConfigError
from ..peak import cpu_model, store_key
from .sizes import run_sizes

CALIBRATION_FILE = "plan_rates.json"
CALIBRATION_WARMUP = 2
CALIBRATION_STEPS = 5


def run_threads(rc: RunConfig) -> int:
    """The intra-op threads the trainer will use: ``train.threads``, else torch's default in this process."""
    return rc.train.threads or torch.get_num_threads()


def cpu_peak(threads: int, home=None, log=None) -> dict:
    """This CPU's stored fp32 peak at ``threads`` threads (``basecap peak``; measured and stored once if absent)."""
    from ..peak import peak_flops

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        p = peak_flops(torch.device("cpu"), torch.float32, home=home, log=log)
    finally:
        torch.set_num_threads(before)
    return {"flops": p["per_device"], "key": p["stored"], "source": p["source"]}


# ---- evaluations --------------------------------------------------------------------------------------------
def built_manifest(recipe: str, home=None) -> dict | None:
    """The manifest of ``recipe``'s corpus where one is built in the data home (the newest), else None."""
    from ..data import load_recipe
    from ..data.build import data_home

    try:
        name = load_recipe(recipe).name
    except (ConfigError, OSError, ValueError):
        return None
    built = sorted((data_home(home) / "corpora").glob(f"{name}-*/manifest.json"), key=lambda f: f.stat().st_mtime)
    for manifest in reversed(built):
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("domains"), dict):
            return data
    return None


def evaluation_tokens(rc: RunConfig, home=None) -> dict:
    """Forward tokens a run evaluates: every ``eval.every`` steps and at the last, once per cooldown branch (and per
    level fork, at most one a level), then the final test evaluation of ``basecap run``; each over every evaluation
    domain's windows (``min(eval.max_tokens, split tokens - 1) // seq_len`` windows of ``seq_len`` tokens). The split
    sizes and domains come from the recipe's corpus when it is built; otherwise every split counts at
    ``eval.max_tokens`` and the recipe's optional domains are left out. With ``eval.curve_max_tokens`` the main run's
    evaluations before its last step count at that size instead."""
    tr, T = rc.train, rc.data.seq_len
    main = tr.steps // rc.eval.every + (1 if tr.steps % rc.eval.every else 0)
    branches = len(tr.cooldowns) + len(tr.cooldown_levels)
    cap = rc.eval.max_tokens // T
    curve_cap = (rc.eval.curve_max_tokens or rc.eval.max_tokens) // T
    manifest = built_manifest(rc.data.recipe, home)
    if manifest is not None:
        info = manifest["domains"]
        domains = rc.data.eval_domains or list(info)

        def windows(d: str, split: str, at_most: int = cap) -> int:
            try:
                n = int(info[d]["splits"][split]["tokens"])
            except (KeyError, TypeError, ValueError):
                return at_most
            return min(at_most, max(n - 1, 0) // T)

        each = sum(windows(d, rc.eval.split) for d in domains) * T
        curve_each = sum(windows(d, rc.eval.split, curve_cap) for d in domains) * T
        final = sum(windows(d, "test") for d in domains) * T
        source = f"corpus {manifest.get('recipe_name', rc.data.recipe)} as built"
    else:
        from ..data import load_recipe

        try:
            recipe_domains = load_recipe(rc.data.recipe).domains
            domains = rc.data.eval_domains or [name for name, d in recipe_domains.items() if not d.optional]
        except (ConfigError, OSError, ValueError):
            domains = rc.data.eval_domains or []
        each = final = len(domains) * cap * T
        curve_each = len(domains) * curve_cap * T
        source = "recipe (corpus not built: every split counted at eval.max_tokens)"
    return {
        "evaluations": main + branches + 1,
        "eval_domains": len(domains),
        "eval_tokens_each": each,
        "curve_evaluations": main - 1 if curve_each != each else 0,
        "curve_eval_tokens_each": curve_each,
        "final_eval_tokens": final,
        "eval_tokens": (main - 1) * curve_each + (1 + branches) * each + final,
        "eval_source": source,
    }


# ---- published runs -----------------------------------------------------------------------------------------
def default_results_dirs(experiment: str | os.PathLike) -> list[Path]:
    """``results/`` of the nearest folder above the experiment file that has one, else ``./results``."""
    for parent in Path(experiment).resolve().parents:
        if (parent / "results").is_dir():
            return [parent / "results"]
    return [Path("results")] if Path("results").is_dir() else []


def _shape(model: dict, vocab: int, seq_len: int, batch: int, grad_accum: int, compile_: bool) -> str:
    """What decides a run's speed on one CPU besides its thread count: the model, vocabulary, batch and compile."""
    m = {k: v for k, v in model.items() if k != "vocab_size"}
    return json.dumps([m, vocab, seq_len, batch, grad_accum, bool(compile_)], sort_keys=True)


def run_shape(rc: RunConfig, vocab: int) -> str:
    return _shape(json.loads(rc.model.model_dump_json()), vocab, rc.data.seq_len, rc.train.batch_size, rc.train.grad_accum, rc.train.compile)


def published_runs(dirs: list[Path]) -> list[dict]:
    """Every published CPU run with a median step rate and a stored peak: ``{study, run_id, shape, mixer, threads,
    tokens_per_s, train_flops_per_token, peak, mfu}`` (a run copied into several studies counts once)."""
    out, seen = [], set()
    for d in dirs:
        for f in sorted(Path(d).glob("*/runs/*/run.json")):
            try:
                info = json.loads(f.read_text())
                cfg, speed, peak = info["config"], info.get("speed") or {}, info.get("peak_flops") or {}
                if (info.get("device") or {}).get("type") != "cpu" or not speed.get("tokens_per_s") or not peak.get("stored"):
                    continue
                tr = cfg["train"]
                row = {
                    "study": f.parents[2].name,
                    "run_id": info["run_id"],
                    "shape": _shape(cfg["model"], info["vocab_size"], cfg["data"]["seq_len"], tr["batch_size"], tr["grad_accum"], tr["compile"]),
                    "mixer": cfg["model"]["mixer"]["name"],
                    "threads": tr.get("threads") or (info.get("device") or {}).get("threads"),
                    "tokens_per_s": float(speed["tokens_per_s"]),
                    "train_flops_per_token": 3.0 * float(info["flops_per_token"]),
                    "peak": float(peak["per_device"]),
                }
            except (OSError, ValueError, KeyError, TypeError):
                continue
            key = (row["run_id"], row["tokens_per_s"])
            if key in seen:
                continue
            seen.add(key)
            row["mfu"] = row["tokens_per_s"] * row["train_flops_per_token"] / row["peak"]
            out.append(row)
    return out


def _from_published(pub: list[dict], shape: str, mixer: str, threads: int, train_fpt: float, peak: float) -> dict | None:
    tiers: list[tuple[str, str, Callable[[dict], bool]]] = [
        ("published", "this model and shape", lambda p: p["shape"] == shape and p["threads"] == threads),
        ("published", "this model and shape at another thread count", lambda p: p["shape"] == shape),
        ("published-mixer", f"mixer {mixer} at other shapes", lambda p: p["mixer"] == mixer and p["threads"] == threads),
        ("published-mixer", f"mixer {mixer} at other shapes and thread counts", lambda p: p["mixer"] == mixer),
        ("published-any", "every published CPU run, other mixers included", lambda p: True),
    ]
    for kind, what, pick in tiers:
        runs = [p for p in pub if pick(p)]
        if not runs:
            continue
        u = statistics.median(p["mfu"] for p in runs)
        studies = sorted({p["study"] for p in runs})
        rate = u * peak / train_fpt
        return {
            "kind": kind,
            "mfu": u,
            "tokens_per_s": rate,
            "runs": len(runs),
            "source": (
                f"{kind}: MFU {u:.3f}, the median of {len(runs)} published run(s) of {what} (results/{{{','.join(studies)}}}; "
                f"each run's median step rate over the peak stored where it trained), x this CPU's peak {peak / 1e9:.1f} GFLOP/s"
            ),
        }
    return None


# ---- calibration ------------------------------------------------------------------------------------------
def calibration_path(home=None) -> Path:
    from ..data.build import data_home

    return data_home(home) / CALIBRATION_FILE


def _calibration_key(cpu_key: str, shape: str) -> str:
    return f"{cpu_key} | {hashlib.sha256(shape.encode()).hexdigest()[:16]}"


def read_calibrations(home=None) -> dict:
    try:
        data = json.loads(calibration_path(home).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def measure_rate(rc: RunConfig, vocab: int, threads: int, warmup: int = CALIBRATION_WARMUP, steps: int = CALIBRATION_STEPS) -> dict:
    """Tokens/s of the run's own training step on this CPU: its model (eager, fp32), AdamW, gradient clipping, its
    batch (in ``grad_accum`` micro-batches) of random tokens at its ``seq_len``; the median of ``steps`` steps after
    ``warmup``."""
    from ..model import LM
    from ..optim import make_optimizer, optimizer_step

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = LM(rc.model.model_copy(update={"vocab_size": vocab}))
        model.train()
        opt = make_optimizer(model, rc.train)
        T, tr = rc.data.seq_len, rc.train
        micro = max(1, tr.batch_size // tr.grad_accum)
        x = torch.randint(vocab, (micro, T))
        y = torch.randint(vocab, (micro, T))
        times = []
        for _ in range(warmup + steps):
            t = time.perf_counter()
            optimizer_step(model, opt, [(x, y)] * tr.grad_accum, lr=tr.lr, loss_fn=lambda a, b: model(a, targets=b)[0], grad_clip=tr.grad_clip)
            times.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(before)
    step = statistics.median(times[warmup:])
    return {
        "tokens_per_s": micro * tr.grad_accum * T / step,
        "step_s": step,
        "steps": steps,
        "threads": threads,
        "eager": True,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def _calibrated(entry: dict) -> dict:
    load = f", load average {entry['load_average']:.1f}" if entry.get("load_average") is not None else ""
    return {
        "kind": "measured",
        "tokens_per_s": entry["tokens_per_s"],
        "source": (
            f"measured: this run's model and batch on this CPU (eager, median of {entry['steps']} optimizer steps, "
            f"{entry['step_s']:.3g} s each), {entry['measured_at']}{load}; stored in the data home"
        ),
    }


class CpuRates:
    """The training rates of one plan's runs on this CPU: the peak per thread count and the published runs are read
    once, and with ``calibrate`` each distinct shape is measured once (module docstring: the order of sources)."""

    def __init__(
        self,
        results: list[Path],
        peak_flops: float | None = None,
        mfu: float | None = None,
        calibrate: bool = False,
        home=None,
        log: Callable[[str], None] | None = None,
    ):
        self.published = published_runs(results)
        self.peak_flops, self.mfu, self.calibrate, self.home, self.log = peak_flops, mfu, calibrate, home, log
        self._peaks: dict[int, dict] = {}
        self._measured: dict[str, dict] = {}

    def peak(self, threads: int) -> dict:
        if threads not in self._peaks:
            if self.peak_flops is None:
                self._peaks[threads] = cpu_peak(threads, self.home, self.log)
            else:
                key = store_key(torch.device("cpu"), torch.float32, threads, cpu_model())
                self._peaks[threads] = {"flops": self.peak_flops, "key": key, "source": f"given: {self.peak_flops / 1e9:.1f} GFLOP/s"}
        return self._peaks[threads]

    def rate(self, rc: RunConfig, vocab: int, train_fpt: float, threads: int) -> dict:
        """The run's training tokens/s at ``threads`` threads and where it comes from."""
        peak = self.peak(threads)
        if self.mfu is not None:
            return {
                "kind": "given",
                "mfu": self.mfu,
                "tokens_per_s": self.mfu * peak["flops"] / train_fpt,
                "source": f"given: MFU {self.mfu:.3f} x this CPU's peak",
            }
        shape = run_shape(rc, vocab)
        key = _calibration_key(peak["key"], shape)
        if key in self._measured:
            return _calibrated(self._measured[key])
        stored = read_calibrations(self.home).get(key)
        if stored is not None and not self.calibrate:
            return _calibrated(stored)
        if not self.calibrate:
            found = _from_published(self.published, shape, rc.model.mixer.name, threads, train_fpt, peak["flops"])
            if found is not None:
                return found
        if self.log:
            self.log(f"plan: measuring {rc.name}'s training rate on this CPU ({threads} thread(s); stored for the next plan)")
        entry = measure_rate(rc, vocab, threads)
        self._measured[key] = entry
        store = read_calibrations(self.home)  # read again: another process may have stored other entries meanwhile
        store[key] = entry
        path = calibration_path(self.home)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, store)
        return _calibrated(entry)


def plan_run_cpu(rc: RunConfig, rates: CpuRates, seeds: int = 1) -> dict:
    """One run on this CPU: its training tokens at its measured or published training rate, plus its evaluations
    (forward only: the rate x training / forward FLOPs per token), at its thread count (the module docstring: where the rate comes from)."""
    _, row = run_sizes(rc)
    threads = run_threads(rc)
    peak = rates.peak(threads)
    rate = rates.rate(rc, row["vocab_size"], row["train_flops_per_token"], threads)
    ev = evaluation_tokens(rc, rates.home)
    train_s = row["total_tokens"] / rate["tokens_per_s"]
    eval_rate = rate["tokens_per_s"] * row["train_flops_per_token"] / row["fwd_flops_per_token"]
    eval_s = ev["eval_tokens"] / eval_rate
    issues = []
    if rc.train.compile:
        issues.append("train.compile: the compiler's warm-up (a minute to several, once per process) is not counted")
    return {
        **row,
        "seeds": seeds,
        "device": "cpu",
        "cpu": cpu_model(),
        "threads": threads,
        "peak_flops": peak["flops"],
        "peak_source": peak["source"],
        "tokens_per_s": rate["tokens_per_s"],
        "rate_kind": rate["kind"],
        "rate_source": rate["source"],
        **ev,
        "eval_tokens_per_s": eval_rate,
        "train_seconds": train_s,
        "eval_seconds": eval_s,
        "est_hours": (train_s + eval_s) / 3600,
        "issues": issues,
    }
