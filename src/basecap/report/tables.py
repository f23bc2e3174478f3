"""The markdown of a report: the final table (losses, bits per byte, the unigram baseline, context gain), the
in-domain comparison, the OOD gaps at matched in-domain loss and the near-unigram warning, from the numbers
of ``report.analysis.summarize``; the sections of a comparison design come from ``report.design_page``."""

from __future__ import annotations

from .analysis import run_setting
from .baselines import NEAR_UNIGRAM_NATS
from .runs import Run


def report_markdown(summary: dict, runs: list[Run]) -> str:
    doms = summary["domains"]
    ind = set(runs[0].in_domains) if runs else set()
    settings = {run_setting(r) for r in runs}
    lines = [
        "# basecap report",
        "",
        f"Runs: {', '.join(sorted({r.run_id for r in runs}))}. In-domain: {', '.join(sorted(ind))}; "
        + (
            f"out-of-distribution: {', '.join(d for d in doms if d not in ind)}."
            if len(settings) == 1
            else "Training domains differ between runs: "
            + "; ".join(f"{r.name}: {', '.join(r.in_domains)}" for r in runs if r.seed == runs[0].seed)
            + "."
        ),
        "",
    ]
    lines += _reused_note(runs)
    lines += _near_unigram_note(summary)
    lines += _final_table(summary, ind)
    lines += _in_domain_table(summary)
    if summary.get("design"):
        from .design_page import design_sections

        lines += design_sections(summary)
    lines += _comparison_table(summary)
    if summary.get("design"):
        from .design_page import measure_sections

        lines += measure_sections(summary)
    lines += ["", "## Figures", "", "![training curves](training_curves.png)", "", "![in-domain vs OOD](indomain_vs_ood.png)", ""]
    if summary.get("design"):
        lines += ["", "![OOD gap against the matched level](gap_vs_level.png)", ""]
    return "\n".join(lines)


def _reused_note(runs: list[Run]) -> list[str]:
    """Runs copied from another study (``--reuse``): the same trainings, so a reader does not count them as
    replications."""
    copies = sorted((r.run_id, r.info["reused_from"]) for r in runs if r.info.get("reused_from"))
    if not copies:
        return []
    src = [f"`{rid}` (copy of `{f.get('run_dir') if isinstance(f, dict) else f}`)" for rid, f in copies]
    return [
        f"**Reused runs** ({len(copies)} of {len(runs)}; `--reuse`: copied from another study, the same training "
        f"and records, not a replication): {', '.join(src)}.",
        "",
    ]


def _near_unigram_note(summary: dict) -> list[str]:
    near = summary["near_unigram"]
    if not near:
        return []
    every = len(near) == len([r for r in summary["final"].values() if r.get("context_gain")])
    gains = ", ".join(f"{n} {summary['final'][n]['context_gain'][0]:.2f}" for n in near)
    return [
        f"> **Near unigram: OOD differences here are not about base capability.** "
        f"{'Every run gains' if every else 'These runs gain'} less than {NEAR_UNIGRAM_NATS:g} nat over the unigram "
        f"baseline (context gain, nats/token: {gains}): the models use little of their context beyond word "
        "frequencies, so a difference in OOD loss says little about how they generalise.",
        "",
    ]


def _final_table(summary: dict, ind: set[str]) -> list[str]:
    doms = summary["domains"]
    lines = [
        "## Final evaluation (mean ± std over seeds; loss in nats/token, bpb = bits per UTF-8 byte)",
        "",
        "unigram = the training mixture's token frequencies scored on the same windows (a model that ignores "
        f"its context); context gain = unigram in-domain loss - in-domain loss. A gain under {NEAR_UNIGRAM_NATS:g} nat "
        "marks a run as near unigram.",
        "",
    ]
    head = (
        "| run | params (non-emb) | steps | in-domain loss | context gain | "
        + " | ".join(f"{d}{'' if d in ind else ' (OOD)'} loss / bpb" for d in doms)
        + " |"
    )
    lines += [head, "|" + "---|" * (5 + len(doms))]
    baselines: dict[str, dict] = {}
    for name, row in summary["final"].items():
        if row["in_domain_loss"] is None:
            continue
        p = row["params"]
        gain = _fmt(*row["context_gain"]) if row["context_gain"] else "-"
        cells = [name, f"{p['total'] / 1e6:.2f}M ({p['non_embedding'] / 1e6:.2f}M)", str(row["steps"]), _fmt(*row["in_domain_loss"]), gain]
        cells += [f"{_fmt(*row[d]['loss'])} / {_fmt(*row[d]['bpb'])}" if d in row else "-" for d in doms]
        lines.append("| " + " | ".join(cells) + " |")
        if row["unigram"]:
            baselines.setdefault(", ".join(row["in_domains"]), row["unigram"])
    for setting, base in baselines.items():
        cells = [f"unigram ({setting})", "-", "-", f"{base['in_domain']:.3f}", "0"]
        cells += [f"{base['domains'][d]:.3f}" if d in base["domains"] else "-" for d in doms]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _refs(summary: dict) -> str:
    """The reference in a heading; several: each named, and how a run's is chosen."""
    refs = summary["references"]
    if len(refs) == 1:
        return f"`{refs[0]}`"
    return " / ".join(f"`{r}`" for r in refs) + " (each run against the reference of its own mixer)"


