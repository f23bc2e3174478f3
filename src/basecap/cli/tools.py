"""The commands over a corpus, one run, the registries or this machine: ``data``, ``eval``, ``mixers``, ``export``,
``peak`` and ``bench``. Each is a handler ``_cmd_<name>`` and the function that adds its parser ``add_<name>``
(listed in ``cli.build_parser``); handlers import what they call, so parsing stays quick, and names a command
accepts (suites, presets, benchmarks) come from their registries."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from .parse import Names, command
from ..config_base import ConfigError


BENCHES = {
    "train": "trainer tokens/s against a minimal plain PyTorch loop of the same model",
    "mixers": "forward+backward and decode speed of every mixer against sequence length",
    "selection": "Top-1 selection attention against causal SDPA at long context",
    "data": "tokenisation MB/s (1 and N workers) and loader batches/s against the planned 110m step time",
    "throughput": "whole-model training tokens/s and peak memory against sequence length (GPU table)",
    "head": "LM head + cross-entropy alone: plain (whole logits) against chunked (and fla on CUDA), time and peak memory",
    "longctx": "CPU analogue of the paper's 100k speed row: Top-1 Chunk Approx against Transformer++, training step and decoding, 16k-100k",
    "cost": "where finished runs' CPU-seconds went (optimizer steps, cooldown branches, evaluations), per mixer, from their records",
}


def _cmd_data(args):
    """build: a corpus from a recipe: real text per domain, de-duplicated, split by document hash,
    tokenised. Cached in $BASECAP_HOME; a second build with the same inputs does nothing.
    verify: check a built corpus's token shards and tokenizer against the sizes and SHA-256 hashes its
    manifest records (a corpus folder, or a recipe's newest built corpus; nothing is built)."""
    from ..data import build_corpus, load_recipe, summarize

    if args.action == "verify":
        from ..data.home import corpus_for_verify, verify_corpus

        corpus = corpus_for_verify(args.recipe)
        problems = verify_corpus(corpus)
        if problems:
            raise ConfigError(f"corpus {corpus.dir} fails verification:\n  " + "\n  ".join(problems))
        print(f"corpus {corpus.dir}: every shard matches its manifest")
        return
    corpus = build_corpus(load_recipe(args.recipe), workers=args.workers, progress=False if args.no_progress else None)
    print(summarize(corpus))
    print(f"corpus: {corpus.dir}")


def add_data(sub) -> None:
    d = command(sub, "data", _cmd_data, "build a corpus into the data home, or verify a built one")
    d.add_argument("action", choices=["build", "verify"], help="what to do")
    d.add_argument(
        "recipe",
        nargs="?",
        default="default",
        help="built-in recipe name or path to a recipe TOML (default: default); verify also takes a corpus folder",
    )
    d.add_argument("--workers", type=int, default=None, help="tokenisation worker processes (default: the CPU count)")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")


def _cmd_eval(args):
    """Evaluate the newest good checkpoint of RUN_DIR on the held-out split of every domain; writes
    RUN_DIR/eval.json."""
    if args.suite != "loss":
        _run_suite(args)
        return
    from ..eval.final import evaluate_run

    res = evaluate_run(args.run_dir, split=args.split, max_tokens=args.max_tokens)
    print(f"{res['run_id']} ({res['checkpoint']}, {res['split']} split)")
    print(f"{'domain':<14}{'loss':>9}{'bpb':>9}{'tokens':>10}")
    for d, v in res["domains"].items():
        tag = "" if d in res["in_domain"] else "  (OOD)"
        print(f"{d:<14}{v['loss']:>9.4f}{v['bpb']:>9.4f}{v['tokens']:>10}{tag}")
    print(f"written: {Path(args.run_dir) / 'eval.json'}")


def _run_suite(args):
    from ..config_base import parse_override
    from ..eval.suites import run_suite

    opts = {}
    for item in args.opt:
        path, value = parse_override(item)
        opts[".".join(path)] = value
    if args.tasks:
        opts["tasks"] = args.tasks.split(",")
    res = run_suite(args.run_dir, args.suite, out_dir=args.out, **opts)
    print(
        json.dumps(
            {k: v for k, v in res.items() if not isinstance(v, (list, dict)) or k in ("acc", "summary", "acc_by_d_model")}, indent=1, default=str
        )
    )
    print(f"written: {Path(args.out or args.run_dir) / ('eval_' + args.suite + '.json')}")


def add_eval(sub) -> None:
    e = command(sub, "eval", _cmd_eval, "evaluate a trained run: loss and bits per byte on every domain")
    e.add_argument("run_dir")
    e.add_argument("--split", choices=["validation", "test"], default="test")
    e.add_argument("--max-tokens", type=int, default=None, help="tokens per domain (default: the run's eval.max_tokens)")
    e.add_argument(
        "--suite",
        default="loss",
        choices=Names("basecap.eval.suites", "suite_names", "loss"),
        metavar="SUITE",
        help="loss (default): loss and bits per byte per domain; otherwise one evaluation suite (docs/evaluation.md). One of: %(choices)s",
    )
    e.add_argument("--tasks", default=None, help="lm-eval: comma-separated task names")
    e.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a suite option, e.g. --opt num_fewshot=5 --opt lengths=[1024,2048] (repeatable)",
    )
    e.add_argument("--out", default=None, help="suite output folder (default: RUN_DIR)")


