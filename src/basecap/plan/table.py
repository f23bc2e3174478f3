"""The printed plan: one line per run (its seeds on one line), a tune experiment's phases, then memory per GPU
or where each CPU rate comes from, cooldown branches, issues and the total."""

from __future__ import annotations

import json


def _evaluations_text(r: dict) -> str:
    """``N x tokens + final tokens``, with the main run's smaller evaluations (eval.curve_max_tokens) apart."""
    n, curve = r["evaluations"] - 1, r.get("curve_evaluations", 0)
    smaller = f"{curve} x {_n(r['curve_eval_tokens_each'])} + " if curve else ""
    return f"{smaller}{n - curve} x {_n(r['eval_tokens_each'])} + {_n(r['final_eval_tokens'])} tokens"


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
    lines += [f"  {r['run']:<{w}}{_evaluations_text(r)} over {r['eval_domains']} domain(s), from the {r['eval_source']}" for r in rows]
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