def _in_domain_table(summary: dict) -> list[str]:
    comps = summary.get("in_domain_comparisons") or []
    if not comps:
        return []
    lines = [
        "",
        f"## In-domain loss against {_refs(summary)} at the end of training",
        "",
        "Final in-domain loss minus the reference's (same seed, same training data and steps), paired by seed: "
        "how far each model got on its training domains with the same data. Positive = worse in-domain. 95% CI "
        "over seeds (Student t), paired t-test p, and Holm across the rows of this table (a family apart from the "
        "OOD gaps below).",
        "",
        "| run | against | seeds | in-domain difference [95% CI] | p | p (Holm) |",
        "|" + "---|" * 6,
    ]
    for c in comps:
        ci = f" [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]" if c["ci95"] else ""
        diff = "-" if c["mean_diff"] is None else f"{c['mean_diff']:+.3f}"
        lines.append(f"| {c['run']} | {c['reference']} | {c['n_seeds']} | {diff}{ci} | {_num(c['p'], 4)} | {_num(c['p_holm'], 4)} |")
    return lines


def _comparison_table(summary: dict) -> list[str]:
    comps = summary["comparisons"]
    if not comps:
        return []
    lines = [
        "",
        f"## OOD gap against {_refs(summary)} at matched in-domain loss",
        "",
        "Positive = worse out of distribution than the reference at the same in-domain loss, paired by seed. "
        + (
            _design_sentence(summary)
            if summary.get("design")
            else f"Curves are smoothed over {summary['smooth']} evaluations. Primary gap = mean gap over the lowest 30% of the "
            "common in-domain-loss range (the trained end), "
        )
        + "with its 95% confidence interval over seeds (Student t) and "
        "the paired t-test's p; p (Holm) corrects across the comparisons of this report (held-out domains and the "
        "domains a run trained on are two families). Verdicts come from the Holm-corrected test only (alpha 0.05); "
        "the interval in a verdict is the simultaneous one (Bonferroni, level 1 - 0.05/m for the m tests of its "
        "family), so unlike the per-comparison 95% CI it holds 0 whenever the corrected test does not reject. "
        "Whole-range mean and end gap (at the lowest in-domain loss both reached) are secondary. Seed sd = spread of the "
        "per-seed gaps; eval SE = bootstrap standard error of the final evaluation's difference over evaluation "
        "windows; noise = the larger of the two. Definitions: docs/metrics.md.",
        "",
        "| run | against | domain | seeds | primary gap [95% CI] | p | p (Holm) | whole-range mean | end gap | seed sd | eval SE | noise | verdict |",
        "|" + "---|" * 13,
    ]
    for c in comps:
        dom = f"{c['domain']} (in-domain for this run)" if c["in_domain_here"] else c["domain"]
        ci = f" [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]" if c["ci95"] else ""
        cells = [
            c["run"],
            c["reference"],
            dom,
            str(c["n_seeds"]),
            _num(c["mean_gap"]) + ci,
            _num(c["p"], 4),
            _num(c["p_holm"], 4),
            _num(c["secondary_mean_gap"]),
            _num(c["end_gap"]),
            _num(c["sd"]),
            _num(c["eval_se"], 4),
            c["dominant_noise"] or "-",
            c["verdict"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _design_sentence(summary: dict) -> str:
    from .design_page import band_text

    d = summary["design"]
    return (
        f"Primary gap (measure `{d['primary']}`, see the comparison design above) = mean gap over the study's in-domain band {band_text(d['band'])}, "
    )


def _num(v: float | None, p: int = 3) -> str:
    return "-" if v is None else f"{v:.{p}f}"


def _fmt(m: float, s: float | None, p: int = 3) -> str:
    return f"{m:.{p}f}" if s is None else f"{m:.{p}f} ± {s:.{p}f}"
