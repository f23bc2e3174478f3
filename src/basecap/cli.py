"""The ``basecap`` command line: a thin layer over the Python API (basecap.data, basecap.train,
basecap.eval, basecap.report, basecap.experiment).

Each command is a handler ``_cmd_<name>`` and the function that adds its parser ``_add_<name>``;
handlers import what they call, so parsing stays quick. Names a command accepts (suites, presets,
benchmarks) come from their registries, never from a list typed here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from .config_base import ConfigError

BENCHES = {
    "train": "trainer tokens/s against a minimal plain PyTorch loop of the same model",
    "mixers": "forward+backward and decode speed of every mixer against sequence length",
    "selection": "Top-1 selection attention against causal SDPA at long context",
    "data": "tokenisation MB/s (1 and N workers) and loader batches/s against the planned 110m step time",
    "throughput": "whole-model training tokens/s and peak memory against sequence length (GPU table)",
    "head": "LM head + cross-entropy alone: plain (whole logits) against chunked (and fla on CUDA), time and peak memory",
}

EPILOG = """examples:
  basecap run experiments/quickstart.toml            build data, train every run, evaluate, report
  basecap run experiments/quickstart.toml --set train.steps=50
  basecap data build                                 build the default corpus (cached)
  basecap train experiments/quickstart.toml --run transformer_pp
  basecap eval runs/quickstart/transformer_pp-s0     test-split loss and bits/byte per domain
  basecap report runs/quickstart/*-s0 --out my_report
"""


class _Names:
    """A registry's names as argparse choices, read when argparse first needs them (a value to check,
    or --help), so that building the parser does not import the registry's module (and torch).
    Give the argument a ``metavar``: argparse formats the choices of one without it when it is added."""

    def __init__(self, module: str, attr: str, *extra: str):
        self._module, self._attr, self._extra = module, attr, extra
        self._names: list[str] | None = None

    def _load(self) -> list[str]:
        if self._names is None:
            names = getattr(importlib.import_module(self._module), self._attr)
            self._names = [*self._extra, *(names() if callable(names) else names)]
        return self._names

    def __iter__(self):
        return iter(self._load())

    def __contains__(self, name) -> bool:
        return name in self._load()


def _command(sub, name: str, fn, summary: str, description: str | None = None) -> argparse.ArgumentParser:
    """The parser of a command whose arguments go to ``fn``; its --help describes it with ``fn``'s docstring."""
    sp = sub.add_parser(name, help=summary, description=description or fn.__doc__)
    sp.set_defaults(fn=fn)
    return sp


def _experiment_args(sp) -> None:
    sp.add_argument("experiment", help="experiment TOML file (e.g. experiments/quickstart.toml)")
    sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, validated like the file (e.g. --set train.steps=100); repeatable")


def _cmd_data(args):
    """build: a corpus from a recipe: real text per domain, de-duplicated, split by document hash,
    tokenised. Cached in $BASECAP_HOME; a second build with the same inputs does nothing.
    verify: check a built corpus's token shards and tokenizer against the sizes and SHA-256 hashes its
    manifest records (a corpus folder, or a recipe's newest built corpus; nothing is built)."""
    from .data import build_corpus, load_recipe, summarize

    if args.action == "verify":
        from .data.home import corpus_for_verify, verify_corpus

        corpus = corpus_for_verify(args.recipe)
        problems = verify_corpus(corpus)
        if problems:
            raise ConfigError(f"corpus {corpus.dir} fails verification:\n  " + "\n  ".join(problems))
        print(f"corpus {corpus.dir}: every shard matches its manifest")
        return
    corpus = build_corpus(load_recipe(args.recipe), workers=args.workers, progress=False if args.no_progress else None)
    print(summarize(corpus))
    print(f"corpus: {corpus.dir}")


def _add_data(sub) -> None:
    d = _command(sub, "data", _cmd_data, "build a corpus into the data home, or verify a built one")
    d.add_argument("action", choices=["build", "verify"], help="what to do")
    d.add_argument("recipe", nargs="?", default="default",
                   help="built-in recipe name or path to a recipe TOML (default: default); verify also takes a corpus folder")
    d.add_argument("--workers", type=int, default=None, help="tokenisation worker processes (default: the CPU count)")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")


def _cmd_train(args):
    """Train every run of an experiment, or only those named with --run (a run's full name, or its base name
    for every sweep point of it). A tune experiment tunes first and trains the comparison at the chosen values.
    Finished runs are skipped; an interrupted run resumes from its last good checkpoint and continues with the
    same loss sequence."""
    from .experiment import train_experiment

    main_rank = int(os.environ.get("RANK", "0")) == 0
    for rc, final in train_experiment(args.experiment, args.set, args.run, reuse=args.reuse):
        if main_rank:
            print(f"{rc.run_id}: in-domain loss {final['in_domain_loss']:.4f}; " +
                  ", ".join(f"{d} {v['loss']:.3f} ({v['bpb']:.3f} bpb)" for d, v in final["domains"].items()))


REUSE_HELP = ("a study's output folder (e.g. runs/architectures-small) whose finished runs may stand in for runs of "
              "this one with the same config but for their name: copied, relabelled, not trained again (repeatable)")


def _add_train(sub) -> None:
    t = _command(sub, "train", _cmd_train, "train the runs of an experiment (resumes interrupted runs)")
    _experiment_args(t)
    t.add_argument("--run", action="append", default=[], metavar="NAME", help="only this run (repeatable)")
    t.add_argument("--reuse", action="append", default=[], type=Path, metavar="DIR", help=REUSE_HELP)


def _cmd_eval(args):
    """Evaluate the newest good checkpoint of RUN_DIR on the held-out split of every domain; writes
    RUN_DIR/eval.json."""
    if args.suite != "loss":
        _run_suite(args)
        return
    from .eval.final import evaluate_run

    res = evaluate_run(args.run_dir, split=args.split, max_tokens=args.max_tokens)
    print(f"{res['run_id']} ({res['checkpoint']}, {res['split']} split)")
    print(f"{'domain':<14}{'loss':>9}{'bpb':>9}{'tokens':>10}")
    for d, v in res["domains"].items():
        tag = "" if d in res["in_domain"] else "  (OOD)"
        print(f"{d:<14}{v['loss']:>9.4f}{v['bpb']:>9.4f}{v['tokens']:>10}{tag}")
    print(f"written: {Path(args.run_dir) / 'eval.json'}")


def _run_suite(args):
    from .config import parse_override
    from .eval.suites import run_suite

    opts = {}
    for item in args.opt:
        path, value = parse_override(item)
        opts[".".join(path)] = value
    if args.tasks:
        opts["tasks"] = args.tasks.split(",")
    res = run_suite(args.run_dir, args.suite, out_dir=args.out, **opts)
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, (list, dict)) or k in ("acc", "summary", "acc_by_d_model")},
                     indent=1, default=str))
    print(f"written: {Path(args.out or args.run_dir) / ('eval_' + args.suite + '.json')}")


def _add_eval(sub) -> None:
    e = _command(sub, "eval", _cmd_eval, "evaluate a trained run: loss and bits per byte on every domain")
    e.add_argument("run_dir")
    e.add_argument("--split", choices=["validation", "test"], default="test")
    e.add_argument("--max-tokens", type=int, default=None, help="tokens per domain (default: the run's eval.max_tokens)")
    e.add_argument("--suite", default="loss", choices=_Names("basecap.eval.suites", "suite_names", "loss"), metavar="SUITE",
                   help="loss (default): loss and bits per byte per domain; otherwise one evaluation suite "
                   "(docs/evaluation.md). One of: %(choices)s")
    e.add_argument("--tasks", default=None, help="lm-eval: comma-separated task names")
    e.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                   help="a suite option, e.g. --opt num_fewshot=5 --opt lengths=[1024,2048] (repeatable)")
    e.add_argument("--out", default=None, help="suite output folder (default: RUN_DIR)")


def _cmd_report(args):
    """Write report.md, a self-contained report.html and PNG plots: training curves, in-domain vs OOD loss
    over training, final losses and bits per byte, and each run's OOD gap to a reference run at matched
    in-domain loss."""
    from .report import report

    out = args.out or (Path(args.run_dirs[0]).parent / "report")
    if args.tuning is not None and not Path(args.tuning).is_file():
        raise ConfigError(f"--tuning {args.tuning}: no such file (a tune experiment writes <out_dir>/tuning.json)")
    design = None
    if args.compare is not None:
        from .report.design import load_design

        design = load_design(args.compare)
    path = report(args.run_dirs, out, reference=args.reference, smooth=args.smooth, speed_json=args.speed,
                  tuning_json=args.tuning, archive=args.archive, design=design)
    print(path.read_text().split("## Figures")[0].rstrip())
    print(f"report: {path.parent / 'report.html'} (and report.md)")


def _add_report(sub) -> None:
    r = _command(sub, "report", _cmd_report, "tables and plots from run directories (report.md, report.html, PNGs)")
    r.add_argument("run_dirs", nargs="+")
    r.add_argument("--out", default=None, help="output folder (default: <parent of first run>/report)")
    r.add_argument("--reference", default=None, help="run name to compare against (default: the first run)")
    r.add_argument("--smooth", type=int, default=3, help="moving average over this many evaluations before matching")
    r.add_argument("--compare", default=None, type=Path, metavar="TOML",
                   help="a TOML file with a [compare] table (an experiment file, or the table alone): the comparison design "
                        "to apply instead of the one of the runs' study (docs/metrics.md)")
    r.add_argument("--speed", default=None, help="a `basecap bench mixers` JSON to include as the speed section")
    r.add_argument("--tuning", default=None, help="a tune experiment's tuning.json: the tuning section (sweep plot, the "
                                                   "choices, the gap at each fixed value)")
    r.add_argument("--archive", action="store_true",
                   help="also copy every run's records (run.json, metrics.jsonl, eval.json, suite results; no checkpoints) "
                        "to OUT/runs/ and the --tuning file to OUT/, so `basecap report OUT/runs/* --out OUT` writes the "
                        "same report again from the results folder alone")


def _cmd_scorecard(args):
    """Test every claim of the paper (experiments/paper/claims.toml) once, from the published studies' archived
    records, with one Holm family over the claims file; write results/SCORECARD.md and results/scorecard.json
    (with --write-readme also the README's Results section and each study README's generated block). --check
    writes nothing and fails when a committed file differs from what would be written."""
    from .scorecard import build_scorecard
    from .scorecard.render import generated_files

    root = Path(args.root)
    card = build_scorecard(root, args.claims)
    files = generated_files(card, root)
    if not (args.write_readme or args.check):
        files = {p: t for p, t in files.items() if p.parent == root / "results"}
    if args.check:
        stale = [str(p) for p, t in files.items() if not p.is_file() or p.read_text(encoding="utf-8") != t]
        if stale:
            raise ConfigError("out of date (run `basecap scorecard --write-readme`): " + ", ".join(stale))
        print(f"scorecard: {len(files)} files up to date")
        return
    from .rundir import atomic_write

    for p, t in files.items():
        atomic_write(p, t)
    print(files[root / "results" / "SCORECARD.md"].split("## Reused runs")[0].rstrip())
    print("written: " + ", ".join(str(p) for p in files))


def _add_scorecard(sub) -> None:
    s = _command(sub, "scorecard", _cmd_scorecard, "every claim of the paper tested once: results/SCORECARD.md")
    s.add_argument("--claims", default=None, help="claims file (default: experiments/paper/claims.toml)")
    s.add_argument("--root", default=".", help="the repository root with experiments/ and results/ (default: .)")
    s.add_argument("--write-readme", action="store_true",
                   help="also regenerate README.md's Results section and each results/<study>/README.md's generated block")
    s.add_argument("--check", action="store_true", help="write nothing; fail when a generated file is out of date")


def _cmd_run(args):
    """Build the corpus if needed, train every run (skipping finished ones, resuming interrupted ones),
    evaluate each on the test split, and write the report. With --run, only the runs named (no report), so
    that two processes can share a study."""
    from .experiment import run_experiment

    run_experiment(args.experiment, args.set, only=args.run, reuse=args.reuse)


def _add_run(sub) -> None:
    u = _command(sub, "run", _cmd_run, "the whole experiment: build data if needed, train, evaluate, report")
    _experiment_args(u)
    u.add_argument("--run", action="append", default=[], metavar="NAME",
                   help="only this run (repeatable): train, evaluate and run its suites, without the report, so that "
                        "several processes can share a study; a last call without --run writes the report")
    u.add_argument("--reuse", action="append", default=[], type=Path, metavar="DIR", help=REUSE_HELP)


def _cmd_mixers(args):
    """List every registered sequence mixer: its config switches, parameter count at a size preset (MLP
    width matched to Transformer++), recurrent state bytes per sequence and asymptotic cost."""
    from .catalog import describe, format_table

    rows = describe(args.preset, args.seq_len)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(format_table(rows, args.preset, args.seq_len))


def _add_mixers(sub) -> None:
    mx = _command(sub, "mixers", _cmd_mixers, "list every architecture with its switches, size, state and cost")
    mx.add_argument("--preset", default="tiny", choices=_Names("basecap.presets", "PRESETS"), metavar="PRESET",
                    help="a size preset: %(choices)s (default: %(default)s)")
    mx.add_argument("--seq-len", type=int, default=2048)
    mx.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_export(args):
    """Write RUN_DIR's newest good checkpoint as a Hugging Face folder (config.json, safetensors, tokenizer
    files). It loads with AutoModelForCausalLM once basecap.hf is imported; generate() matches basecap's
    own decoding."""
    from .hf import export_run

    path = export_run(args.run_dir, args.out_dir)
    print(f"exported: {path} (load with AutoModelForCausalLM.from_pretrained after `import basecap.hf`)")


def _add_export(sub) -> None:
    x = _command(sub, "export", _cmd_export, "write a trained run as a Hugging Face model folder")
    x.add_argument("run_dir")
    x.add_argument("out_dir")


def _cmd_plan(args):
    """Build every run's model on the meta device and estimate parameters, FLOPs per token, memory per GPU
    and wall time for a number of GPUs (formulas in docs/scaling.md)."""
    from .plan import format_plan, plan_experiment

    rows = plan_experiment(args.experiment, args.set, gpus=args.gpus, gpu=args.gpu_type, mfu=args.mfu, parallel=args.parallel)
    print(format_plan(rows, as_json=args.json))


def _add_plan(sub) -> None:
    pl = _command(sub, "plan", _cmd_plan, "parameters, FLOPs, memory per GPU and wall time of every run, before launching")
    _experiment_args(pl)
    pl.add_argument("--gpus", type=int, default=8)
    pl.add_argument("--gpu-type", default="H100-80GB",
                    help="a GPU of basecap.plan.GPUS, e.g. H100-80GB, or its short name, e.g. H100 (an unknown one lists them)")
    pl.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOPs utilisation")
    pl.add_argument("--parallel", choices=["ddp", "fsdp"], default=None, help="default: each run's train.parallel")
    pl.add_argument("--json", action="store_true")


def _cmd_peak(args):
    """MFU's denominator on this machine: the peak FLOP/s stored in the data home per CPU model, dtype and
    thread count (measured until stable the first time a run or benchmark needs it), beside the CPU's nominal
    limit (cores x clock x fp32 lanes x FMA units x 2) where /proc/cpuinfo tells. --refresh measures again."""
    import torch

    from .peak import nominal_cpu_limit, peak_flops, peak_path

    device = torch.device(args.device)
    for n in args.threads or [torch.get_num_threads()]:
        torch.set_num_threads(n)
        p = peak_flops(device, torch.float32, refresh=args.refresh, log=print)
        nominal = nominal_cpu_limit(n) if device.type == "cpu" else None
        limit = f"; nominal limit {nominal['flops'] / 1e9:.1f} GFLOP/s" if nominal else ""
        print(f"{n} thread(s): {p['per_device'] / 1e9:.1f} GFLOP/s{limit}\n  {p['source']}")
    print(f"stored in {peak_path()}")


def _add_peak(sub) -> None:
    pk = _command(sub, "peak", _cmd_peak, "the stored peak FLOP/s MFU is measured against (--refresh: measure again)")
    pk.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: torch's)")
    pk.add_argument("--refresh", action="store_true", help="measure again and store the new figure")
    pk.add_argument("--device", default="cpu", choices=["cpu", "cuda"])


def _cmd_bench(args):
    mod = importlib.import_module(f"basecap.bench.{args.name}")
    mod.main(args.args)


def _add_bench(sub) -> None:
    b = _command(sub, "bench", _cmd_bench, "speed benchmarks (print a table, write JSON and a plot)",
                 "Benchmarks: " + "; ".join(f"{k}: {v}" for k, v in BENCHES.items()) + ". "
                 "Pass --help after the name for its options.")
    b.add_argument("name", choices=sorted(BENCHES))
    b.add_argument("args", nargs=argparse.REMAINDER, help="options of that benchmark")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="basecap", description="Pre-train language models of many architectures on limited domains, "
                                "test them out of distribution, compare. Every command is also a Python call.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_data, _add_train, _add_eval, _add_report, _add_run, _add_mixers, _add_export, _add_plan, _add_bench, _add_peak,
                _add_scorecard):
        add(sub)
    return p


# Errors a user can act on from their message alone: printed as one line (by every rank under torchrun),
# exit status 2. Named, not imported, so that parsing the command line imports nothing heavy.
USER_ERRORS = frozenset({
    "basecap.config_base.ConfigError", "builtins.FileNotFoundError", "basecap.rundir.RunDirBusy",
    "basecap.checkpoint.CheckpointError", "basecap.train.TrainingDiverged", "basecap.data.source_base.DataError",
})


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
        sys.stderr.flush()                  # ranks of a torchrun job (same stderr) could interleave between them
        _wait_for_peers()
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished steps are checkpointed, rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
