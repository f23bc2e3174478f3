"""The report's tuning section: what a tune experiment tried and chose (``<out_dir>/tuning.json``, written
by basecap.sweep), placed before the comparison. A plot of in-domain validation loss against each tuned
key's values, one curve per run with the chosen value starred, and a table of every value's loss."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from ..rundir import RunDir

if TYPE_CHECKING:
    from .runs import Run

FIGURE = "sweep.png"


def add_sweep_section(md: str, images: list[Path], tuning_json: str | Path, out: Path, reference: str | None = None) -> tuple[str, list[Path]]:
    """``md`` with the tuning section inserted before the final evaluation, and the sweep plot first in
    ``images``; unchanged when the file is missing or holds no run. With ``reference``, the section also
    shows the OOD gap at each fixed value against the reference at the same value (``fixed_vs_tuned``)."""
    path = Path(tuning_json)
    tuning = json.loads(path.read_text()) if path.is_file() else {}
    if not tuning.get("runs"):
        return md, images
    lines = sweep_markdown(tuning)
    if reference is not None:
        lines += fixed_vs_tuned_markdown(fixed_vs_tuned(tuning, path.parent, reference))
    figure = sweep_plot(tuning, out)
    lines += ["", f"![sweep]({figure.name})", ""]
    marker = "## Final evaluation"
    head, sep, rest = md.partition(marker)
    md = head + "\n".join(lines) + "\n" + sep + rest if sep else md.rstrip() + "\n\n" + "\n".join(lines) + "\n"
    return md, [figure, *images]


def _values_text(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _cell(tried: dict, chosen: bool) -> str:
    losses = [v for v in tried["losses"].values() if v is not None]
    if tried["mean"] is None:
        text = "diverged"
    elif len(losses) > 1:
        text = f"{tried['mean']:.3f} ± {statistics.stdev(losses):.3f}"
    else:
        text = f"{tried['mean']:.3f}"
    return f"**{text}**" if chosen else text


def sweep_markdown(tuning: dict) -> list[str]:
    keys, seeds, runs = tuning["keys"], tuning["seeds"], tuning["runs"]
    points = [_values_text(t["values"]) for t in next(iter(runs.values()))["tried"]]
    lines = [
        f"## Tuning: {', '.join(keys)} chosen per run on in-domain validation loss",
        "",
        (
            f"Every run was first trained at each value below on tuning seed(s) {', '.join(map(str, seeds))}, which the "
            "comparison never uses. The chosen value (bold) has the lowest final in-domain loss on the validation split, "
            "mean over the tuning seeds (± = their standard deviation); a tie goes to the value listed first. The OOD domains "
            "and the test split were never consulted: they are what the comparison below tests. The comparison runs every "
            "architecture at its own chosen value."
        ),
        "",
        "| run | " + " | ".join(points) + " | chosen |",
        "|" + "---|" * (len(points) + 2),
    ]
    for name, entry in runs.items():
        cells = [_cell(t, t["name"] == entry["chosen_name"]) for t in entry["tried"]]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_values_text(entry['chosen'])} |")
    return lines


def _log_x(key: str, values: list) -> bool:
    """Learning rates, and any positive numeric grid spanning a factor of 4 or more, read best on a log axis."""
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        return False
    return key.split(".")[-1].endswith("lr") or max(values) / min(values) >= 4


def _profile(entry: dict, key: str) -> tuple[list, list]:
    """For each value of ``key``, in grid order, the lowest mean loss over the other tuned keys' values."""
    best: dict[str, tuple] = {}
    for t in entry["tried"]:
        v, m = t["values"][key], t["mean"]
        old = best.get(json.dumps(v), (v, None))[1]
        best[json.dumps(v)] = (v, m if old is None or (m is not None and m < old) else old)
    return [v for v, _ in best.values()], [m for _, m in best.values()]


def sweep_plot(tuning: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys, runs = tuning["keys"], tuning["runs"]
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys):
        grid = list({json.dumps(t["values"][key]): t["values"][key] for e in runs.values() for t in e["tried"]}.values())
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in grid)
        pos = (lambda v: v) if numeric else grid.index
        for i, (name, entry) in enumerate(runs.items()):
            color = plt.cm.tab10(i % 10)
            xs, ys = _profile(entry, key)
            ax.plot([pos(x) for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], "-o", ms=4, lw=1.2, color=color, label=name)
            for t in entry["tried"]:  # each tuning seed, faint
                seeds = [v for v in t["losses"].values() if v is not None]
                ax.plot([pos(t["values"][key])] * len(seeds), seeds, ".", ms=3, alpha=0.35, color=color)
            chosen = next(t for t in entry["tried"] if t["name"] == entry["chosen_name"])
            ax.plot([pos(chosen["values"][key])], [chosen["mean"]], "*", ms=15, color=color, markeredgecolor="black", zorder=5)
        if _log_x(key, grid):
            ax.set_xscale("log")
        if numeric:
            ax.set_xticks(grid, [str(v) for v in grid])
        else:
            ax.set_xticks(range(len(grid)), [str(v) for v in grid])
        ax.minorticks_off()
        ax.set(xlabel=key, ylabel="in-domain validation loss", title=key)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Tuning: mean over tuning seeds (dots: each seed; star: chosen)", fontsize=9)
    fig.tight_layout()
    path = out / FIGURE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


