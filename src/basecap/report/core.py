"""The report: training curves, the paper's central figure (in-domain loss vs OOD loss over
training, one curve per run), a final table of losses, bits per byte, the unigram baseline and each
run's context gain, and the OOD gap of every run against a reference run *at matched in-domain loss*,
paired by seed, with confidence intervals and Holm-corrected verdicts (``report.stats``).

Matched-loss gap: each run's evaluations give points (in-domain loss x, OOD loss y). For a run and the
reference with the same seed, both curves (smoothed over ``smooth`` consecutive evaluations) are
interpolated on a common grid of x over the range both reached. The primary endpoint is the mean gap over
the lowest 30% of that range (the trained end); the whole-range mean and the end gap are secondary.
Definitions: docs/metrics.md.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from ..rundir import RunDir, atomic_write, write_json
from .baselines import NEAR_UNIGRAM_NATS, run_unigram, unigram_in_domain
from .page import render_html
from .runs import Run, load_run
from .stats import SMOOTH, RunCurves, apply_holm, build_comparisons, holm, matched_endpoints, paired_test
from .summary import EXPERIMENT_FILE, build_summary, study_of


def _curve(run: Run, domain: str) -> tuple[np.ndarray, np.ndarray]:
    """(in-domain loss, ``domain`` loss) at each evaluation, in training order."""
    return (np.array([e["in_domain_loss"] for e in run.evals]), np.array([e["domains"][domain]["loss"] for e in run.evals]))


def matched_gap(run: Run, ref: Run, domain: str, points: int = 50, smooth: int = 1) -> dict | None:
    """OOD loss of ``run`` minus ``ref`` at matched in-domain loss (``stats.matched_endpoints``): the primary
    endpoint, the whole-range mean, the end gap and the matched range; None when there is no gap."""
    xr, yr = _curve(run, domain)
    xf, yf = _curve(ref, domain)
    g = matched_endpoints(xr, yr, xf, yf, smooth=smooth, points=points)
    if not g.ok or g.matched_range is None:
        return None
    return {"primary": g.primary, "mean_gap": g.mean_gap, "end_gap": g.end_gap, "matched_range": list(g.matched_range)}


def _curves(run: Run) -> RunCurves:
    """The run's evaluation curves for ``report.stats``, with the final evaluation's per-window losses."""
    doms = [d for d in run.domains if all(d in e["domains"] for e in run.evals)]
    last = run.evals[-1]["domains"] if run.evals else {}
    return RunCurves(run.name, run.seed, [e["in_domain_loss"] for e in run.evals],
                     {d: [e["domains"][d]["loss"] for e in run.evals] for d in doms},
                     {d: last[d]["window_losses"] for d in doms if last[d].get("window_losses") is not None})


def _mean_std(vals: list[float]) -> tuple[float, float | None]:
    return (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else None)


def _fmt(m: float, s: float | None, p: int = 3) -> str:
    return f"{m:.{p}f}" if s is None else f"{m:.{p}f} ± {s:.{p}f}"


def _setting(run: Run) -> tuple:
    return tuple(sorted(run.in_domains))


def ood_domains(runs: list[Run]) -> list[str]:
    """Domains held out by at least one run (the mixed-domain control trains on them)."""
    return list(dict.fromkeys(d for r in runs for d in r.ood_domains))


def _reference_for(run: Run, runs: list[Run], refs: list[Run]) -> Run | None:
    """The reference run with the same seed and the same training domains. If the named reference was
    trained on other domains (a limited-vs-mixed study), use the run of this setting that has the
    reference's architecture (same model config)."""
    for ref in refs:
        if ref.seed == run.seed and _setting(ref) == _setting(run):
            return ref
    if not refs:
        return None
    arch = refs[0].info["config"]["model"]
    for r in runs:
        if r.seed == run.seed and _setting(r) == _setting(run) and r.info["config"]["model"] == arch:
            return r
    return None


