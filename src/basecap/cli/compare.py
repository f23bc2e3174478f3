"""The commands that put a new architecture beside the published ones: ``compare`` (its row, trained in a published
study's design: basecap.compare) and ``leaderboard`` (every architecture's row: basecap.leaderboard). Each is a
handler ``_cmd_<name>`` and the function that adds its parser ``add_<name>`` (listed in ``cli.build_parser``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .parse import Names, command

COMPARE_EPILOG = """examples:
  basecap compare kda --study results/architectures_rate_arms
  basecap compare --mixer-file my_mixer.py --study results/architectures_rate_arms
  basecap compare top1_chunk:selection=approx,chunk_len=16 --name top1_approx16 --study results/architectures_rate_arms --until-look 1
"""


def _cmd_compare(args):
    """Train a new architecture's runs in a published study's design (its learning rate tuned over the study's grid,
    then the study's seeds in the order of its plan, at the tuned rate and at the reference's rate), reuse the
    study's published reference runs, and print its row: the gap against the reference at matched in-domain loss in
    each rate arm with its interval and verdict, MQAR, state size, speed at 2k and 16k tokens, cost. Interrupted, the
    same command resumes. A study whose records do not match its design or this machine's corpus is refused."""
    from ..compare import CompareRequest, compare

    request = CompareRequest(
        mixer=args.mixer,
        study=args.study,
        mixer_files=args.mixer_file,
        name=args.name,
        experiment=args.experiment,
        size=args.size,
        sets=args.set,
        reuse=args.reuse,
        lrs=args.lr,
        until_look=args.until_look,
        out=args.out,
        work=args.work,
        mqar_steps=args.mqar_steps,
        mqar_seeds=args.mqar_seed,
        speed_lengths=args.speed_lengths,
        compile=args.compile,
    )
    compare(request)


def add_compare(sub) -> None:
    c = command(sub, "compare", _cmd_compare, "a new architecture's row: trained in a published study's design, beside its reference")
    c.epilog, c.formatter_class = COMPARE_EPILOG, argparse.RawDescriptionHelpFormatter
    c.add_argument("mixer", nargs="?", default=None, help="NAME or NAME:key=value,... (default: the one mixer --mixer-file registers)")
    c.add_argument(
        "--study", required=True, type=Path, metavar="DIR", help="a published study's results folder, e.g. results/architectures_rate_arms"
    )
    c.add_argument(
        "--mixer-file",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="a Python file that defines a mixer and registers it (basecap.mixers.register_mixer); imported first (repeatable)",
    )
    c.add_argument("--name", default=None, help="the architecture's run name (default: the mixer's name)")
    c.add_argument("--experiment", default=None, type=Path, help="the study's experiment file (default: the one claims.toml names for it)")
    c.add_argument("--size", default=None, help="the study's size (default: the one claims.toml names for it)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value of the study's design (repeatable)")
    c.add_argument(
        "--reuse", action="append", default=[], type=Path, metavar="DIR", help="another folder of published runs to take the reference's records from"
    )
    c.add_argument(
        "--lr",
        action="append",
        type=float,
        default=None,
        help="the learning-rate grid to tune over instead of the study's (repeatable; one: no tuning)",
    )
    c.add_argument("--until-look", type=int, default=None, metavar="K", help="stop after the K-th look of the study's plan (default: every seed)")
    c.add_argument("--out", default=None, type=Path, help="the results folder (default: results/compare-<name>-<study>)")
    c.add_argument("--work", default=None, type=Path, help="the training folder (default: runs/compare-<name>-<study>-<size>)")
    c.add_argument(
        "--mqar-steps", type=int, default=None, help="a shorter MQAR training than the principle's protocol (a quick check; the row says so)"
    )
    c.add_argument("--mqar-seed", action="append", type=int, default=None, help="MQAR seeds instead of the protocol's (repeatable)")
    c.add_argument(
        "--compile",
        action="store_true",
        help="train the new architecture's runs with train.compile (the reference's records stay as published; docs/performance.md)",
    )
    c.add_argument("--speed-lengths", nargs="*", type=int, default=None, metavar="T", help="speed at these lengths (default: 2048 16384; none: skip)")


def _cmd_leaderboard(args):
    """Write results/LEADERBOARD.md: every architecture with published results, one row each (parameters, in-domain
    loss, the gap against Transformer++ on each held-out domain with its interval, both rate arms where they exist,
    the verdict, MQAR, state size, CPU tokens per second, cost), read from results/scorecard.json, the studies'
    records and every results/*/compare.json; run `basecap scorecard` first for the claims' current readings."""
    from ..leaderboard import write_leaderboard

    path = write_leaderboard(args.root, args.sort)
    print(f"written: {path}")


def add_leaderboard(sub) -> None:
    lb = command(sub, "leaderboard", _cmd_leaderboard, "every architecture's row against Transformer++: results/LEADERBOARD.md")
    lb.add_argument(
        "--sort",
        default="gap",
        choices=Names("basecap.leaderboard", "SORTS"),
        metavar="COLUMN",
        help="the column the rows are sorted by (default: gap, smallest first)",
    )
    lb.add_argument("--root", default=".", help="the project root (results/ under it)")