TUNING_RUNS = "tuning_runs"  # where report --archive keeps the tuning runs' records, beside tuning.json


def tuning_run_dir(folder: Path, name: str, seed: int | str) -> RunDir | None:
    """The finished tuning run ``name`` on ``seed`` (done.json; metrics plain or archived as metrics.jsonl.zst): in
    the study folder that holds tuning.json, else in its ``tuning_runs/`` (a results folder); None when neither has
    it finished (a run still training gives no gap and is not archived)."""
    for rd in (RunDir(Path(folder) / f"{name}-s{seed}"), RunDir(Path(folder) / TUNING_RUNS / f"{name}-s{seed}")):
        if rd.has_metrics() and rd.read_done() is not None:
            return rd
    return None


def fixed_vs_tuned(tuning: dict, runs_dir: Path, reference: str) -> list[dict]:
    """Would a fixed value have given another verdict? From the tuning runs alone (tuning seeds): for every
    run but the reference and every domain it did not train on, the primary OOD gap at matched in-domain loss
    (``report.stats.matched_endpoints``) against the reference trained at the same values, for each point of
    the grid, and at each run's own chosen values. Mean over the tuning seeds both have; None where a run
    is missing or the curves do not overlap. Rows: {"run", "domain", "fixed": {point: gap}, "tuned": gap}."""
    from .runs import load_run
    from .stats import matched_endpoints

    runs = tuning["runs"]
    if reference not in runs:
        return []
    seeds = [str(s) for s in tuning["seeds"]]

    def curves(name: str, seed: str) -> Run | None:
        rd = tuning_run_dir(runs_dir, name, seed)
        if rd is None:
            return None
        r = load_run(rd.path)
        return r if r.evals else None

    def gap(name: str, ref_name: str, domain: str) -> float | None:
        vals = []
        for seed in seeds:
            a, b = curves(name, seed), curves(ref_name, seed)
            if a is None or b is None or domain not in a.domains or domain not in b.domains:
                continue
            g = matched_endpoints(
                [e["in_domain_loss"] for e in a.evals],
                [e["domains"][domain]["loss"] for e in a.evals],
                [e["in_domain_loss"] for e in b.evals],
                [e["domains"][domain]["loss"] for e in b.evals],
            )
            if g.ok and g.primary is not None:
                vals.append(g.primary)
        return statistics.fmean(vals) if vals else None

    ref = runs[reference]
    ref_at = {json.dumps(t["values"], sort_keys=True): t["name"] for t in ref["tried"]}
    rows = []
    for name, entry in runs.items():
        if name == reference:
            continue
        first = curves(entry["tried"][0]["name"], seeds[0])
        for domain in first.ood_domains if first is not None else []:
            fixed = {
                _values_text(t["values"]): (gap(t["name"], ref_at[k], domain) if (k := json.dumps(t["values"], sort_keys=True)) in ref_at else None)
                for t in entry["tried"]
            }
            rows.append({"run": name, "domain": domain, "fixed": fixed, "tuned": gap(entry["chosen_name"], ref["chosen_name"], domain)})
    return rows


def fixed_vs_tuned_markdown(rows: list[dict]) -> list[str]:
    """The table of ``fixed_vs_tuned``'s rows; a row without a single number (its own or the reference's tuning
    runs are not in the folder, e.g. records that were not kept) is left out, and with no row left, the table."""
    rows = [r for r in rows if r["tuned"] is not None or any(v is not None for v in r["fixed"].values())]
    if not rows:
        return []
    points = list(rows[0]["fixed"])
    num = lambda v: "-" if v is None else f"{v:+.3f}"  # noqa: E731
    lines = [
        "",
        "### Does a fixed value change the verdict? (tuning seeds only)",
        "",
        (
            "Primary OOD gap at matched in-domain loss against the reference, both trained at the same fixed value (one "
            "column per value), and at each one's own chosen value (last column), from the tuning runs. Positive = worse "
            "OOD than the reference. One number per tuning seed, no interval: it shows whether the choice of a shared "
            "value can move or flip a gap, not whether a gap is real (the comparison below answers that)."
        ),
        "",
        "| run | domain | " + " | ".join(points) + " | each at its chosen value |",
        "|" + "---|" * (len(points) + 3),
    ]
    for r in rows:
        lines.append(f"| {r['run']} | {r['domain']} | " + " | ".join(num(r["fixed"][p]) for p in points) + f" | {num(r['tuned'])} |")
    return lines
