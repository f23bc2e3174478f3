"""The plots of a report: training curves and the paper's central figure (in-domain loss against OOD loss over
training, one curve per run, a panel per OOD domain); with a comparison design, the gap against the matched
level (``report.design_page``). matplotlib is imported when a report is drawn, never at import."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from .analysis import runs_by_name, domain_curve, reference_pairs, ood_domains
from .runs import Run


def legend_label(r: Run, seeds: Counter, labelled: set[str]) -> str:
    """Legend label of the curve of ``r`` in one panel: one entry per run name (its seeds share a colour), on the
    first of its curves drawn there (``labelled`` holds the names already labelled); matplotlib leaves
    ``_nolegend_`` out."""
    if r.name in labelled:
        return "_nolegend_"
    labelled.add(r.name)
    return f"{r.name} ({seeds[r.name]} seeds)" if seeds[r.name] > 1 else r.run_id


def draw_plots(runs: list[Run], out: Path, summary: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.name for r in runs))
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    seeds = Counter(r.name for r in runs)
    paths = []

    fig, ax = plt.subplots(figsize=(6.5, 4))
    labelled: set[str] = set()
    for r in runs:
        if r.train:
            steps = np.array([t["step"] for t in r.train])
            loss = np.array([t["loss"] for t in r.train])
            k = max(1, len(loss) // 50)
            sm = np.convolve(loss, np.ones(k) / k, "valid")
            ax.plot(steps[k - 1 :], sm, color=colors[r.name], lw=1, label=legend_label(r, seeds, labelled))
    ax.set(xlabel="step", ylabel="training loss (nats/token)", title="Training curves")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "training_curves.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    ood = ood_domains(runs)
    if ood:
        # the legend gets a strip of its own to the right, as wide as its longest label
        legend_in = 0.5 + 0.055 * max((len(legend_label(r, seeds, set())) for r in runs), default=0)
        width = 4.2 * len(ood) + legend_in
        fig, axes = plt.subplots(1, len(ood), figsize=(width, 3.8), squeeze=False)
        for ax, d in zip(axes[0], ood):
            labelled = set()
            for r in runs:
                if r.evals:
                    x, y = domain_curve(r, d)
                    ax.plot(x, y, "-o", ms=2.5, lw=1, color=colors[r.name], label=legend_label(r, seeds, labelled))
            ax.invert_xaxis()
            ax.set(xlabel="in-domain validation loss", ylabel=f"{d} loss", title=f"{d}")
        # one legend for the figure, beside the panels: inside one it would cover the curves it names
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
        fig.suptitle(
            "In-domain vs out-of-distribution loss over training (training runs left to right; at the same in-domain loss, lower is better)",
            fontsize=10,
        )
        fig.tight_layout(rect=(0, 0, 1 - legend_in / width, 1))
        paths.append(out / "indomain_vs_ood.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    if summary.get("design"):
        from .design_page import gap_level_plot

        paths += gap_level_plot(runs, summary, out, colors, reference_pairs(runs, runs_by_name(runs), summary["references"]))
    return paths
