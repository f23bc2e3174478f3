"""The report: training curves, the paper's central figure (in-domain loss vs OOD loss over
training, one curve per run), a final table of losses and bits per byte, and the OOD gap of every
run against a reference run *at matched in-domain loss*, paired by seed.

Matched-loss gap: each run's evaluations give points (in-domain loss x, OOD loss y). For a run and
the reference with the same seed, both curves are interpolated on a common grid of x over the range
both reached; the gap is the mean of y_run - y_ref over that grid ("mean gap") and its value at the
lowest in-domain loss both reached ("end gap"). Over seeds we report mean and standard deviation,
and call a gap significant only when |mean| exceeds the seed spread (and there are >= 2 seeds).
"""

from __future__ import annotations

import base64
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..rundir import RunDir, atomic_write, write_json


@dataclass
class Run:
    dir: Path
    run_id: str
    name: str
    seed: int
    info: dict
    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)

    @property
    def in_domains(self) -> list[str]:
        w = self.info["config"]["data"]["train_weights"]
        return [d for d, v in w.items() if v > 0]

    @property
    def domains(self) -> list[str]:
        return list(self.evals[-1]["domains"]) if self.evals else []

    @property
    def ood_domains(self) -> list[str]:
        return [d for d in self.domains if d not in self.in_domains]


def load_run(run_dir: str | Path) -> Run:
    rd = RunDir(run_dir)
    info = rd.read_info()
    cfg = info["config"]
    run = Run(rd.path, info["run_id"], cfg["name"], cfg["seed"], info)
    for rec in rd.read_metrics():
        (run.evals if rec.get("kind") == "eval" else run.train).append(rec)
    return run


def _curve(run: Run, domain: str, smooth: int = 1) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([e["in_domain_loss"] for e in run.evals])
    y = np.array([e["domains"][domain]["loss"] for e in run.evals])
    if smooth > 1 and len(x) >= smooth:  # moving average over consecutive evaluations
        k = np.ones(smooth) / smooth
        x, y = np.convolve(x, k, "valid"), np.convolve(y, k, "valid")
    return x, y


def matched_gap(run: Run, ref: Run, domain: str, points: int = 50, smooth: int = 1) -> dict | None:
    """OOD loss of ``run`` minus ``ref`` at matched in-domain loss (see module docstring)."""
    xr, yr = _curve(run, domain, smooth)
    xf, yf = _curve(ref, domain, smooth)
    if len(xr) < 2 or len(xf) < 2:
        return None
    lo, hi = max(xr.min(), xf.min()), min(xr.max(), xf.max())
    if not lo < hi:
        return None
    grid = np.linspace(lo, hi, points)
    # in-domain loss falls over training (not always monotonically): interpolate on the x-sorted points
    def interp(x, y):
        o = np.argsort(x)
        return np.interp(grid, x[o], y[o])

    diff = interp(xr, yr) - interp(xf, yf)
    return {"mean_gap": float(diff.mean()), "end_gap": float(diff[0]), "matched_range": [float(lo), float(hi)]}


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


def summarize(runs: list[Run], reference: str | None = None, smooth: int = 1) -> dict:
    groups: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        groups[r.name].append(r)
    names = list(groups)
    reference = reference if reference in groups else (names[0] if names else None)
    domains = sorted({d for r in runs for d in r.domains}, key=lambda d: (d not in runs[0].in_domains, d))
    final = {}
    for name, rs in groups.items():
        done = [r for r in rs if r.evals]
        row = {"seeds": [r.seed for r in done], "params": rs[0].info["params"], "steps": max((r.evals[-1]["step"] for r in done), default=0)}
        row["in_domain_loss"] = _mean_std([r.evals[-1]["in_domain_loss"] for r in done]) if done else None
        for d in domains:
            vals = [r.evals[-1]["domains"][d] for r in done if d in r.evals[-1]["domains"]]
            if vals:
                row[d] = {"loss": _mean_std([v["loss"] for v in vals]), "bpb": _mean_std([v["bpb"] for v in vals])}
        final[name] = row
    gaps = {}
    ood = ood_domains(runs)
    if reference:
        for name, rs in groups.items():
            for d in ood:
                pairs = [(r, ref) for r in rs for ref in [_reference_for(r, runs, groups[reference])] if ref is not None and ref is not r]
                per_seed = [g for r, ref in pairs for g in [matched_gap(r, ref, d, smooth=smooth)] if g]
                if not per_seed:
                    continue
                m, s = _mean_std([g["mean_gap"] for g in per_seed])
                em, es = _mean_std([g["end_gap"] for g in per_seed])
                gaps.setdefault(name, {})[d] = {
                    "mean_gap": m, "mean_gap_std": s, "end_gap": em, "end_gap_std": es, "n_seeds": len(per_seed),
                    "significant": bool(s is not None and abs(m) > s), "against": pairs[0][1].name,
                    "in_domain_here": d in rs[0].in_domains,
                }
    return {"reference": reference, "domains": domains, "final": final, "gaps": gaps}


