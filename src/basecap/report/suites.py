"""Report sections for the evaluation suites and speed: associative recall against recurrent-state
size (Zoology's view), lm-eval accuracies, the long-context and extraction suites' headline numbers,
and training / decoding speed against sequence length (from ``basecap bench mixers`` JSON)."""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..rundir import RunDir

if TYPE_CHECKING:
    from .runs import Run


def _ms(vals: list[Any]) -> tuple[float, float | None] | None:
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def _f(ms: tuple[float, float | None] | None, p: int = 3) -> str:
    if ms is None:
        return "-"
    m, s = ms
    return f"{m:.{p}f}" if s is None else f"{m:.{p}f} ± {s:.{p}f}"


def collect(runs: list[Run]) -> dict[str, dict[str, list[dict]]]:
    """suite label -> run name -> results over seeds. A named suite entry (suite_<name>/) is its own label."""
    found: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        for path in RunDir(r.dir).suite_results():
            res = json.loads(path.read_text())
            if "suite" not in res:
                continue
            entry = RunDir.suite_label(path)
            label = res["suite"] + (f" ({entry})" if entry is not None else "")
            found[label][r.name].append(res)
    return found


def _file_part(label: str) -> str:
    """A suite label read from a result file as part of a file name: "mqar (wide)" -> "mqar_wide" (no path)."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", label).strip("_.") or "suite"


def _mqar(label: str, per_run: dict[str, list[dict]], out: Path) -> tuple[list[str], Path | None]:
    pairs = sorted({k for rs in per_run.values() for res in rs for run in res.get("runs", []) for k in run["acc"]}, key=int)
    lines = [
        f"## Associative recall: {label}",
        "",
        "Each architecture trained from scratch on MQAR (Zoology's protocol) at the width shown; accuracy on "
        "held-out sequences per number of key-value pairs, mean ± std over MQAR training seeds (one value when the "
        "suite fixes its seed); state = recurrent state bytes per sequence (KV cache for attention) at the MQAR "
        "length.",
        "",
        "| run | d_model | seeds | state bytes | " + " | ".join(f"{p} pairs" for p in pairs) + " | mean |",
        "|" + "---|" * (5 + len(pairs)),
    ]
    pts: list[tuple[str, Any, Any, Any]] = []
    for name, rs in per_run.items():
        by_d: dict[int, dict] = defaultdict(dict)
        for res in rs:
            for run in res.get("runs", []):
                # a fixed MQAR seed gives one result shared by every seed of the run: count it once
                by_d[run["d_model"]].setdefault(run.get("seed"), run)
        for d, by_seed in sorted(by_d.items()):
            runs = list(by_seed.values())
            accs = {p: _ms([r["acc"].get(p) for r in runs]) for p in pairs}
            mean = _ms([r["mean_acc"] for r in runs])
            state = runs[0]["state_bytes"]
            lines.append(f"| {name} | {d} | {len(runs)} | {state:,} | " + " | ".join(_f(accs[p], 2) for p in pairs) + f" | {_f(mean, 3)} |")
            pts.append((name, d, state, mean))
    img = None
    if pts:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        by_name = defaultdict(list)
        for name, d, state, ms in pts:
            by_name[name].append((state, d, ms))
        for name, rows in by_name.items():  # one curve per architecture over its widths (Zoology's figure)
            rows.sort()
            ax.errorbar([r[0] for r in rows], [r[2][0] for r in rows], yerr=[r[2][1] or 0 for r in rows], fmt="-o", capsize=3, label=name)
            for state, d, (m, _) in rows:
                ax.annotate(f"d={d}", (state, m), textcoords="offset points", xytext=(3, 3), fontsize=6)
        ax.set(
            xscale="log",
            xlabel="recurrent state bytes per sequence",
            ylabel="MQAR accuracy (mean over pair counts)",
            title="Recall against state size",
        )
        ax.legend(fontsize=7)
        fig.tight_layout()
        img = out / f"recall_vs_state_{_file_part(label)}.png"
        fig.savefig(img, dpi=110)
        plt.close(fig)
    return lines, img


def _lm_eval(label: str, per_run: dict[str, list[dict]]) -> list[str]:
    tasks = sorted({t for rs in per_run.values() for res in rs for t in res.get("summary", {})})
    lines = [
        f"## lm-evaluation-harness: {label}",
        "",
        "acc_norm where the task reports it (ARC-c, HellaSwag, OpenBookQA, PIQA convention), else acc; mean ± std over seeds.",
        "",
        "| run | " + " | ".join(tasks) + " |",
        "|" + "---|" * (1 + len(tasks)),
    ]
    for name, rs in per_run.items():
        cells = []
        for t in tasks:
            vals = []
            for res in rs:
                m = res.get("summary", {}).get(t, {})
                v = m.get("acc_norm", m.get("acc", m.get("contains", m.get("bits_per_byte"))))
                vals.append(v if isinstance(v, (int, float)) else None)
            cells.append(_f(_ms(vals), 3))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _generic(label: str, per_run: dict[str, list[dict]]) -> list[str]:
    keys = None
    rows = []
    for name, rs in per_run.items():
        nums = defaultdict(list)
        for res in rs:
            for k, v in res.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("seconds", "seed"):
                    nums[k].append(v)
        keys = keys or sorted(nums)
        rows.append((name, {k: _ms(v) for k, v in nums.items()}))
    if not keys:
        return []
    lines = [
        f"## {label}",
        "",
        "Headline numbers of the suite (mean ± std over seeds; details in each run's eval JSON).",
        "",
        "| run | " + " | ".join(keys) + " |",
        "|" + "---|" * (1 + len(keys)),
    ]
    lines += [f"| {name} | " + " | ".join(_f(v.get(k)) for k in keys) + " |" for name, v in rows]
    return lines


def speed_section(speed_json: Path, out: Path) -> tuple[list[str], Path | None]:
    data = json.loads(speed_json.read_text())
    res = data["results"]
    att = res.get("attention")
    lengths = sorted({int(T) for r in res.values() for T in r.get("train_s", {})})
    ctxs = sorted({int(c) for r in res.values() for c in r.get("decode_ms", {})})
    lines = [
        "## Speed against sequence length",
        "",
        f"One mixer layer, d_model {data['meta']['d_model']}, batch 1, {data['meta']['threads']} thread(s): "
        "forward+backward seconds of the training form, and ms per decoded token after a context (`basecap bench mixers`).",
        "",
        "| mixer | " + " | ".join(f"train T={T}" for T in lengths) + " | " + " | ".join(f"decode @{c}" for c in ctxs) + " |",
        "|" + "---|" * (1 + len(lengths) + len(ctxs)),
    ]
    for name, r in res.items():
        if not r.get("ok", True):
            lines.append(f"| {name} | failed correctness check |")
            continue
        cells = [f"{r['train_s'][str(T)] if str(T) in r['train_s'] else r['train_s'].get(T, float('nan')):.3f}" for T in lengths]
        if att and name != "attention":
            cells = [c + f" ({float(c) / att['train_s'][str(T)]:.2f}x)" for c, T in zip(cells, lengths)]
        cells += [f"{r['decode_ms'][str(c)]:.2f}" for c in ctxs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    img = out / "speed.png"
    src = speed_json.with_suffix(".png")
    if src.exists():
        img.write_bytes(src.read_bytes())
    return lines, (img if img.exists() else None)


def suite_sections(runs: list[Run], out: Path, speed_json: str | Path | None = None) -> tuple[list[str], list[Path]]:
    lines, images = [], []
    for label, per_run in collect(runs).items():
        if label.startswith("mqar"):
            sec, img = _mqar(label, per_run, out)
            images += [img] if img else []
        elif label.startswith("lm-eval"):
            sec = _lm_eval(label, per_run)
        else:
            sec = _generic(label, per_run)
        lines += ["", *sec]
    if speed_json is not None and Path(speed_json).exists():
        sec, img = speed_section(Path(speed_json), out)
        lines += ["", *sec]
        images += [img] if img else []
    return lines, images


__all__ = ["collect", "suite_sections", "speed_section"]
