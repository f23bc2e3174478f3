"""The report's sections for a study with a comparison design (``report.design``): the design in words, every
measure side by side, the limited-vs-mixed interaction, the targets by training frequency, and the figure of
the OOD gap against the matched in-domain level."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .design import RULE_STEP, gap_curve, gap_fraction_curve, measures

if TYPE_CHECKING:
    from .design import GapCurve
    from .runs import Run

MEASURE_WORDS = {
    "legacy": "evaluations, every target, lowest 30% of each pair's range (the old design)",
    "evals_all": "evaluations, every target, band",
    "evals_seen": "evaluations, seen targets, band",
    "annealed_all": "annealed points, every target, band",
    "annealed_seen": "annealed points, seen targets, band",
}


# What each step of the design takes out of a gap, in the order of the measure table (docs/metrics.md).
REMOVES = (
    "Each step from the old design removes one thing that is not the architecture: the band reads every pair at the "
    "same in-domain level (the old design read each pair over the lowest 30% of its own common range, which moves "
    "with how far its runs got); annealed points read each model where it would stand had its training ended there "
    "(a point taken mid-schedule carries the learning rate's phase: the faster-decaying run looks better); seen "
    "targets leave out held-out tokens whose id the training domains show fewer than `eval.seen_min_count` times (their "
    "loss is set by how the output head treats ids training could only push down, not by the sequence mixer)."
)


def band_text(band: list[float]) -> str:
    """An in-domain band as the study file gives it, every bound with at least one decimal: 4.0-4.2, 4.8-5.0, 4.25-4.45."""

    def num(x: float) -> str:
        t = f"{x:g}"
        return t if "." in t else t + ".0"

    return f"{num(band[0])}-{num(band[1])}"


def design_sections(summary: dict) -> list[str]:
    d = summary["design"]
    match = ", ".join(d["match_domains"]) if d.get("match_domains") else "each run's training domains (in-domain loss)"
    return [
        "",
        "## Comparison design",
        "",
        (
            f"From the study file `{d['study_file']}` as it now stands, given with `basecap report --compare` because its "
            "runs were started under an earlier version of it: any change since is a deviation recorded in the file with "
            "its date, what had been read and its rule (docs/metrics.md, \"The comparison design\"). "
            if d.get("given") and d.get("study_file")
            else "Given on the command line (`basecap report --compare`): a re-analysis, chosen after the runs, so exploratory "
            "(docs/metrics.md, \"The comparison design\"). "
            if d.get("given")
            else "From the study file (docs/metrics.md, \"The comparison design\"), where it is fixed before any run trains; a "
            "later change is a deviation, recorded there with its date, what had been read and its reason. "
        )
        + "Matching coordinate: "
        f"the loss on {match}. Primary measure: `{d['primary']}` ({MEASURE_WORDS.get(d['primary'], d['primary'])}): the mean "
        f"gap over the in-domain band {band_text(d['band'])}, the same for every comparison. Annealed points are the "
        "cooldown branches' evaluations and each run's own end (its schedule ends at the floor rate); seen targets are the "
        "held-out tokens whose id occurs at least `eval.seen_min_count` times in the training domains' train split, so the "
        "gap is not about rows of the head that training could only push down. The other measures follow the primary table.",
        *_reach_lines(summary.get("reach"), d["band"]),
    ]


def _reach_lines(r: dict | None, band: list[float]) -> list[str]:
    """Whether every curve of the primary measure reaches the whole band, and the band the rule gives when not."""
    if not r:
        return []
    lo, hi = r["common"]
    low_by = max(r["runs"], key=lambda n: r["runs"][n]["lowest"])
    high_by = min(r["runs"], key=lambda n: r["runs"][n]["highest"])
    text = (
        f"In-domain reach ({r['points']} points, every run and seed): every curve reaches from {hi:.3f} down to {lo:.3f} "
        f"(the lowest is set by `{low_by}`, the highest by `{high_by}`). "
    )
    if r["band_held"]:
        return ["", text + f"The band {band_text(band)} lies inside."]
    text += f"**The band {band_text(band)} does not lie inside**, so a pair whose curves do not hold it has no primary gap. "
    if r.get("rule_band"):
        a, b = r["rule_band"]
        text += (
            f"The rule of docs/metrics.md (\"When a curve cannot reach the band\") gives {band_text([a, b])}: the band of the same "
            f"width whose bottom is the lowest loss every curve reaches, rounded up to a multiple of {RULE_STEP:g}, decided on in-domain "
            "losses only. Moving a study's band after its runs trained is a deviation: record it in the study file."
        )
    else:
        text += "No band of the same width lies inside every curve's reach."
    return ["", text]


def _cell(c: dict | None) -> str:
    if c is None or c.get("mean_gap") is None:
        return "-"
    ci = f" [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]" if c.get("ci95") else ""
    star = "*" if c.get("p_holm") is not None and c["p_holm"] < 0.05 else ""
    return f"{c['mean_gap']:+.3f}{ci}{star} ({c['n_seeds']})"


def measure_sections(summary: dict) -> list[str]:
    by = summary["comparisons_by_measure"]
    names = [m.name for m in measures(summary["design"])[0] if m.name in by]
    rows = list(dict.fromkeys((c["run"], c["domain"]) for c in by[summary["design"]["primary"]] + by["legacy"]))
    idx = {n: {(c["run"], c["domain"]): c for c in by[n]} for n in names}
    lines = [
        "",
        "## The gap under each measure",
        "",
        "Mean gap (nats/token) [95% CI over seeds], * where its Holm-corrected test (within the measure) rejects, "
        "(seeds matched). Reading across a row shows what each choice of the design does to one comparison. " + REMOVES,
        "",
        "| run | domain | " + " | ".join(f"{n}: {MEASURE_WORDS.get(n, n)}" for n in names) + " |",
        "|" + "---|" * (2 + len(names)),
    ]
    for run, dom in rows:
        lines.append(f"| {run} | {dom} | " + " | ".join(_cell(idx[n].get((run, dom))) for n in names) + " |")
    band = [c for c in by[summary["design"]["primary"]] if c.get("fewest_points_in_band") is not None]
    if band:
        lines += [
            "",
            "Fewest points of a curve inside the band (primary measure, any seed), the run's / its reference's: "
            + ", ".join(_points(c) for c in band if c["domain"] == band[0]["domain"])
            + ". Between two points the curve is interpolated; with none inside, the band's gap rests on the points around it.",
        ]
    lines += _interaction_table(summary.get("interactions") or [])
    lines += _strata_table(summary.get("strata_shares") or {})
    return lines


def _points(c: dict) -> str:
    p = c.get("points_in_band")  # summaries written before the split give only the smaller of the two
    return f"{c['run']} {p['run']} / {p['reference']}" if p else f"{c['run']} {c['fewest_points_in_band']}"


def _interaction_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = [
        "",
        "## Limited against mixed: the interaction",
        "",
        "Per seed, the run's gap in the limited setting minus its architecture's gap in the mixed setting (primary "
        "measure; both matched on the same coordinate), paired by seed; Holm across the rows. Positive = the limited "
        "setting shows a larger OOD gap than the mixed one.",
        "",
        "| run | mixed twin | domain | seeds | limited gap | mixed gap | difference [95% CI] | p | p (Holm) | verdict |",
        "|" + "---|" * 10,
    ]
    for c in rows:
        ci = f" [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]" if c.get("ci95") else ""
        p, ph = ("-" if v is None else f"{v:.4f}" for v in (c["p"], c["p_holm"]))
        lines.append(
            f"| {c['run']} | {c['mixed_run']} | {c['domain']} | {c['n_seeds']} | {_signed(c['limited_gap'])} | "
            f"{_signed(c['mixed_gap'])} | {_signed(c['mean'])}{ci} | {p} | {ph} | {c['verdict']} |"
        )
    return lines


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.3f}"


def _strata_table(shares: dict) -> list[str]:
    if not shares:
        return []
    lines = [
        "",
        "## Targets by training frequency",
        "",
        "Share of each domain's evaluation targets by how often the target id occurs in the training domains' train "
        "split: seen (>= eval.seen_min_count), rare (fewer, at least once), unseen (never).",
        "",
        "| training domains | domain | seen | rare | unseen |",
        "|---|---|---|---|---|",
    ]
    for setting, doms in shares.items():
        for d, st in doms.items():
            lines.append(f"| {setting} | {d} | {st.get('seen', 0):.3f} | {st.get('rare', 0):.3f} | {st.get('unseen', 0):.3f} |")
    return lines


def gap_level_plot(runs: list[Run], summary: dict, out: Path, colors: dict, pairs: list[tuple[Run, Run]]) -> list[Path]:
    """OOD gap of each run against the reference (primary measure) as a function of the matched in-domain level (top
    row) and of the fraction of training (bottom row, annealed designs: the level the reference reaches there), the
    mean over the seeds that reach each x with its 95% band over seeds, the band of levels shaded."""
    import matplotlib.pyplot as plt

    design = summary["design"]
    m = next(x for x in measures(design)[0] if x.name == design["primary"])
    doms = list(dict.fromkeys(c["domain"] for c in summary["comparisons"] if not c.get("in_domain_here")))
    if not doms:
        return []
    names = list(dict.fromkeys(r.name for r, _ in pairs))
    by_name = {name: [(r, f) for r, f in pairs if r.name == name] for name in names}
    fractions = {(name, d): gap_fraction_curve(by_name[name], m, design, d) for name in names for d in doms}
    rows = 2 if any(c is not None for c in fractions.values()) else 1
    width = 4.6 * len(doms) + 1.6
    fig, axes = plt.subplots(rows, len(doms), figsize=(width, 3.4 * rows), squeeze=False)
    refs = " / ".join(summary["references"])
    for k, d in enumerate(doms):
        ax = axes[0][k]
        for name in names:
            _draw(ax, gap_curve(by_name[name], m, design, d), colors.get(name), name)
        ax.axvspan(design["band"][0], design["band"][1], color="0.85", zorder=0)
        ax.axhline(0, color="0.4", lw=0.8)
        ax.invert_xaxis()
        ax.set(xlabel="matched in-domain loss", ylabel=f"{d}: gap to {refs} (nats/token)", title=d)
        if rows == 2:
            ax = axes[1][k]
            for name in names:
                _draw(ax, fractions[(name, d)], colors.get(name), name)
            ax.axhline(0, color="0.4", lw=0.8)
            ax.set(xlabel="fraction of training (the reference's level there)", ylabel=f"{d}: gap (nats/token)", xlim=(0, 1))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
    fig.suptitle(
        f"OOD gap along training ({design['primary']}; mean and 95% band over seeds; band of levels shaded; above 0 = worse OOD)", fontsize=10
    )
    fig.tight_layout(rect=(0, 0, 1 - 1.6 / width, 1))
    path = out / "gap_vs_level.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _draw(ax: Any, c: GapCurve | None, color: str | None, label: str) -> None:
    if c is None:
        return
    ax.plot(c.x, c.mean, lw=1.3, color=color, label=label)
    ax.fill_between(c.x, c.lo, c.hi, color=color, alpha=0.18, lw=0)
