"""``basecap plan EXPERIMENT``: size every run of an experiment before launching it, on this CPU or on GPUs.

On a machine without CUDA and without ``--gpus``/``--gpu-type``, the plan is for this CPU: each run's training
and evaluation tokens over a measured or published training rate (``plan_cpu``; docs/scaling.md). For GPUs, each run's model is built on the meta device (no memory, no compute) and read for parameter counts
and FLOPs per token; memory per GPU and wall time follow from the formulas in docs/scaling.md:
model states (fp32 weights, gradients and AdamW moments: 16 bytes/param, sharded over the GPUs with
FSDP), communication buffers, activations of one micro-batch under bf16 autocast, and a fixed reserve;
time = training FLOPs / (GPUs x peak bf16 FLOP/s x MFU).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from .config import RunConfig, load_experiment
from .cooldown import total_branch_steps
from .config_base import ConfigError
from .peak import cpu_model
from .plan_cpu import CpuRates, default_results_dirs, evaluation_tokens, run_threads

if TYPE_CHECKING:
    from .mixers.base import Mixer

# dense bf16 peak (TFLOP/s, no sparsity) and memory (GiB) per GPU
GPUS: dict[str, dict[str, float]] = {
    "A100-40GB": {"tflops": 312, "mem_gib": 40},
    "A100-80GB": {"tflops": 312, "mem_gib": 80},
    "H100-80GB": {"tflops": 989, "mem_gib": 80},
    "H200-141GB": {"tflops": 989, "mem_gib": 141},
    "L40S-48GB": {"tflops": 362, "mem_gib": 48},
}
GPU_ALIASES = {"A100": "A100-80GB", "H100": "H100-80GB", "H200": "H200-141GB", "L40S": "L40S-48GB"}

MODEL_STATE_BYTES = 16  # fp32 weights 4 + grads 4 + AdamW exp_avg 4 + exp_avg_sq 4
DDP_BUCKET_BYTES = 4  # DDP's flat fp32 gradient buckets (gradient_as_bucket_view=False)
RESERVE_GIB = 2.0  # CUDA context, cuBLAS/NCCL workspaces, allocator slack
GiB = 2**30


def gpu_spec(gpu: str) -> tuple[str, dict[str, float]]:
    name = GPU_ALIASES.get(gpu.upper(), gpu)
    for known, spec in GPUS.items():
        if known.upper() == name.upper():
            return known, spec
    raise ConfigError(f"--gpu-type: unknown GPU {gpu!r}; allowed: {', '.join(GPUS)} (or {', '.join(GPU_ALIASES)})")


def run_vocab(rc: RunConfig) -> tuple[int, str]:
    """The vocabulary the run will train with: an explicit model.vocab_size, else the recipe's tokenizer."""
    if "vocab_size" in rc.model.model_fields_set:
        return rc.model.vocab_size, "model.vocab_size"
    from .data import load_recipe

    try:
        tok = load_recipe(rc.data.recipe).tokenizer
    except ConfigError:
        return rc.model.vocab_size, "default (recipe not found)"
    if tok.kind == "bpe":
        return tok.vocab_size, f"recipe {rc.data.recipe}"
    if Path(tok.path).is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(tok.path).get_vocab_size(), f"tokenizer {Path(tok.path).name}"
    return rc.model.vocab_size, "default (tokenizer file not found)"


