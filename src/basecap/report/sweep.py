"""The report's tuning section: what a tune experiment tried and chose (``<out_dir>/tuning.json``, written
by basecap.sweep), placed before the comparison. A plot of in-domain validation loss against each tuned
key's values, one curve per run with the chosen value starred, and a table of every value's loss."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

FIGURE = "sweep.png"


def add_sweep_section(md: str, images: list[Path], tuning_json: str | Path, out: Path) -> tuple[str, list[Path]]:
    """``md`` with the tuning section inserted before the final evaluation, and the sweep plot first in
    ``images``; unchanged when the file is missing or holds no run."""
    path = Path(tuning_json)
    tuning = json.loads(path.read_text()) if path.is_file() else {}
    if not tuning.get("runs"):
        return md, images
    lines = sweep_markdown(tuning)
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
    lines = [f"## Tuning: {', '.join(keys)} chosen per run on in-domain validation loss", "",
             (f"Every run was first trained at each value below on tuning seed(s) {', '.join(map(str, seeds))}, which the "
              "comparison never uses. The chosen value (bold) has the lowest final in-domain loss on the validation split, "
              "mean over the tuning seeds (± = their standard deviation); a tie goes to the value listed first. The OOD domains "
              "and the test split were never consulted: they are what the comparison below tests. The comparison runs every "
              "architecture at its own chosen value."), "",
             "| run | " + " | ".join(points) + " | chosen |", "|" + "---|" * (len(points) + 2)]
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
            ax.plot([pos(x) for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], "-o", ms=4, lw=1.2,
                    color=color, label=name)
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
