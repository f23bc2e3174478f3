"""``basecap bench cost``: where a study's CPU-seconds go, per mixer, read from kept run records (nothing trains).

For every finished run given (run folders, kept or live), from its ``run.json`` and ``metrics.jsonl``:

- ``wall``: the run's whole wall clock (``run.json``'s ``wall.seconds``: every session from setup to the last step,
  cooldown branches, evaluations and checkpoints included);
- ``main``: the main run's optimizer steps, the step count times the median step time (tokens a step over the
  median of the training records' ``tokens_per_s``, which times the optimizer step alone);
- ``branches``: the cooldown branches' optimizer steps (the annealed points' ``cooldown_steps``) at that median
  step time (branch steps write no records of their own);
- ``rest``: the wall clock less both: evaluations (``n_evals``: the main run's and one per annealed point),
  checkpoints, setup and the final evaluation;
- ``eval_tokens``: tokens the evaluations scored, ``train_tokens``: tokens the optimizer steps trained on.

Runs are grouped by mixer, thread count and ``train.compile``; the table gives the median of each field per group
(seconds), the share of the wall clock each part takes, and the number of runs. ``--out DIR`` writes ``cost.json``
(every run's fields and the groups' medians); ``--before RUNS...`` adds the same mixers' runs before a cost cut, and
a table of the wall clock before and after. A run without ``wall`` (copied before walls were recorded) or without
training records is listed as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
from pathlib import Path
from typing import Any

from ..records import anneals, evals, trains
from ..rundir import RunDir

FIELDS = ("wall", "main", "branches", "rest")


def run_cost(run_dir: str | Path) -> dict[str, Any]:
    """One run's cost fields (module docstring), or ``{"run": ..., "skipped": reason}``."""
    rd = RunDir(run_dir)
    name = str(rd.path)
    if not rd.info_path.is_file() or rd.read_done() is None:
        return {"run": name, "skipped": "not a finished run (no run.json or done.json)"}
    info = rd.read_info()
    cfg = info["config"]
    if "wall" not in info:
        return {"run": name, "skipped": "no wall clock in run.json"}
    records = rd.read_metrics()
    steps = trains(records)
    rates = [r["tokens_per_s"] for r in steps[1:] or steps]
    if not rates:
        return {"run": name, "skipped": "no training records"}
    tokens_per_step = int(cfg["train"]["batch_size"]) * int(cfg["data"]["seq_len"])
    step_s = statistics.median(tokens_per_step / r for r in rates)
    branch_steps = sum(a["cooldown_steps"] for a in anneals(records))
    points = evals(records) + anneals(records)
    wall = float(info["wall"]["seconds"])
    main, branches = len(steps) * step_s, branch_steps * step_s
    return {
        "run": name,
        "run_id": info["run_id"],
        "mixer": cfg["model"]["mixer"]["name"],
        "threads": cfg["train"].get("threads"),
        "compile": bool(cfg["train"].get("compile", False)),
        "step_s": step_s,
        "wall": wall,
        "main": main,
        "branches": branches,
        "rest": wall - main - branches,
        "n_evals": len(points),
        "train_tokens": (len(steps) + branch_steps) * tokens_per_step,
        "eval_tokens": sum(sum(d["tokens"] for d in p["domains"].values()) for p in points),
    }


def group_costs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per (mixer, threads, compile), in order of the median wall clock."""
    groups: dict[tuple[str, Any, bool], list[dict[str, Any]]] = {}
    for r in rows:
        if "skipped" not in r:
            groups.setdefault((r["mixer"], r["threads"], r["compile"]), []).append(r)
    out = []
    for (mixer, threads, compiled), rs in groups.items():
        g: dict[str, Any] = {"mixer": mixer, "threads": threads, "compile": compiled, "runs": len(rs)}
        for f in (*FIELDS, "step_s", "n_evals", "train_tokens", "eval_tokens"):
            g[f] = statistics.median(r[f] for r in rs)
        out.append(g)
    return sorted(out, key=lambda g: g["wall"])


def format_table(groups: list[dict[str, Any]]) -> str:
    head = "| mixer | threads | compiled | runs | wall s | main steps s | branch steps s | evaluations, checkpoints, setup s | evaluations | eval / train tokens |"
    lines = [head, "|" + "---|" * 10]
    for g in groups:
        share = {f: g[f] / g["wall"] for f in FIELDS[1:]}
        lines.append(
            f"| {g['mixer']} | {g['threads']} | {'yes' if g['compile'] else 'no'} | {g['runs']} | {g['wall']:,.0f} "
            f"| {g['main']:,.0f} ({share['main']:.0%}) | {g['branches']:,.0f} ({share['branches']:.0%}) "
            f"| {g['rest']:,.0f} ({share['rest']:.0%}) | {g['n_evals']:.0f} | {g['eval_tokens'] / g['train_tokens']:.2f} |"
        )
    return "\n".join(lines)


def format_before_after(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    """Per mixer (and thread count) in both: the median wall clock, evaluation tokens and the rest before and after,
    and the change of the wall clock. ``compile`` is not part of the key: turning it on is one of the cuts."""
    old = {(g["mixer"], g["threads"]): g for g in before}
    lines = [
        "| mixer | threads | runs before / after | wall s before | wall s after | change | eval / train tokens before / after "
        "| evaluations, checkpoints, setup s before / after |",
        "|" + "---|" * 8,
    ]
    for g in after:
        b = old.get((g["mixer"], g["threads"]))
        if b is None:
            continue
        lines.append(
            f"| {g['mixer']} | {g['threads']} | {b['runs']} / {g['runs']} | {b['wall']:,.0f} | {g['wall']:,.0f} "
            f"| {g['wall'] / b['wall'] - 1:+.0%} | {b['eval_tokens'] / b['train_tokens']:.2f} / {g['eval_tokens'] / g['train_tokens']:.2f} "
            f"| {b['rest']:,.0f} / {g['rest']:,.0f} |"
        )
    return "\n".join(lines)


def _expand(patterns: list[str]) -> list[str]:
    return sorted({p for pattern in patterns for p in (glob.glob(pattern) or [pattern])})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="basecap bench cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders or glob patterns (e.g. 'results/architectures_rate_arms/runs/*-s*')")
    ap.add_argument("--out", help="folder for cost.json")
    ap.add_argument("--before", nargs="+", metavar="RUN", help="runs of the same mixers before a cut: print them beside the runs given")
    args = ap.parse_args(argv)
    rows = [run_cost(p) for p in _expand(args.runs)]
    groups = group_costs(rows)
    print(format_table(groups))
    baseline = group_costs([run_cost(p) for p in _expand(args.before)]) if args.before else None
    if baseline is not None:
        print("\nbefore (--before) and after (the runs given):\n" + format_before_after(baseline, groups))
    skipped = [r for r in rows if "skipped" in r]
    for r in skipped:
        print(f"skipped {r['run']}: {r['skipped']}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cost.json").write_text(json.dumps({"groups": groups, "runs": rows, "before": baseline}, indent=1) + "\n")
        print(f"written: {out / 'cost.json'}")
