"""The ``basecap`` command line: a thin layer over the Python API (basecap.data, basecap.train,
basecap.eval, basecap.report, basecap.experiment).

Each command is a handler ``_cmd_<name>`` and the function that adds its parser ``add_<name>``, in
``study`` (commands over an experiment or a study's runs), ``tools`` (a corpus, one run, the
registries, this machine) or ``compare`` (a new architecture's row, the leaderboard); ``build_parser`` lists them. Handlers import what they call, so parsing stays
quick. Names a command accepts (suites, presets, benchmarks) come from their registries, never from a list
typed here.
"""

from __future__ import annotations

import argparse
import sys

from .compare import add_compare, add_leaderboard
from .study import add_archive, add_plan, add_principle, add_report, add_run, add_scorecard, add_train
from .tools import add_anneal, add_bench, add_data, add_eval, add_export, add_mixers, add_peak


EPILOG = """examples:
  basecap run experiments/quickstart.toml            build data, train every run, evaluate, report
  basecap run experiments/quickstart.toml --set train.steps=50
  basecap data build                                 build the default corpus (cached)
  basecap train experiments/quickstart.toml --run transformer_pp
  basecap eval runs/quickstart/transformer_pp-s0     test-split loss and bits/byte per domain
  basecap report runs/quickstart/*-s0 --out my_report
  basecap archive runs/quickstart/*-s0 --out results/quickstart   keep finished runs' records, no report
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="basecap",
        description="Pre-train language models of many architectures on limited domains, "
        "test them out of distribution, compare. Every command is also a Python call.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        add_data,
        add_train,
        add_eval,
        add_report,
        add_run,
        add_mixers,
        add_export,
        add_plan,
        add_bench,
        add_peak,
        add_scorecard,
        add_compare,
        add_leaderboard,
        add_principle,
        add_anneal,
        add_archive,
    ):
        add(sub)
    return p


# Errors a user can act on from their message alone: printed as one line (by every rank under torchrun),
# exit status 2. Named, not imported, so that parsing the command line imports nothing heavy.
USER_ERRORS = frozenset(
    {
        "basecap.config_base.ConfigError",
        "builtins.FileNotFoundError",
        "basecap.rundir.RunDirBusy",
        "basecap.checkpoint.CheckpointError",
        "basecap.train.TrainingDiverged",
        "basecap.data.source_base.DataError",
    }
)


def _is_user_error(e: BaseException) -> bool:
    return any(f"{c.__module__}.{c.__qualname__}" in USER_ERRORS for c in type(e).__mro__)


def _wait_for_peers(timeout_s: float = 10.0):
    """Under torchrun, a rank that fails with a user error waits (a bounded while) until the other ranks have
    printed theirs too: torchrun stops every rank as soon as one exits, which cut the peers' messages short."""
    if "torch.distributed" not in sys.modules:
        return
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() < 2 or dist.get_backend() != "gloo":
        return
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
    except Exception:  # noqa: BLE001 - a peer that failed differently or is gone: exit anyway
        pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except Exception as e:
        if not _is_user_error(e):
            raise
        sys.stderr.write(f"error: {e}\n")  # one write: unbuffered, print's text and newline are two, and the
        sys.stderr.flush()  # ranks of a torchrun job (same stderr) could interleave between them
        _wait_for_peers()
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished steps are checkpointed, rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