def _cmd_mixers(args):
    """List every registered sequence mixer: its config switches, parameter count at a size preset (MLP
    width matched to Transformer++), recurrent state bytes per sequence and asymptotic cost."""
    from ..catalog import describe, format_table

    rows = describe(args.preset, args.seq_len)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(format_table(rows, args.preset, args.seq_len))


def add_mixers(sub) -> None:
    mx = command(sub, "mixers", _cmd_mixers, "list every architecture with its switches, size, state and cost")
    mx.add_argument(
        "--preset",
        default="tiny",
        choices=Names("basecap.presets", "PRESETS"),
        metavar="PRESET",
        help="a size preset: %(choices)s (default: %(default)s)",
    )
    mx.add_argument("--seq-len", type=int, default=2048)
    mx.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_export(args):
    """Write RUN_DIR's newest good checkpoint as a Hugging Face folder (config.json, safetensors, tokenizer
    files). It loads with AutoModelForCausalLM once basecap.hf is imported; generate() matches basecap's
    own decoding."""
    from ..hf import export_run

    path = export_run(args.run_dir, args.out_dir)
    print(f"exported: {path} (load with AutoModelForCausalLM.from_pretrained after `import basecap.hf`)")


def add_export(sub) -> None:
    x = command(sub, "export", _cmd_export, "write a trained run as a Hugging Face model folder")
    x.add_argument("run_dir")
    x.add_argument("out_dir")


def _cmd_peak(args):
    """MFU's denominator on this machine: the peak FLOP/s stored in the data home per CPU model, dtype and
    thread count (measured until stable the first time a run or benchmark needs it), beside the CPU's nominal
    limit (cores x clock x fp32 lanes x FMA units x 2) where /proc/cpuinfo tells. --refresh measures again."""
    import torch

    from ..peak import nominal_cpu_limit, peak_flops, peak_path

    device = torch.device(args.device)
    for n in args.threads or [torch.get_num_threads()]:
        torch.set_num_threads(n)
        p = peak_flops(device, torch.float32, refresh=args.refresh, log=print)
        nominal = nominal_cpu_limit(n) if device.type == "cpu" else None
        limit = f"; nominal limit {nominal['flops'] / 1e9:.1f} GFLOP/s" if nominal else ""
        print(f"{n} thread(s): {p['per_device'] / 1e9:.1f} GFLOP/s{limit}\n  {p['source']}")
    print(f"stored in {peak_path()}")


def add_peak(sub) -> None:
    pk = command(sub, "peak", _cmd_peak, "the stored peak FLOP/s MFU is measured against (--refresh: measure again)")
    pk.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: torch's)")
    pk.add_argument("--refresh", action="store_true", help="measure again and store the new figure")
    pk.add_argument("--device", default="cpu", choices=["cpu", "cuda"])


def _cmd_anneal(args):
    """Annealed points added to finished runs (``basecap.replay``): each replays the run to the fork and checks the
    replay against the run's records before it adds anything."""
    from ..config_base import ConfigError
    from ..replay import add_forks, add_level_forks

    if not args.at and not args.level:
        raise ConfigError("basecap anneal: say where to fork, --at STEP or --level LOSS (either repeatable)")
    if args.level_on and not args.level:
        raise ConfigError("basecap anneal: --level-on says which domains' loss a --level is; give --level LOSS too")
    for run_dir in args.run_dirs:
        if args.at:
            add_forks(run_dir, args.at)
        if args.level:
            add_level_forks(run_dir, args.level, domains=args.level_on)


def add_anneal(sub) -> None:
    a = command(
        sub,
        "anneal",
        _cmd_anneal,
        "add an annealed point (a cooldown branch) to a finished run, forked at a step it has passed or where a level is reached",
        "The run is trained again from step 0 to the fork in a scratch folder; its records must equal the run's own, "
        "bit for bit, before the point is added (docs/metrics.md, 'Annealed points added afterwards').",
    )
    a.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    a.add_argument("--at", type=int, action="append", default=[], metavar="STEP", help="fork step (repeatable)")
    a.add_argument(
        "--level",
        type=float,
        action="append",
        default=[],
        metavar="LOSS",
        help="an in-domain loss: fork where train.cooldown_levels would have (repeatable; recorded in the run's cooldown_levels)",
    )
    a.add_argument(
        "--level-on",
        action="append",
        default=[],
        metavar="DOMAIN",
        help="the --level is a loss on this domain (repeatable: their token-weighted loss), as train.cooldown_level_domains; "
        "e.g. a mixed-domain run matched on prose",
    )


def _cmd_bench(args):
    mod = importlib.import_module(f"basecap.bench.{args.name}")
    mod.main(args.args)


def add_bench(sub) -> None:
    b = command(
        sub,
        "bench",
        _cmd_bench,
        "speed benchmarks (print a table, write JSON and a plot)",
        "Benchmarks: " + "; ".join(f"{k}: {v}" for k, v in BENCHES.items()) + ". Pass --help after the name for its options.",
    )
    b.add_argument("name", choices=sorted(BENCHES))
    b.add_argument("args", nargs=argparse.REMAINDER, help="options of that benchmark")