def summarize(runs: list[Run], reference: str | None = None, smooth: int = SMOOTH, design: dict | None = None) -> dict:
    """Final losses with the unigram baseline and context gain of every run name (mean, sd over seeds),
    and the statistics of every comparison against the reference (``report.stats``). With a study's comparison
    ``design`` (its ``[compare]`` table, ``report.design``) the comparisons are those of its primary measure,
    with every other measure, the limited-vs-mixed interaction and the target strata beside them."""
    groups = _by_name(runs)
    names = list(groups)
    reference = reference if reference in groups else (names[0] if names else None)
    domains = sorted({d for r in runs for d in r.domains}, key=lambda d: (d not in runs[0].in_domains, d))
    final = {name: _final_row(rs, domains) for name, rs in groups.items()}
    near = [n for n, row in final.items() if row.get("context_gain") and row["context_gain"][0] < NEAR_UNIGRAM_NATS]
    comps = _comparisons(runs, groups, reference, smooth) if reference else []
    in_comps = _in_domain_comparisons(runs, groups, reference) if reference else []
    out = {"reference": reference, "domains": domains, "smooth": smooth, "final": final, "comparisons": comps,
           "in_domain_comparisons": in_comps, "near_unigram": near}
    if design and design.get("band") and reference:
        out.update(_designed(runs, groups, reference, smooth, design, comps))
    return out


def _designed(runs: list[Run], groups: dict[str, list[Run]], reference: str, smooth: int, design: dict, legacy: list[dict]) -> dict:
    """The comparisons of every measure of the design (``report.design``), its primary one first."""
    from .design import interactions, measure_comparisons, measures, strata_shares

    ms, primary = measures(design)
    by_measure = {"legacy": legacy}
    for m in ms:
        if m.name != "legacy":
            by_measure[m.name] = _families(measure_comparisons(_pairs(runs, groups, reference), m, design, ood_domains(runs), smooth), groups)
    return {"comparisons": by_measure[primary], "design": {**design, "primary": primary}, "comparisons_by_measure": by_measure,
            "interactions": interactions(by_measure, primary, runs), "strata_shares": strata_shares(runs)}


def _pairs(runs: list[Run], groups: dict[str, list[Run]], reference: str) -> list[tuple[Run, Run]]:
    return [(r, ref) for rs in groups.values() for r in rs
            for ref in [_reference_for(r, runs, groups[reference])] if ref is not None and ref is not r]


def _families(comps: list[dict], groups: dict[str, list[Run]]) -> list[dict]:
    """Holm within two families: domains held out by the run, and domains the run trained on (the control)."""
    for c in comps:
        c["in_domain_here"] = c["domain"] in groups[c["run"]][0].in_domains
        c["holm_family"] = "trained-on domains" if c["in_domain_here"] else "held-out domains"
    for here in (False, True):
        apply_holm([c for c in comps if c["in_domain_here"] is here])
    return comps


def _final_row(rs: list[Run], domains: list[str]) -> dict:
    """Final evaluation of one run name over its seeds: losses and bpb, the unigram baseline on the same
    windows, and the context gain (unigram in-domain loss - model in-domain loss)."""
    done = [r for r in rs if r.evals]
    row = {"seeds": [r.seed for r in done], "params": rs[0].info["params"], "in_domains": rs[0].in_domains,
           "steps": max((r.evals[-1]["step"] for r in done), default=0)}
    row["in_domain_loss"] = _mean_std([r.evals[-1]["in_domain_loss"] for r in done]) if done else None
    for d in domains:
        vals = [r.evals[-1]["domains"][d] for r in done if d in r.evals[-1]["domains"]]
        if vals:
            row[d] = {"loss": _mean_std([v["loss"] for v in vals]), "bpb": _mean_std([v["bpb"] for v in vals])}
    weights = rs[0].info["config"]["data"]["train_weights"]
    gains, base = [], None
    for r in done:
        uni = run_unigram(r)
        ui = unigram_in_domain(uni, weights) if uni else None
        if ui is not None:
            base = base or {"in_domain": ui, "domains": uni}
            gains.append(ui - r.evals[-1]["in_domain_loss"])
    row["unigram"] = base
    row["context_gain"] = _mean_std(gains) if gains else None
    return row


def _comparisons(runs: list[Run], groups: dict[str, list[Run]], reference: str, smooth: int) -> list[dict]:
    """Every run against the reference run of its seed and training setting, per OOD domain. Holm corrects
    within two families: domains held out by the run (the study's questions) and domains the run trained on
    (the mixed-domain control), so a control does not dilute the held-out tests nor the reverse."""
    pairs = _pairs(runs, groups, reference)
    return _families(build_comparisons([(_curves(r), _curves(ref)) for r, ref in pairs], ood_domains(runs), smooth=smooth), groups)


