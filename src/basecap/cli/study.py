"""The commands over an experiment file or a study's runs: ``train``, ``run``, ``plan``, ``report``, ``scorecard`` and
``principle mqar``.
Each is a handler ``_cmd_<name>`` and the function that adds its parser ``add_<name>`` (listed in
``cli.build_parser``); handlers import what they call, so parsing stays quick."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .parse import command
from ..config_base import ConfigError


def experiment_args(sp) -> None:
    sp.add_argument("experiment", help="experiment TOML file (e.g. experiments/quickstart.toml)")
    sp.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, validated like the file (e.g. --set train.steps=100); repeatable",
    )


def _cmd_train(args):
    """Train every run of an experiment, or only those named with --run (a run's full name, or its base name
    for every sweep point of it). A tune experiment tunes first and trains the comparison at the chosen values.
    Finished runs are skipped; an interrupted run resumes from its last good checkpoint and continues with the
    same loss sequence."""
    from ..distributed import leave
    from ..experiment import train_experiment

    main_rank = int(os.environ.get("RANK", "0")) == 0
    for rc, final in train_experiment(args.experiment, args.set, args.run, reuse=args.reuse):
        if main_rank:
            print(
                f"{rc.run_id}: in-domain loss {final['in_domain_loss']:.4f}; "
                + ", ".join(f"{d} {v['loss']:.3f} ({v['bpb']:.3f} bpb)" for d, v in final["domains"].items())
            )
    leave()  # every rank finished: close a torchrun job's process group before the interpreter exits


REUSE_HELP = (
    "a study's output folder (e.g. runs/architectures-small) whose finished runs may stand in for runs of "
    "this one with the same config but for their name: copied, relabelled, not trained again (repeatable)"
)


def add_train(sub) -> None:
    t = command(sub, "train", _cmd_train, "train the runs of an experiment (resumes interrupted runs)")
    experiment_args(t)
    t.add_argument("--run", action="append", default=[], metavar="NAME", help="only this run (repeatable; NAME@KEY=VALUE: one tuning run)")
    t.add_argument("--reuse", action="append", default=[], type=Path, metavar="DIR", help=REUSE_HELP)


def _cmd_run(args):
    """Build the corpus if needed, train every run (skipping finished ones, resuming interrupted ones),
    evaluate each on the test split, and write the report. With --run, only the runs named (no report), so
    that two processes can share a study."""
    from ..experiment import run_experiment

    run_experiment(args.experiment, args.set, only=args.run, reuse=args.reuse)


def add_run(sub) -> None:
    u = command(sub, "run", _cmd_run, "the whole experiment: build data if needed, train, evaluate, report")
    experiment_args(u)
    u.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="NAME",
        help="only this run (repeatable): train, evaluate and run its suites, without the report, so that "
        "several processes can share a study; a last call without --run writes the report. In a tune experiment "
        "NAME@KEY=VALUE (e.g. based@lr=0.004) trains that one tuning run, so processes can share a run's tuning; "
        "the call naming the run chooses once all are trained",
    )
    u.add_argument("--reuse", action="append", default=[], type=Path, metavar="DIR", help=REUSE_HELP)


def _cmd_plan(args):
    """Build every run's model on the meta device and estimate parameters, FLOPs per token and wall time. Without
    --gpus or --gpu-type (and without CUDA) for this CPU: each run's training and evaluation tokens over a training
    rate measured here (--calibrate, stored in the data home) or published (results/*/runs/*/run.json), scaled to
    this CPU's stored peak; with them, memory per GPU and time for that many GPUs at an assumed MFU (docs/scaling.md)."""
    import sys

    from ..plan import format_plan, plan_experiment

    rows = plan_experiment(
        args.experiment,
        args.set,
        gpus=args.gpus,
        gpu=args.gpu_type,
        mfu=args.mfu,
        parallel=args.parallel,
        cpu_peak=None if args.cpu_peak is None else args.cpu_peak * 1e9,
        calibrate=args.calibrate,
        results=args.results or None,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(format_plan(rows, as_json=args.json))


def add_plan(sub) -> None:
    pl = command(sub, "plan", _cmd_plan, "parameters, FLOPs, wall time (and memory per GPU) of every run, before launching")
    experiment_args(pl)
    pl.add_argument("--gpus", type=int, default=None, help="plan for this many GPUs (default: this machine: its CUDA devices, else its CPU)")
    pl.add_argument(
        "--gpu-type",
        default=None,
        help="plan for GPUs of basecap.plan.GPUS, e.g. H100-80GB, or its short name, e.g. H100 (an unknown one lists them); "
        "default with --gpus: H100-80GB",
    )
    pl.add_argument(
        "--mfu",
        type=float,
        default=None,
        help="assumed model FLOPs utilisation (GPUs: default 0.4; CPU: in place of the measured or published rate)",
    )
    pl.add_argument("--parallel", choices=["ddp", "fsdp"], default=None, help="default: each run's train.parallel")
    pl.add_argument("--cpu-peak", type=float, default=None, metavar="GFLOPS", help="CPU: plan for this peak FLOP/s (default: this CPU's stored peak)")
    pl.add_argument(
        "--calibrate",
        action="store_true",
        help="CPU: measure every run's training rate here (a few optimizer steps of its model and batch) and store it in the data home",
    )
    pl.add_argument(
        "--results",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="CPU: a folder of published studies (DIR/*/runs/*/run.json) for the rates (repeatable; default: results/ above the experiment)",
    )
    pl.add_argument("--json", action="store_true")


def _cmd_report(args):
    """Write report.md, report.html and PNG plots: training curves, in-domain vs OOD loss over training, final
    losses and bits per byte, and each run's OOD gap to a reference run at matched in-domain loss. report.html embeds
    its plots (one self-contained file) unless the report is published (--archive, or written again into the results
    folder that holds its runs' records: ``report.core.is_published``), where it refers to the PNGs beside it;
    --embed-images / --no-embed-images decide it explicitly."""
    from ..report import report

    out = args.out or (Path(args.run_dirs[0]).parent / "report")
    if args.tuning is not None and not Path(args.tuning).is_file():
        raise ConfigError(f"--tuning {args.tuning}: no such file (a tune experiment writes <out_dir>/tuning.json)")
    design = None
    if args.compare is not None:
        from ..report.design import load_design

        design = load_design(args.compare)
    path = report(
        args.run_dirs,
        out,
        reference=args.reference,
        smooth=args.smooth,
        speed_json=args.speed,
        tuning_json=args.tuning,
        archive=args.archive,
        design=design,
        embed_images=args.embed_images,
    )
    print(path.read_text().split("## Figures")[0].rstrip())
    print(f"report: {path.parent / 'report.html'} (and report.md)")


def add_report(sub) -> None:
    r = command(sub, "report", _cmd_report, "tables and plots from run directories (report.md, report.html, PNGs)")
    r.add_argument("run_dirs", nargs="+")
    r.add_argument("--out", default=None, help="output folder (default: <parent of first run>/report)")
    r.add_argument(
        "--reference",
        default=None,
        action="append",
        help="run name to compare against (default: the first run); repeat it for an ablation of several base architectures: "
        "each run is then compared with the reference of its own mixer (model.mixer.name), else the first",
    )
    r.add_argument("--smooth", type=int, default=3, help="moving average over this many evaluations before matching")
    r.add_argument(
        "--compare",
        default=None,
        type=Path,
        metavar="TOML",
        help="a TOML file with a [compare] table (an experiment file, or the table alone): the comparison design "
        "to apply instead of the one of the runs' study (docs/metrics.md)",
    )
    r.add_argument("--speed", default=None, help="a `basecap bench mixers` JSON to include as the speed section")
    r.add_argument(
        "--tuning", default=None, help="a tune experiment's tuning.json: the tuning section (sweep plot, the choices, the gap at each fixed value)"
    )
    r.add_argument(
        "--archive",
        action="store_true",
        help="also copy every run's records (run.json, metrics.jsonl, eval.json, suite results; no checkpoints) "
        "to OUT/runs/, the --tuning file to OUT/ and its finished tuning runs' records to OUT/tuning_runs/, so "
        "`basecap report OUT/runs/* --out OUT --tuning OUT/tuning.json` writes the same report again from the "
        "results folder alone",
    )
    r.add_argument(
        "--embed-images",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="report.html holds its plots as data: URIs (one self-contained file), or with --no-embed-images refers to the "
        "PNGs beside it; default: embedded, except in a published results folder (--archive, or OUT holding the runs' "
        "records in OUT/runs/)",
    )


def _cmd_archive(args):
    """Keep finished runs' records (no checkpoints) under OUT/runs/, as ``report --archive`` does, without writing
    a report: a study still training keeps what is done, and a lost run folder continues from it with ``--reuse``.
    A run that has not finished (no done.json) is refused, naming it, and nothing is copied. With --compact, the
    given folders are kept records already (results/<study>/runs/*, tuning_runs/*): they are rewritten in place in
    the kept form (compressed metrics, short done.json, compact JSON; the same values), and nothing is copied."""
    from ..report.core import archive_runs
    from ..rundir import RunDir

    if (args.out is None) == (not args.compact):
        raise ConfigError("archive: give --out (copy the records there) or --compact (rewrite kept records in place), not both")
    missing = [d for d in args.run_dirs if not Path(d).is_dir()]
    if missing:
        raise ConfigError("not a run folder: " + ", ".join(missing))
    unfinished = [d for d in args.run_dirs if RunDir(d).read_done() is None]
    if unfinished:
        raise ConfigError("not finished (no done.json), nothing archived: " + ", ".join(unfinished))
    if args.compact:
        n = sum(len(RunDir(d).compact_records()) for d in args.run_dirs)
        print(f"rewrote {n} records of {len(args.run_dirs)} runs in the kept form")
        return
    dest = archive_runs(args.run_dirs, args.out)
    print(f"kept the records of {len(args.run_dirs)} runs in {dest}")


def add_archive(sub) -> None:
    a = command(sub, "archive", _cmd_archive, "keep finished runs' records (no checkpoints) under OUT/runs/, without a report")
    a.add_argument("run_dirs", nargs="+", help="finished run folders")
    a.add_argument("--out", default=None, help="the results folder; records go to OUT/runs/<run folder>/")
    a.add_argument(
        "--compact",
        action="store_true",
        help="rewrite the given kept records in place in the kept form (compressed metrics, short done.json, compact JSON; "
        "the same values) instead of copying them",
    )


def _cmd_scorecard(args):
    """Test every claim of the paper (experiments/paper/claims.toml) once, from the published studies' archived
    records, with one Holm family over the claims file; write results/SCORECARD.md and results/scorecard.json
    (with --write-readme also the README's Results section and each study README's generated block). --check
    writes nothing and fails when a committed file differs from what would be written; --against OLD_JSON writes
    nothing and prints each claim's verdict then and now."""
    from ..scorecard import build_scorecard
    from ..scorecard.render import generated_files, stale_files

    root = Path(args.root)
    card = build_scorecard(root, args.claims)
    if args.against:
        import json

        from ..scorecard.changes import format_changes, verdict_changes

        print(format_changes(verdict_changes(json.loads(Path(args.against).read_text(encoding="utf-8")), card)))
        return
    if args.simulate:
        import json

        from ..atomic import atomic_write
        from ..scorecard.simulate import simulate

        sim = simulate(card, args.simulate)
        atomic_write(root / "results" / "error_control.json", json.dumps(sim, indent=1) + "\n")
        for c in sim["configurations"] + sim["old_rule"]:
            print(f"{c['configuration']:45s} any false verdict {c['any_false']:.4f} (se {c['se']:.4f})")
        card = build_scorecard(root, args.claims)
    if args.figures:
        from ..scorecard.principle import FIGURE
        from ..scorecard.render_principle import plot_principle
        from ..scorecard.robust import plot_gap_along_training

        n = plot_gap_along_training(card, root / "results" / "scorecard_gap_vs_level.png")
        print(f"drew the gap along training of {n} claims: results/scorecard_gap_vs_level.png")
        if card.get("principle") and plot_principle(card["principle"], root / FIGURE):
            print(f"drew the principle's points: {FIGURE}")
        else:
            print("the principle's figure is not drawn: no point has both its gap and its MQAR accuracy yet")
    files = generated_files(card, root)
    if not (args.write_readme or args.check):
        files = {p: t for p, t in files.items() if p.parent == root / "results"}
    if args.check:
        stale = stale_files(files)
        if stale:
            raise ConfigError("out of date (run `basecap scorecard --write-readme`): " + ", ".join(map(str, stale)))
        print(f"scorecard: {len(files)} files up to date")
        return
    from ..atomic import atomic_write

    for p, t in files.items():
        atomic_write(p, t)
    print(files[root / "results" / "SCORECARD.md"].split("## Reused runs")[0].rstrip())
    print("written: " + ", ".join(str(p) for p in files))


def add_scorecard(sub) -> None:
    s = command(sub, "scorecard", _cmd_scorecard, "every claim of the paper tested once: results/SCORECARD.md")
    s.add_argument("--claims", default=None, help="claims file (default: experiments/paper/claims.toml)")
    s.add_argument("--root", default=".", help="the repository root with experiments/ and results/ (default: .)")
    s.add_argument(
        "--write-readme", action="store_true", help="also regenerate README.md's Results section and each results/<study>/README.md's generated block"
    )
    s.add_argument("--check", action="store_true", help="write nothing; fail when a generated file is out of date")
    s.add_argument(
        "--figures",
        action="store_true",
        help="also draw results/scorecard_gap_vs_level.png (each claim's gap along training) and results/principle_mqar_vs_gap.png",
    )
    s.add_argument(
        "--against",
        metavar="OLD_JSON",
        help="write nothing; print each claim's verdict and estimate in an earlier scorecard.json beside now's "
        "(an earlier commit's: git show REV:results/scorecard.json > old.json)",
    )
    s.add_argument(
        "--simulate",
        type=int,
        default=0,
        metavar="N",
        help="first simulate the family's chance of any false verdict under null configurations, N families each (results/error_control.json)",
    )


def _cmd_principle_mqar(args):
    """Measure the MQAR accuracy of the principle's points (experiments/paper/principle.toml) on its declared protocol
    and add them to results/principle/mqar.json: every point and MQAR seed, or those named with --point and --seed. A
    point and seed already in the file is skipped, so the command resumes, and several processes (one point each) can
    share the file."""
    from ..scorecard.claims import CLAIMS_FILE, load_claims
    from ..scorecard.mqar_points import measure
    from ..scorecard.principle import MQAR_FILE, PRINCIPLE_FILE, load_principle

    root = Path(args.root)
    claims = load_claims(root / CLAIMS_FILE, root)
    spec = load_principle(root / (args.principle or PRINCIPLE_FILE), claims, root)
    out = Path(args.out) if args.out else root / MQAR_FILE
    new = measure(spec, claims, root, out, args.point or None, args.seed or None, threads=args.threads)
    print(f"{len(new)} new point-seed result(s) in {out}")


def add_principle(sub) -> None:
    p = sub.add_parser("principle", help="the paper's principle as a claim: measure its points (principle.toml)")
    psub = p.add_subparsers(dest="principle_command", required=True, metavar="COMMAND")
    m = command(psub, "mqar", _cmd_principle_mqar, "MQAR accuracy of the principle's points on its protocol: results/principle/mqar.json")
    m.add_argument("--point", action="append", default=[], metavar="LABEL", help='only this point, by its label (e.g. "Mamba-2"); repeatable')
    m.add_argument("--seed", action="append", default=[], type=int, metavar="S", help="only this MQAR seed of the protocol; repeatable")
    m.add_argument("--threads", type=int, default=None, metavar="N", help="torch threads (default: torch's)")
    m.add_argument("--out", default=None, help="the JSON file (default: results/principle/mqar.json under --root)")
    m.add_argument("--principle", default=None, help="the principle file (default: experiments/paper/principle.toml)")
    m.add_argument("--root", default=".", help="the repository root with experiments/ and results/ (default: .)")