def _plots(runs: list[Run], out: Path, summary: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.name for r in runs))
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    paths = []

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in runs:
        if r.train:
            steps = np.array([t["step"] for t in r.train])
            loss = np.array([t["loss"] for t in r.train])
            k = max(1, len(loss) // 50)
            sm = np.convolve(loss, np.ones(k) / k, "valid")
            ax.plot(steps[k - 1:], sm, color=colors[r.name], lw=1, label=r.run_id)
    ax.set(xlabel="step", ylabel="training loss (nats/token)", title="Training curves")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "training_curves.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    ood = ood_domains(runs)
    if ood:
        fig, axes = plt.subplots(1, len(ood), figsize=(4.2 * len(ood), 3.8), squeeze=False)
        for ax, d in zip(axes[0], ood):
            for r in runs:
                if r.evals:
                    x, y = _curve(r, d)
                    ax.plot(x, y, "-o", ms=2.5, lw=1, color=colors[r.name], label=r.run_id)
            ax.invert_xaxis()
            ax.set(xlabel="in-domain validation loss", ylabel=f"{d} loss", title=f"{d}")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("In-domain vs out-of-distribution loss over training (lower-left is better)", fontsize=10)
        fig.tight_layout()
        paths.append(out / "indomain_vs_ood.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def _markdown(summary: dict, runs: list[Run]) -> str:
    doms = summary["domains"]
    ind = set(runs[0].in_domains) if runs else set()
    settings = {_setting(r) for r in runs}
    lines = ["# basecap report", "",
             f"Runs: {', '.join(sorted({r.run_id for r in runs}))}. In-domain: {', '.join(sorted(ind))}; " +
             (f"out-of-distribution: {', '.join(d for d in doms if d not in ind)}." if len(settings) == 1 else
              "Training domains differ between runs: " + "; ".join(f"{r.name}: {', '.join(r.in_domains)}" for r in runs if r.seed == runs[0].seed) + "."), "",
             "## Final evaluation (mean ± std over seeds; loss in nats/token, bpb = bits per UTF-8 byte)", ""]
    head = "| run | params (non-emb) | steps | in-domain loss | " + " | ".join(f"{d}{'' if d in ind else ' (OOD)'} loss / bpb" for d in doms) + " |"
    lines += [head, "|" + "---|" * (4 + len(doms))]
    for name, row in summary["final"].items():
        if row["in_domain_loss"] is None:
            continue
        p = row["params"]
        cells = [name, f"{p['total'] / 1e6:.2f}M ({p['non_embedding'] / 1e6:.2f}M)", str(row["steps"]), _fmt(*row["in_domain_loss"])]
        cells += [f"{_fmt(*row[d]['loss'])} / {_fmt(*row[d]['bpb'])}" if d in row else "-" for d in doms]
        lines.append("| " + " | ".join(cells) + " |")
    if summary["gaps"]:
        lines += ["", f"## OOD gap against `{summary['reference']}` at matched in-domain loss", "",
                  "Positive = worse out of distribution than the reference at the same in-domain loss. "
                  "Mean over the common in-domain-loss range; end = at the lowest in-domain loss both reached. "
                  "Significant only when |mean| exceeds the spread over seeds.", "",
                  "| run | against | domain | mean gap | end gap | seeds | verdict |", "|---|---|---|---|---|---|---|"]
        for name, per in summary["gaps"].items():
            for d, g in per.items():
                verdict = ("significant" if g["significant"] else "within seed spread") if g["n_seeds"] > 1 else "1 seed: no spread"
                dom = f"{d} (in-domain for this run)" if g["in_domain_here"] else d
                lines.append(f"| {name} | {g['against']} | {dom} | {_fmt(g['mean_gap'], g['mean_gap_std'])} | {_fmt(g['end_gap'], g['end_gap_std'])} | {g['n_seeds']} | {verdict} |")
    lines += ["", "## Figures", "", "![training curves](training_curves.png)", "", "![in-domain vs OOD](indomain_vs_ood.png)", ""]
    return "\n".join(lines)


def _html(md: str, images: list[Path]) -> str:
    body = []
    in_table = False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-"):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                body.append("<table>")
                in_table = True
            body.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("!["):
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{line.lstrip('#').strip()}</h{level}>")
        elif line.strip():
            body.append(f"<p>{line}</p>")
    if in_table:
        body.append("</table>")
    for img in images:
        data = base64.b64encode(img.read_bytes()).decode()
        body.append(f'<p><img alt="{img.stem}" src="data:image/png;base64,{data}"></p>')
    style = "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:3px 8px;font-size:13px}img{max-width:100%}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>basecap report</title><style>{style}</style></head><body>{''.join(body)}</body></html>"


def report(run_dirs: list[str | Path], out_dir: str | Path, reference: str | None = None, smooth: int = 1,
           speed_json: str | Path | None = None, tuning_json: str | Path | None = None) -> Path:
    """Write report.md, report.html (self-contained), summary.json and PNG plots into ``out_dir``;
    returns the path of report.md. ``tuning_json``: a tune experiment's choice, shown before the comparison."""
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise ValueError("report: no run directories given")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(runs, reference, smooth=smooth)
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

        md, images = add_sweep_section(md, images, tuning_json, out)
    atomic_write(out / "report.md", md)
    atomic_write(out / "report.html", _html(md, images))
    write_json(out / "summary.json", summary)
    return out / "report.md"
