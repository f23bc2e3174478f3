"""The report: ``report(run_dirs, out_dir)`` writes report.md, report.html, summary.json and the plots of a
set of run directories: training curves, the paper's central figure (in-domain loss vs OOD loss over
training, one curve per run), a final table of losses, bits per byte, the unigram baseline and each run's
context gain, and the OOD gap of every run against a reference run *at matched in-domain loss*, paired by
seed, with confidence intervals and Holm-corrected verdicts. The numbers come from ``report.analysis``
(definitions there and in docs/metrics.md), the tables from ``report.tables``, the figures from
``report.plots``; ``archive_runs`` keeps the runs' records beside the report.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import atomic_write, write_json
from ..config_base import ConfigError
from ..rundir import RunDir
from .analysis import summarize
from .page import render_html
from .plots import draw_plots
from .runs import load_run
from .stats import SMOOTH
from .summary import EXPERIMENT_FILE, build_summary, study_of
from .sweep import TUNING_RUNS, tuning_run_dir
from .tables import report_markdown

__all__ = ["archive_runs", "archive_tuning_runs", "is_published", "report"]


def archive_runs(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    """Copy the records of every run (``RunDir.records``: no checkpoints) to ``<out_dir>/runs/<run folder>/`` in their
    kept form (``RunDir.copy_records``: compressed metrics, compact JSON), so the report can be written again from the
    results folder alone: ``basecap report <out_dir>/runs/* --out <out_dir>``. A run already there (the report written
    again from its own archive) is brought to the kept form in place (``RunDir.compact_records``). Returns the runs
    folder."""
    dest = Path(out_dir) / "runs"
    by_name: dict[str, Path] = {}
    for d in run_dirs:  # two runs of one name would land in one folder, the second over the first
        p = Path(d).resolve()
        if p.name in by_name and by_name[p.name] != p:
            raise ConfigError(f"archive: {by_name[p.name]} and {p} are both run {p.name}; archive one (each goes to {dest / p.name})")
        by_name[p.name] = p
    for d in run_dirs:
        rd = RunDir(d)
        if rd.path.resolve().parent == dest.resolve():
            rd.compact_records()  # the report is being written again from its own archive
            continue
        rd.copy_records(dest / rd.name)
    parents = {Path(d).resolve().parent for d in run_dirs}
    if len(parents) == 1 and (exp := parents.pop() / EXPERIMENT_FILE).is_file() and exp.parent != dest.resolve():
        atomic_write(dest / EXPERIMENT_FILE, exp.read_text())  # the study's name and size (report.summary.study_of)
    return dest


def is_published(out_dir: str | Path, run_dirs: list[str | Path]) -> bool:
    """Whether a report written to ``out_dir`` from ``run_dirs`` belongs to a published results folder: every run is
    an archived record in ``<F>/runs/`` (``basecap report --archive``, ``basecap archive``) and ``out_dir`` is ``F``
    or a folder inside it other than ``runs/`` (``basecap report F/runs/* --out F`` writing a study again, or a
    second report beside it). Such a report.html refers to its PNGs instead of embedding them."""
    out = Path(out_dir).resolve()
    for d in run_dirs:
        archive = Path(d).resolve().parent
        if archive.name != "runs" or not out.is_relative_to(archive.parent) or out.is_relative_to(archive):
            return False
    return bool(run_dirs)


def report(
    run_dirs: list[str | Path],
    out_dir: str | Path,
    reference: str | list[str] | None = None,
    smooth: int = SMOOTH,
    speed_json: str | Path | None = None,
    tuning_json: str | Path | None = None,
    *,
    archive: bool = False,
    design: dict | None = None,
    embed_images: bool | None = None,
) -> Path:
    """Write report.md, report.html (every text escaped: ``report.page``), summary.json and PNG plots into ``out_dir``;
    returns the path of report.md. ``reference``: a run name, or several (each run is compared with the one of its own
    mixer, ``report.analysis``). ``tuning_json``: a tune experiment's choice, shown before the comparison.
    ``archive``: also keep every run's records under ``out_dir/runs/`` (``archive_runs``), and with
    ``tuning_json`` the finished tuning runs' records under ``out_dir/tuning_runs/`` (``archive_tuning_runs``).
    ``embed_images``: True, report.html holds its plots as data: URIs (one self-contained file); False, it refers to
    the PNGs beside it. None (the default) embeds them unless the report is published (``is_published``)."""
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise ValueError("report: no run directories given")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if embed_images is None:
        embed_images = not (archive or is_published(out, [r.dir for r in runs]))
    from .design import design_of

    summary = summarize(
        runs, reference, smooth=smooth, design={**design, "given": "report --compare"} if design is not None else design_of([r.dir for r in runs])
    )
    from .suites import suite_sections

    images = draw_plots(runs, out, summary)
    md = report_markdown(summary, runs)
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
    atomic_write(out / "report.html", render_html(md, images, link_from=None if embed_images else out))
    write_json(out / "summary.json", build_summary(summary, runs, *study_of([r.dir for r in runs])), allow_nan=False)
    if archive:
        archive_runs([r.dir for r in runs], out)
        if tuning_json is not None and Path(tuning_json).is_file():
            archive_tuning_runs(Path(tuning_json), out)
            if Path(tuning_json).resolve() != (out / "tuning.json").resolve():
                atomic_write(out / "tuning.json", Path(tuning_json).read_text())
    return out / "report.md"


def archive_tuning_runs(tuning_json: Path, out_dir: str | Path) -> Path:
    """Copy the records of every tuning run that ``tuning_json`` lists and whose folder holds them (beside the
    file, or in its ``tuning_runs/``) to ``<out_dir>/tuning_runs/``: the fixed-value table can then be written
    again from the results folder, and ``--reuse <out_dir>/tuning_runs`` stands them in for their runs (a study
    folder lost before its comparison seeds trained). Returns the folder."""
    tuning = json.loads(tuning_json.read_text())
    dest = Path(out_dir) / TUNING_RUNS
    for entry in tuning.get("runs", {}).values():
        for tried in entry["tried"]:
            for seed in tuning["seeds"]:
                src = tuning_run_dir(tuning_json.parent, tried["name"], seed)
                if src is not None and src.path.resolve().parent == dest.resolve():
                    src.compact_records()  # already kept here
                elif src is not None:
                    src.copy_records(dest / src.name)
    return dest