def _chunk_state_bytes(mixer: Mixer, seq_len: int) -> float:
    """Per token: a mixer with a constant-size recurrent state keeps one state per chunk of its
    chunked training form for the backward pass (state_size is fp32 bytes per sequence; the chunk is the
    mixer's declared ``chunk_size()``)."""
    s = mixer.state_size(seq_len)
    if s <= 0 or s != mixer.state_size(max(1, seq_len // 2)):
        return 0.0  # no state, or a KV cache (fused attention keeps only q, k, v, o: counted as projections)
    chunk = mixer.chunk_size()
    if not chunk:
        raise ConfigError(
            f"model.mixer: {mixer.cfg.name} keeps a constant-size recurrent state but declares no chunk_size() (the chunk its "
            "training form keeps one state per), so its activation memory cannot be planned; see docs/adding_a_mixer.md"
        )
    return s / chunk


def activation_bytes_per_token(model, seq_len: int) -> dict[str, float]:
    """bf16-autocast activations kept for the backward pass, per token of a micro-batch (docs/scaling.md):
    per layer 12 D (two RMSNorms: fp32 input + bf16 copy) + 2 (in + out) for every nn.Linear (its bf16 input
    and output) + chunk states; then 6 D for the final norm and 10 V for the logits and their gradient."""
    D, V = model.cfg.d_model, model.cfg.vocab_size
    layers = 0.0
    for blk in model.blocks:
        proj = sum(2 * (m.in_features + m.out_features) for m in blk.modules() if isinstance(m, nn.Linear))
        layers += 12 * D + proj + _chunk_state_bytes(blk.mixer, seq_len)
    return {"layers": layers, "head": 6 * D + 10 * V}


def _fsdp_units(model) -> list[int]:
    """Parameters of each FSDP unit (one per block, plus the root: embeddings, final norm, head)."""
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
    return sorted(blocks + [root], reverse=True)


def memory_per_gpu(model, seq_len: int, micro_batch: int, gpus: int, parallel: str) -> dict[str, float]:
    """GiB per GPU: model states, communication buffers, activations of one micro-batch, reserve."""
    P = sum(p.numel() for p in model.parameters())
    if parallel == "fsdp" and gpus > 1:
        states = MODEL_STATE_BYTES * P / gpus
        units = _fsdp_units(model)
        comm = 8 * sum(units[:2])  # unsharded fp32 params + grads of the current and the prefetched unit
    else:
        states = MODEL_STATE_BYTES * P
        comm = DDP_BUCKET_BYTES * P if gpus > 1 else 0
    act = activation_bytes_per_token(model, seq_len)
    activations = micro_batch * seq_len * (act["layers"] + act["head"])
    out = {"model_states": states / GiB, "comm_buffers": comm / GiB, "activations": activations / GiB, "reserve": RESERVE_GIB}
    out["total"] = sum(out.values())
    return out


def _sizes(rc: RunConfig) -> tuple[nn.Module, dict]:
    """The run's model on the meta device and what every plan reads of it: parameters, FLOPs and tokens."""
    from .model import LM

    vocab, vocab_source = run_vocab(rc)
    with torch.device("meta"):
        model = LM(rc.model.model_copy(update={"vocab_size": vocab}))
    T, tr = rc.data.seq_len, rc.train
    counts = model.param_counts()
    fwd = model.flops_per_token(T)
    tokens_per_step = tr.batch_size * T
    branch_steps = total_branch_steps(tr)  # cooldown branches train on top of the run's own steps
    total_tokens = tokens_per_step * (tr.steps + branch_steps)
    return model, {
        "run": rc.name,
        "mixer": rc.model.mixer.name,
        "mlp": rc.model.mlp.name,
        "n_layers": rc.model.n_layers,
        "d_model": rc.model.d_model,
        "vocab_size": vocab,
        "vocab_source": vocab_source,
        "seq_len": T,
        "params_total": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "fwd_flops_per_token": fwd,
        "train_flops_per_token": 3.0 * fwd,
        "six_n": 6.0 * counts["non_embedding"],
        "batch_size": tr.batch_size,
        "grad_accum": tr.grad_accum,
        "tokens_per_step": tokens_per_step,
        "steps": tr.steps,
        "branch_steps": branch_steps,
        "level_forks": len(tr.cooldown_levels),  # placed while the run trains: counted at their longest
        "total_tokens": total_tokens,
        "total_train_flops": 3.0 * fwd * total_tokens,
    }


def plan_run(rc: RunConfig, gpus: int = 8, gpu: str = "H100-80GB", mfu: float = 0.4, parallel: str | None = None, seeds: int = 1) -> dict:
    """One run on ``gpus`` GPUs of type ``gpu`` at an assumed ``mfu``: memory per GPU and wall time of its training."""
    if gpus < 1:
        raise ConfigError(f"--gpus: must be >= 1, got {gpus}")
    if not 0 < mfu <= 1:
        raise ConfigError(f"--mfu: must be in (0, 1], got {mfu}")
    gpu_name, spec = gpu_spec(gpu)
    parallel = parallel or rc.train.parallel
    model, row = _sizes(rc)
    T, tr = rc.data.seq_len, rc.train
    issues = []
    per_rank = tr.batch_size / (gpus * tr.grad_accum)
    if tr.batch_size % (gpus * tr.grad_accum):
        issues.append(
            f"train.batch_size={tr.batch_size} is not divisible by gpus x grad_accum = {gpus} x {tr.grad_accum}; the trainer will refuse it"
        )
    micro = max(1, math.ceil(per_rank))
    mem = memory_per_gpu(model, T, micro, gpus, parallel)
    fits = mem["total"] <= spec["mem_gib"]
    if not fits:
        issues.append(
            f"does not fit: ~{mem['total']:.1f} GiB per GPU > {spec['mem_gib']:.0f} GiB ({gpu_name}); "
            + _suggest(model, rc, gpus, parallel, spec["mem_gib"])
        )
    elif mem["total"] > 0.9 * spec["mem_gib"]:
        issues.append(f"tight: ~{mem['total']:.1f} of {spec['mem_gib']:.0f} GiB per GPU")
    flops_per_s = gpus * spec["tflops"] * 1e12 * mfu
    seconds = row["total_train_flops"] / flops_per_s
    return {
        **row,
        "seeds": seeds,
        "device": "gpu",
        "micro_batch_per_gpu": per_rank,
        "gpus": gpus,
        "gpu": gpu_name,
        "parallel": parallel,
        "peak_tflops": spec["tflops"],
        "mfu": mfu,
        "memory_gib": mem,
        "gpu_mem_gib": spec["mem_gib"],
        "fits": fits,
        "tokens_per_s": flops_per_s / row["train_flops_per_token"],
        "est_hours": seconds / 3600,
        "issues": issues,
    }


def plan_run_cpu(rc: RunConfig, rates: CpuRates, seeds: int = 1) -> dict:
    """One run on this CPU: its training tokens at its measured or published training rate, plus its evaluations
    (forward only: the rate x training / forward FLOPs per token), at its thread count (``plan_cpu``)."""
    _, row = _sizes(rc)
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


def _suggest(model, rc: RunConfig, gpus: int, parallel: str, capacity: float) -> str:
    """The smallest grad_accum (a divisor of the per-GPU batch) whose micro-batch fits, else FSDP."""
    T, per_gpu = rc.data.seq_len, rc.train.batch_size // gpus
    for accum in range(1, max(1, per_gpu) + 1):
        if per_gpu % accum == 0 and memory_per_gpu(model, T, per_gpu // accum, gpus, parallel)["total"] <= capacity:
            return f"try train.grad_accum={accum} (micro-batch {per_gpu // accum} per GPU)"
    if parallel != "fsdp" and gpus > 1 and memory_per_gpu(model, T, 1, gpus, "fsdp")["total"] <= capacity:
        return "try train.parallel='fsdp' with a smaller micro-batch"
    return "even a micro-batch of 1 does not fit: use more or larger GPUs, FSDP, or activation checkpointing"


def local_gpus() -> tuple[int, str] | None:
    """This machine's CUDA devices as (count, a type of GPUS), None without CUDA; ConfigError for a type not in GPUS."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    for key in ("H200", "H100", "L40S", "A100"):
        if key in name.upper():
            if key == "A100":
                return torch.cuda.device_count(), "A100-80GB" if torch.cuda.get_device_properties(0).total_memory > 50 * GiB else "A100-40GB"
            return torch.cuda.device_count(), GPU_ALIASES[key]
    raise ConfigError(f"this machine's GPU {name!r} is not in basecap.plan.GPUS ({', '.join(GPUS)}); pass --gpus and --gpu-type")


def plan_experiment(
    path: str | Path,
    overrides: list[str] | None = None,
    gpus: int | None = None,
    gpu: str | None = None,
    mfu: float | None = None,
    parallel: str | None = None,
    *,
    cpu_peak: float | None = None,
    calibrate: bool = False,
    results: list[str | Path] | None = None,
    home=None,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """One row per run of the experiment (seeds share a row; ``seeds`` counts them). A tune experiment has
    two phases, each row tagged with its ``phase``: the tuning runs (every value on the tuning seeds), then
    the comparison runs, sized at the first value of the tuning grid until the tuning has chosen.

    With ``gpus`` or ``gpu`` (or on a machine with CUDA: its devices) the runs are planned on GPUs at an assumed
    ``mfu`` (default 0.4). Otherwise on this CPU (``plan_cpu``): ``cpu_peak`` (FLOP/s) in place of the stored peak,
    ``mfu`` in place of a measured or published rate, ``calibrate`` to measure every run's rate here, ``results``
    the folders of published studies (default: ``results/`` beside the experiment's folders)."""
    if gpus is None and gpu is None:
        here = local_gpus()
        if here is not None:
            gpus, gpu = here
    on_gpu = gpus is not None or gpu is not None
    rates = None
    if not on_gpu:
        if mfu is not None and not 0 < mfu <= 1:
            raise ConfigError(f"--mfu: must be in (0, 1], got {mfu}")
        if cpu_peak is not None and cpu_peak <= 0:
            raise ConfigError(f"--cpu-peak: must be > 0, got {cpu_peak}")
        dirs = [Path(r) for r in results] if results is not None else default_results_dirs(path)
        rates = CpuRates(dirs, peak_flops=cpu_peak, mfu=mfu, calibrate=calibrate, home=home, log=log)
    exp = load_experiment(path, overrides)
    phases: list[tuple[str | None, list[RunConfig]]]
    if exp.tune is None:
        phases = [(None, exp.resolve())]
    else:
        first = {name: points[0][0] for name, points in exp.tuning_grid().items()}
        phases = [("tuning", exp.resolve()), ("comparison", exp.resolve(exp.comparison_configs(first)))]
    out: list[dict] = []
    for phase, runs in phases:
        rows: dict[str, dict] = {}
        for rc in runs:
            if rc.name in rows:
                rows[rc.name]["seeds"] += 1
                continue
            if rates is not None:
                rows[rc.name] = plan_run_cpu(rc, rates)
            else:
                rows[rc.name] = plan_run(
                    rc, gpus=8 if gpus is None else gpus, gpu=gpu or "H100-80GB", mfu=0.4 if mfu is None else mfu, parallel=parallel
                )
            if phase is not None:
                rows[rc.name]["phase"] = phase
        out += rows.values()
    if exp.tune is not None:
        _note_tuned_costs(exp, out)
    return out


def _note_tuned_costs(exp, rows: list[dict]):
    """A comparison row is sized at the grid's first value; say so where the tuned values change the cost."""
    by_name = {r["run"]: r for r in rows if r["phase"] == "tuning"}
    for r in rows:
        if r["phase"] != "comparison":
            continue
        tried = [by_name[name] for _, name in exp.tuning_grid()[r["run"]]]
        if len({(t["total_train_flops"], round(t["memory_gib"]["total"], 3) if "memory_gib" in t else t["tokens_per_s"]) for t in tried}) > 1:
            r["issues"].append("sized at the first tuned value; the chosen one may differ in time and memory (see its tuning rows)")


def _n(x: float, unit: str = "") -> str:
    for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suf}{unit}"
    return f"{x:.3g}{unit}"


def _duration(hours: float) -> str:
    if hours < 1 / 60:
        return f"{hours * 3600:.2g} s"
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} d"


def _phase_line(phase: str, rows: list[dict]) -> str:
    """A tune experiment's phase: its trainings (runs x seeds), tokens and time."""
    runs = sum(r["seeds"] for r in rows)
    tokens = sum(r["total_tokens"] * r["seeds"] for r in rows)
    hours = sum(r["est_hours"] * r["seeds"] for r in rows)
    what = "every value on the tuning seeds" if phase == "tuning" else "every run at its chosen values on the comparison seeds"
    return f"-- {phase} phase ({what}): {runs} trainings, {_n(tokens)} tokens, {_duration(hours)}"


COLUMNS = ("run", "mixer", "params", "non-emb", "fwd/tok", "train/tok", "tok/step", "tokens", "ubatch", "mem/GPU", "fits", "time")
_LEFT = {"run", "mixer", "fits"}  # text columns; numbers align right


def _cells(r: dict) -> list[str]:
    """One plan row's cells, in the order of COLUMNS."""
    seeds = f" x{r['seeds']}" if r["seeds"] > 1 else ""
    return [
        r["run"] + seeds,
        r["mixer"],
        _n(r["params_total"]),
        _n(r["params_non_embedding"]),
        _n(r["fwd_flops_per_token"]),
        _n(r["train_flops_per_token"]),
        _n(r["tokens_per_step"]),
        _n(r["total_tokens"]),
        f"{r['micro_batch_per_gpu']:.3g}",
        f"{r['memory_gib']['total']:.1f} GiB",
        "yes" if r["fits"] else "NO",
        _duration(r["est_hours"]),
    ]


def _line(cells: list[str], widths: list[int]) -> str:
    """Cells padded to their column's width, two spaces apart, so no two columns ever touch."""
    return "  ".join(c.ljust(w) if name in _LEFT else c.rjust(w) for c, w, name in zip(cells, widths, COLUMNS)).rstrip()


def format_plan(rows: list[dict], as_json: bool = False) -> str:
    if as_json:
        return json.dumps(rows, indent=1)
    if not rows:
        return "no runs"
    if rows[0].get("device") == "cpu":
        return format_cpu_plan(rows)
    r0 = rows[0]
    cells = [_cells(r) for r in rows]
    widths = [max(len(col), *(len(c[i]) for c in cells)) for i, col in enumerate(COLUMNS)]
    lines = [
        (
            f"plan: {r0['gpus']} x {r0['gpu']} ({r0['peak_tflops']:.0f} bf16 TFLOP/s peak, MFU {r0['mfu']:.2f}), "
            f"{r0['parallel'].upper()}; FLOPs per token at each run's seq_len, training = 3 x forward"
        ),
        "",
        _line(list(COLUMNS), widths),
    ]
    total_h, phase = 0.0, None
    for r, row in zip(rows, cells):
        if r.get("phase") != phase:
            phase = r["phase"]
            lines.append(_phase_line(phase, [x for x in rows if x.get("phase") == phase]))
        total_h += r["est_hours"] * r["seeds"]
        lines.append(_line(row, widths))
    w = widths[0] + 2
    lines += ["", "memory per GPU (GiB) = model states + comm buffers + activations (one micro-batch, bf16) + reserve:"]
    for r in rows:
        m = r["memory_gib"]
        lines.append(
            f"  {r['run']:<{w}}{m['model_states']:>7.1f} + {m['comm_buffers']:.1f} + {m['activations']:.1f} + {m['reserve']:.1f}"
            f" = {m['total']:.1f} of {r['gpu_mem_gib']:.0f}   (vocab {r['vocab_size']} from {r['vocab_source']})"
        )
    lines += _branch_and_issue_lines(rows, w)
    lines += [
        "",
        (f"total: {_duration(total_h)} on {r0['gpus']} GPUs ({total_h * r0['gpus']:.3g} GPU-hours), all runs and seeds, evaluation not included"),
    ]
    return "\n".join(lines)


CPU_COLUMNS = ("run", "mixer", "params", "train/tok", "steps", "tokens", "eval tok", "tok/s", "rate", "train", "eval", "time")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5940 else _duration(seconds / 3600)


def _cpu_cells(r: dict) -> list[str]:
    seeds = f" x{r['seeds']}" if r["seeds"] > 1 else ""
    steps = f"{r['steps']}+{r['branch_steps']}" if r["branch_steps"] else f"{r['steps']}"
    return [
        r["run"] + seeds,
        r["mixer"],
        _n(r["params_total"]),
        _n(r["train_flops_per_token"]),
        steps,
        _n(r["total_tokens"]),
        _n(r["eval_tokens"]),
        f"{r['tokens_per_s']:,.0f}",
        r["rate_kind"],
        _minutes(r["train_seconds"]),
        _minutes(r["eval_seconds"]),
        _minutes(r["est_hours"] * 3600),
    ]


def format_cpu_plan(rows: list[dict]) -> str:
    """The CPU plan: one line per run (per seed), where each rate comes from, the total."""
    r0 = rows[0]
    cells = [_cpu_cells(r) for r in rows]
    widths = [max(len(col), *(len(c[i]) for c in cells)) for i, col in enumerate(CPU_COLUMNS)]
    left = {"run", "mixer", "rate"}

    def line(cs: list[str]) -> str:
        return "  ".join(c.ljust(w) if name in left else c.rjust(w) for c, w, name in zip(cs, widths, CPU_COLUMNS)).rstrip()

    threads = sorted({r["threads"] for r in rows})
    lines = [
        f"plan: this CPU ({r0['cpu']}), {'/'.join(map(str, threads))} thread(s) a run; time per run (each seed), training + evaluation",
        "",
        line(list(CPU_COLUMNS)),
    ]
    total_s, phase = 0.0, None
    for r, row in zip(rows, cells):
        if r.get("phase") != phase:
            phase = r["phase"]
            lines.append(_phase_line(phase, [x for x in rows if x.get("phase") == phase]))
        total_s += r["est_hours"] * 3600 * r["seeds"]
        lines.append(line(row))
    w = widths[0] + 2
    lines += ["", "peak FLOP/s (basecap peak):"]
    for t in threads:
        r = next(x for x in rows if x["threads"] == t)
        lines.append(f"  {t} thread(s): {r['peak_flops'] / 1e9:.1f} GFLOP/s, {r['peak_source']}")
    lines += ["", "training rates (tok/s; evaluation runs forward only, at the rate x training / forward FLOPs per token = 3x):"]
    by_source: dict[str, list[str]] = {}
    for r in rows:
        by_source.setdefault(r["rate_source"], []).append(r["run"])
    for source, names in by_source.items():
        lines.append(f"  {', '.join(names)}: {source}")
    lines += ["", "evaluations (every eval.every steps, one per cooldown branch and level, then basecap run's final test evaluation):"]
    lines += [
        f"  {r['run']:<{w}}{r['evaluations'] - 1} x {_n(r['eval_tokens_each'])} + {_n(r['final_eval_tokens'])} tokens "
        f"over {r['eval_domains']} domain(s), from the {r['eval_source']}"
        for r in rows
    ]
    lines += _branch_and_issue_lines(rows, w)
    runs = sum(r["seeds"] for r in rows)
    lines += [
        "",
        f"total: {_minutes(total_s)} on this CPU for {runs} trainings (all runs and seeds), one after another, training and evaluation included",
    ]
    return "\n".join(lines)


def _branch_and_issue_lines(rows: list[dict], w: int) -> list[str]:
    """The plan's lines on cooldown branches and on each run's issues (GPU and CPU plans alike)."""
    lines: list[str] = []
    branched = [r for r in rows if r.get("branch_steps")]
    if branched:
        lines += ["", "cooldown branches (annealed points; counted in tokens and time):"]
        lines += [
            f"  {r['run']:<{w}}{'up to ' if r.get('level_forks') else ''}{r['branch_steps']} steps on top of {r['steps']} "
            f"(+{100 * r['branch_steps'] / r['steps']:.0f}%)"
            + (f"; forks placed by level: {r['level_forks']}, each counted at the longest a fork can take" if r.get("level_forks") else "")
            for r in branched
        ]
    problems = [(r["run"], i) for r in rows for i in r["issues"]]
    if problems:
        lines += ["", "issues:"] + [f"  {run}: {msg}" for run, msg in problems]
    return lines