def _in_domain_comparisons(runs: list[Run], groups: dict[str, list[Run]], reference: str) -> list[dict]:
    """Every run name against the reference on its own training domains at the end of training: the final
    in-domain loss minus the reference's (the run of the same seed and training setting, evaluated at the
    same step; in a mixed-domain control, the reference's architecture trained on the same mixture), paired
    by seed, with the paired t-test and a Holm correction across these comparisons (a family of their own,
    apart from the OOD gaps). Positive = worse in-domain. Not a matched-loss quantity:
    it says how far each model got with the same data, which the OOD gap at matched loss deliberately
    sets aside."""
    diffs: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    notes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, rs in groups.items():
        for r in rs:
            ref = _reference_for(r, runs, groups[reference])
            if ref is None or ref is r or not r.evals or not ref.evals:
                continue  # the reference itself, or its architecture in another training setting
            key = (name, ref.name)
            if r.evals[-1]["step"] != ref.evals[-1]["step"]:
                notes[key].append(f"seed {r.seed}: final evaluations at different steps "
                                  f"({r.evals[-1]['step']} against {ref.evals[-1]['step']}); left out")
                continue
            diffs[key].append((r.seed, r.evals[-1]["in_domain_loss"] - ref.evals[-1]["in_domain_loss"]))
    out: list[dict] = []
    for key in dict.fromkeys([*diffs, *notes]):
        pairs = sorted(diffs.get(key, []))
        t = paired_test([d for _, d in pairs])
        out.append({"run": key[0], "reference": key[1], "n_seeds": t.n, "seeds": [s for s, _ in pairs],
                    "per_seed": [d for _, d in pairs], "mean_diff": t.mean, "sd": t.sd,
                    "ci95": list(t.ci95) if t.ci95 else None, "p": t.p,
                    "notes": notes.get(key, []) + ([t.note] if t.note else [])})
    for c, ph in zip(out, holm([c["p"] for c in out])):
        c["p_holm"] = ph
    return out


def _legend_label(r: Run, seeds: Counter, labelled: set[str]) -> str:
    """Legend label of the curve of ``r`` in one panel: one entry per run name (its seeds share a colour), on the
    first of its curves drawn there (``labelled`` holds the names already labelled); matplotlib leaves
    ``_nolegend_`` out."""
    if r.name in labelled:
        return "_nolegend_"
    labelled.add(r.name)
    return f"{r.name} ({seeds[r.name]} seeds)" if seeds[r.name] > 1 else r.run_id


def _plots(runs: list[Run], out: Path, summary: dict) -> list[Path]:
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
            ax.plot(steps[k - 1:], sm, color=colors[r.name], lw=1, label=_legend_label(r, seeds, labelled))
    ax.set(xlabel="step", ylabel="training loss (nats/token)", title="Training curves")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "training_curves.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    ood = ood_domains(runs)
    if ood:
        # the legend gets a strip of its own to the right, as wide as its longest label
        legend_in = 0.5 + 0.055 * max((len(_legend_label(r, seeds, set())) for r in runs), default=0)
        width = 4.2 * len(ood) + legend_in
        fig, axes = plt.subplots(1, len(ood), figsize=(width, 3.8), squeeze=False)
        for ax, d in zip(axes[0], ood):
            labelled = set()
            for r in runs:
                if r.evals:
                    x, y = _curve(r, d)
                    ax.plot(x, y, "-o", ms=2.5, lw=1, color=colors[r.name], label=_legend_label(r, seeds, labelled))
            ax.invert_xaxis()
            ax.set(xlabel="in-domain validation loss", ylabel=f"{d} loss", title=f"{d}")
        # one legend for the figure, beside the panels: inside one it would cover the curves it names
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
        fig.suptitle("In-domain vs out-of-distribution loss over training (training runs left to right; "
                     "at the same in-domain loss, lower is better)", fontsize=10)
        fig.tight_layout(rect=(0, 0, 1 - legend_in / width, 1))
        paths.append(out / "indomain_vs_ood.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    if summary.get("design"):
        from .design_page import gap_level_plot

        paths += gap_level_plot(runs, summary, out, colors, _pairs(runs, _by_name(runs), summary["reference"]))
    return paths


def _by_name(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        groups[r.name].append(r)
    return groups


def _markdown(summary: dict, runs: list[Run]) -> str:
    doms = summary["domains"]
    ind = set(runs[0].in_domains) if runs else set()
    settings = {_setting(r) for r in runs}
    lines = ["# basecap report", "",
             f"Runs: {', '.join(sorted({r.run_id for r in runs}))}. In-domain: {', '.join(sorted(ind))}; " +
             (f"out-of-distribution: {', '.join(d for d in doms if d not in ind)}." if len(settings) == 1 else
              "Training domains differ between runs: " + "; ".join(f"{r.name}: {', '.join(r.in_domains)}" for r in runs if r.seed == runs[0].seed) + "."), ""]
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


def _near_unigram_note(summary: dict) -> list[str]:
    near = summary["near_unigram"]
    if not near:
        return []
    every = len(near) == len([r for r in summary["final"].values() if r.get("context_gain")])
    gains = ", ".join(f"{n} {summary['final'][n]['context_gain'][0]:.2f}" for n in near)
    return [f"> **Near unigram: OOD differences here are not about base capability.** "
            f"{'Every run gains' if every else 'These runs gain'} less than {NEAR_UNIGRAM_NATS:g} nat over the unigram "
            f"baseline (context gain, nats/token: {gains}): the models use little of their context beyond word "
            "frequencies, so a difference in OOD loss says little about how they generalise.", ""]


def _final_table(summary: dict, ind: set[str]) -> list[str]:
    doms = summary["domains"]
    lines = ["## Final evaluation (mean ± std over seeds; loss in nats/token, bpb = bits per UTF-8 byte)", "",
             "unigram = the training mixture's token frequencies scored on the same windows (a model that ignores "
             f"its context); context gain = unigram in-domain loss - in-domain loss. A gain under {NEAR_UNIGRAM_NATS:g} nat "
             "marks a run as near unigram.", ""]
    head = "| run | params (non-emb) | steps | in-domain loss | context gain | " + \
        " | ".join(f"{d}{'' if d in ind else ' (OOD)'} loss / bpb" for d in doms) + " |"
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


def _in_domain_table(summary: dict) -> list[str]:
    comps = summary.get("in_domain_comparisons") or []
    if not comps:
        return []
    lines = ["", f"## In-domain loss against `{summary['reference']}` at the end of training", "",
             "Final in-domain loss minus the reference's (same seed, same training data and steps), paired by seed: "
             "how far each model got on its training domains with the same data. Positive = worse in-domain. 95% CI "
             "over seeds (Student t), paired t-test p, and Holm across the rows of this table (a family apart from the "
             "OOD gaps below).", "",
             "| run | against | seeds | in-domain difference [95% CI] | p | p (Holm) |", "|" + "---|" * 6]
    for c in comps:
        ci = f" [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]" if c["ci95"] else ""
        diff = "-" if c["mean_diff"] is None else f"{c['mean_diff']:+.3f}"
        lines.append(f"| {c['run']} | {c['reference']} | {c['n_seeds']} | {diff}{ci} | {_num(c['p'], 4)} | "
                     f"{_num(c['p_holm'], 4)} |")
    return lines


def _comparison_table(summary: dict) -> list[str]:
    comps = summary["comparisons"]
    if not comps:
        return []
    lines = ["", f"## OOD gap against `{summary['reference']}` at matched in-domain loss", "",
             "Positive = worse out of distribution than the reference at the same in-domain loss, paired by seed. "
             + (_design_sentence(summary) if summary.get("design") else
                f"Curves are smoothed over {summary['smooth']} evaluations. Primary gap = mean gap over the lowest 30% of the "
                "common in-domain-loss range (the trained end), ") +
             "with its 95% confidence interval over seeds (Student t) and "
             "the paired t-test's p; p (Holm) corrects across the comparisons of this report (held-out domains and the "
             "domains a run trained on are two families). Verdicts come from the Holm-corrected test only (alpha 0.05); "
             "the interval in a verdict is the simultaneous one (Bonferroni, level 1 - 0.05/m for the m tests of its "
             "family), so unlike the per-comparison 95% CI it holds 0 whenever the corrected test does not reject. "
             "Whole-range mean and end gap (at the lowest in-domain loss both reached) are secondary. Seed sd = spread of the "
             "per-seed gaps; eval SE = bootstrap standard error of the final evaluation's difference over evaluation "
             "windows; noise = the larger of the two. Definitions: docs/metrics.md.", "",
             "| run | against | domain | seeds | primary gap [95% CI] | p | p (Holm) | whole-range mean | end gap | seed sd | eval SE | noise | verdict |",
             "|" + "---|" * 13]
    for c in comps:
        dom = f"{c['domain']} (in-domain for this run)" if c["in_domain_here"] else c["domain"]
        ci = f" [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]" if c["ci95"] else ""
        cells = [c["run"], c["reference"], dom, str(c["n_seeds"]), _num(c["mean_gap"]) + ci, _num(c["p"], 4),
                 _num(c["p_holm"], 4), _num(c["secondary_mean_gap"]), _num(c["end_gap"]), _num(c["sd"]),
                 _num(c["eval_se"], 4), c["dominant_noise"] or "-", c["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _design_sentence(summary: dict) -> str:
    d = summary["design"]
    return (f"Primary gap (measure `{d['primary']}`, see the comparison design above) = mean gap over the study's in-domain band "
            f"{d['band'][0]:g}-{d['band'][1]:g}, ")


def _num(v: float | None, p: int = 3) -> str:
    return "-" if v is None else f"{v:.{p}f}"


def archive_runs(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    """Copy the records of every run (``RunDir.records``: no checkpoints) to ``<out_dir>/runs/<run folder>/``,
    so the report can be written again from the results folder alone:
    ``basecap report <out_dir>/runs/* --out <out_dir>``. Returns the runs folder."""
    dest = Path(out_dir) / "runs"
    for d in run_dirs:
        rd = RunDir(d)
        if rd.path.resolve().parent == dest.resolve():
            continue  # the report is being written again from its own archive
        rd.copy_records(dest / rd.name)  # metrics.jsonl compressed (metrics.jsonl.zst)
    parents = {Path(d).resolve().parent for d in run_dirs}
    if len(parents) == 1 and (exp := parents.pop() / EXPERIMENT_FILE).is_file() and exp.parent != dest.resolve():
        atomic_write(dest / EXPERIMENT_FILE, exp.read_text())  # the study's name and size (report.summary.study_of)
    return dest


def report(run_dirs: list[str | Path], out_dir: str | Path, reference: str | None = None, smooth: int = SMOOTH,
           speed_json: str | Path | None = None, tuning_json: str | Path | None = None, archive: bool = False,
           design: dict | None = None) -> Path:
    """Write report.md, report.html (self-contained, every text escaped: ``report.page``), summary.json and PNG
    plots into ``out_dir``;
    returns the path of report.md. ``tuning_json``: a tune experiment's choice, shown before the comparison.
    ``archive``: also keep every run's records under ``out_dir/runs/`` (``archive_runs``)."""
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise ValueError("report: no run directories given")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .design import design_of

    summary = summarize(runs, reference, smooth=smooth, design={**design, "given": "report --compare"} if design is not None else design_of([r.dir for r in runs]))
    from .suites import suite_sections

    images = _plots(runs, out, summary)
    md = _markdown(summary, runs)
    extra, extra_images = suite_sections(runs, out, speed_json)
    if extra:
        head, figs = md.split("## Figures")
        md = head.rstrip() + "\n" + "\n".join(extra) + "\n\n## Figures" + figs
        md += "".join(f"\n![{p.stem}]({p.name})\n" for p in extra_images)
        images += extra_images
    if tuning_json is not None:
        from .sweep import add_sweep_section

        md, images = add_sweep_section(md, images, tuning_json, out, reference=summary["reference"])
    atomic_write(out / "report.md", md)
    atomic_write(out / "report.html", render_html(md, images))
    write_json(out / "summary.json", build_summary(summary, runs, *study_of([r.dir for r in runs])), allow_nan=False)
    if archive:
        archive_runs([r.dir for r in runs], out)
        if tuning_json is not None and Path(tuning_json).resolve() != (out / "tuning.json").resolve():
            atomic_write(out / "tuning.json", Path(tuning_json).read_text())
    return out / "report.md"
