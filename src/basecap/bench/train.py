"""``basecap bench train``: the trainer's tokens/s and MFU, and its overhead against a minimal plain loop.

Both train the same model (same config, same initial weights, same batches materialised up front
for the plain loop) in the same process, alternating trainer and plain windows to cancel drift.
The default shape is the quickstart's Transformer++ (width 128, 4 layers, 256 tokens x 16 sequences,
the default corpus's 8192-token vocabulary). Reported: median tokens/s of optimizer steps (evaluation
and checkpointing are excluded from both: they are configured work, not overhead), the ratio, and
MFU: model FLOP/s (3 x ``LM.flops_per_token`` x tokens/s) over the peak FLOP/s the trainer uses, the
one stored for this machine and thread count (``basecap.peak``, ``basecap peak``); a quick
``--peak-size``^3 probe before every window is shown beside it (``probe_flops``).

``--compile``: each window also builds the model twice from the same seed, one copy compiled as
``train.compile = true`` compiles it (basecap.compile), and runs one optimizer step of each in turn on every
batch (a change of load hits both alike); printed are eager and compiled tokens/s and tokens per CPU-second
(medians after the first two steps), the warm-up (the first two compiled steps' time beyond the median
step; the first window compiles from scratch, later ones may reuse inductor's cache) and the largest
relative difference of a step's loss.

On a CPU shared with other jobs the steps slow down with the load (``load_average`` is recorded), so
the plain loop is also timed in process CPU time: ``plain_cpu_mfu`` is its model FLOPs per CPU-second
over the matmul's FLOPs per CPU-second (measured the same way). Time a descheduled thread waits is not
CPU time, so on a loaded machine this is closer to what the loop reaches on an idle one; but a thread
that spins while it waits for the others (OpenMP's default) burns CPU time, which counts against it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ..records import TrainRecord, trains


def _plain_steps(model, opt, batches, clip):
    """Wall and process CPU seconds of each step."""
    times = []
    for x, y in batches:
        t, c = time.perf_counter(), time.process_time()
        loss = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append((time.perf_counter() - t, time.process_time() - c))
    return times


def _trainer_steps(train, cfg, corpus, RunDir) -> list[TrainRecord]:
    """The training-step records of one run of the trainer in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", corpus=corpus, log=lambda *_: None)
        return trains(RunDir(Path(tmp) / "run").read_metrics())


def _compiled_vs_eager(cfg, vocab_size: int, batches) -> dict[str, list[tuple[float, float, float]]]:
    """The model built twice from the same seed, one of them compiled (basecap.compile), and one optimizer step
    of each in turn on every batch, so a change of machine load hits both alike: per step (wall seconds,
    process CPU seconds, loss) of each."""
    from ..compile import compile_for_training
    from ..model import build_model
    from ..optim import make_optimizer

    sides = {}
    for name in ("eager", "compiled"):
        torch.manual_seed(0)
        model = build_model(cfg.model, vocab_size)
        if name == "compiled":
            compile_for_training(model, cfg.model_copy(update={"train": cfg.train.model_copy(update={"compile": True})}), log=lambda *_: None)
        model.train()
        sides[name] = (model, make_optimizer(model, cfg.train))
    out: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    for x, y in batches:
        for name, (model, opt) in sides.items():
            t, c = time.perf_counter(), time.process_time()
            loss, _ = model(x, targets=y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = loss.item()
            out[name].append((time.perf_counter() - t, time.process_time() - c, value))
    return out


def _compile_summary(windows: list[dict], tok: int, fpt: float, peak: float) -> dict:
    """Eager against compiled over the windows: median tokens/s (wall, and per CPU-second) after each window's
    first two steps, the warm-up (those two compiled steps' time beyond the median compiled step), the largest
    relative difference of a step's loss."""
    from ..train import mfu

    def med(side, i, skip=2):
        return statistics.median(tok / s[i] for w in windows for s in w[side][skip:])

    res = {
        "eager_tokens_per_s": med("eager", 0),
        "compiled_tokens_per_s": med("compiled", 0),
        "eager_tokens_per_cpu_s": med("eager", 1),
        "compiled_tokens_per_cpu_s": med("compiled", 1),
    }
    res["speedup"] = res["compiled_tokens_per_s"] / res["eager_tokens_per_s"]
    res["speedup_cpu"] = res["compiled_tokens_per_cpu_s"] / res["eager_tokens_per_cpu_s"]
    res["eager_mfu"], res["compiled_mfu"] = mfu(res["eager_tokens_per_s"], fpt, peak), mfu(res["compiled_tokens_per_s"], fpt, peak)
    for key, i, per in (("warmup_s", 0, res["compiled_tokens_per_s"]), ("warmup_cpu_s", 1, res["compiled_tokens_per_cpu_s"])):
        res[key] = [sum(s[i] for s in w["compiled"][:2]) - 2 * tok / per for w in windows]
    res["loss_max_rel_err"] = max(abs(c[2] - e[2]) / abs(e[2]) for w in windows for c, e in zip(w["compiled"], w["eager"]))
    return res


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="basecap bench train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="small-vocab", help="corpus recipe (default: the quickstart's)")
    ap.add_argument("--mixer", default="attention")
    ap.add_argument("--steps", type=int, default=30, help="steps per window")
    ap.add_argument("--windows", type=int, default=2, help="alternating trainer/plain windows")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--head-impl", default="auto", choices=["auto", "chunked", "plain"], help="the LM head's loss (model.head_impl)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's, all cores)")
    ap.add_argument("--peak-size", type=int, default=4096, help="square fp32 matmul size of the quick probe shown beside the stored peak")
    ap.add_argument("--compile", action="store_true", help="also train with train.compile = true: eager vs compiled tokens/s, warm-up")
    ap.add_argument("--out", default="bench_results/train")
    return ap


def _bench_config(args, domain: str):
    """The run config both loops train: the benchmark's shape on one domain, no evaluation or checkpoint in the way."""
    from ..config import validate_run
    from ..matching import resolve

    return resolve(
        validate_run(
            {
                "name": "bench",
                "data": {"recipe": args.recipe, "train_weights": {domain: 1.0}, "seq_len": args.seq_len, "eval_domains": [domain]},
                "model": {
                    "d_model": args.d_model,
                    "n_layers": args.layers,
                    "max_seq_len": args.seq_len,
                    "mixer": {"name": args.mixer},
                    "match_params": True,
                    "head_impl": args.head_impl,
                },
                "train": {
                    "steps": args.steps,
                    "batch_size": args.batch,
                    "warmup_steps": 1,
                    "checkpoint_every": 10**9,
                    "progress": False,
                    "threads": torch.get_num_threads(),
                },
                "eval": {"every": 10**9, "max_tokens": args.seq_len * 8, "batch_size": 8},
            }
        )
    )


def _measure_windows(args, cfg, corpus, batches) -> dict:
    """``args.windows`` alternating windows, each: the quick peak probes (wall and CPU time), the trainer, with
    ``--compile`` eager against compiled, then the plain loop. Per-step figures after each window's first two
    steps, the probes' peaks, the compile windows, and the model's training FLOPs per token."""
    from ..model import build_model
    from ..peak import matmul_peak_flops
    from ..rundir import RunDir
    from ..optim import make_optimizer
    from ..train import train

    tok = args.batch * args.seq_len
    m: dict[str, list] = {k: [] for k in ("trainer_tps", "plain_tps", "plain_cpu_tps", "peaks", "cpu_peaks", "trainer_mfu", "compiled")}
    cpu = torch.device("cpu")
    for _ in range(args.windows):
        m["peaks"].append(matmul_peak_flops(cpu, size=args.peak_size, reps=3, cached=False))
        m["cpu_peaks"].append(matmul_peak_flops(cpu, size=args.peak_size, reps=3, cached=False, clock=time.process_time))
        recs = _trainer_steps(train, cfg, corpus, RunDir)
        m["trainer_tps"] += [r["tokens_per_s"] for r in recs[2:]]  # skip warm-up steps
        m["trainer_mfu"] += [r["mfu"] if "mfu" in r else r["mfu_above_peak"] for r in recs[2:]]
        if args.compile:
            m["compiled"].append(_compiled_vs_eager(cfg, corpus.vocab_size, batches))
        torch.manual_seed(0)
        model = build_model(cfg.model, corpus.vocab_size)
        opt = make_optimizer(model, cfg.train)
        times = _plain_steps(model, opt, batches, cfg.train.grad_clip)[2:]
        m["plain_tps"] += [tok / t for t, _ in times]
        m["plain_cpu_tps"] += [tok / c for _, c in times]
    return {**m, "fpt": 3 * model.flops_per_token(args.seq_len)}


def _summary(args, vocab_size: int, m: dict, stored: dict) -> dict:
    """train.json's record: the shape, the two loops' median tokens/s, the overhead and the MFUs."""
    from ..train import mfu

    fpt = m["fpt"]
    tr, pl, peak = statistics.median(m["trainer_tps"]), statistics.median(m["plain_tps"]), stored["per_device"]
    threads = torch.get_num_threads()
    cpu_mfu = mfu(statistics.median(m["plain_cpu_tps"]), fpt, max(m["cpu_peaks"]))
    overhead = pl / tr - 1
    return {
        "mixer": args.mixer,
        "d_model": args.d_model,
        "layers": args.layers,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "vocab_size": vocab_size,
        "head_impl": args.head_impl,
        "threads": threads,
        "trainer_tokens_per_s": tr,
        "plain_tokens_per_s": pl,
        "overhead_pct": 100 * overhead,
        "target_pct": 5.0,
        "met": overhead <= 0.05,
        "train_flops_per_token": fpt,
        "peak_flops": peak,
        "peak": stored["source"],
        "probe_flops_windows": m["peaks"],
        "probe": f"fp32 {args.peak_size}^3 matmul, fastest of 3",
        "peak_flops_per_cpu_s": max(m["cpu_peaks"]),
        "trainer_flops_per_s": tr * fpt,
        "trainer_mfu": mfu(tr, fpt, peak),
        "plain_mfu": mfu(pl, fpt, peak),
        "plain_cpu_mfu": cpu_mfu,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "trainer_logged_mfu": statistics.median(m["trainer_mfu"]),
        "mfu_target": 0.5,
        "load_average": os.getloadavg(),
    }


def _print_summary(res: dict) -> None:
    """The two loops' table, the plain loop per CPU-second, the peak and the verdicts on overhead and MFU."""
    from ..train import mfu

    tr, pl, fpt, peak = res["trainer_tokens_per_s"], res["plain_tokens_per_s"], res["train_flops_per_token"], res["peak_flops"]
    print(f"{'loop':<10}{'tokens/s (median)':>20}{'GFLOP/s':>10}{'MFU':>8}")
    for name, tps in (("trainer", tr), ("plain", pl)):
        print(f"{name:<10}{tps:>20.0f}{tps * fpt / 1e9:>10.1f}{100 * mfu(tps, fpt, peak):>7.1f}%")
    print(
        f"plain loop per CPU-second: MFU {100 * res['plain_cpu_mfu']:.1f}% (model FLOPs per CPU-second over the matmul's, "
        f"{res['peak_flops_per_cpu_s'] / 1e9:.1f} GFLOP per CPU-second)"
    )
    print(
        f"peak: {peak / 1e9:.1f} GFLOP/s ({res['peak']}); this run's quick probe ({res['probe']}): "
        f"{max(res['probe_flops_windows']) / 1e9:.1f} GFLOP/s; training FLOPs/token {fpt / 1e6:.2f}M (3 x forward); "
        f"load average {res['load_average'][0]:.2f}"
    )
    print(
        f"trainer overhead: {res['overhead_pct']:+.1f}% (target <= 5%: {'met' if res['met'] else 'MISSED'}); "
        f"trainer MFU {100 * res['trainer_mfu']:.1f}% (target >= 50%: {'met' if res['trainer_mfu'] >= 0.5 else 'MISSED'}; "
        f"{100 * res['trainer_logged_mfu']:.1f}% as the trainer logged it)"
    )


def _print_compile(c: dict) -> None:
    """Eager against compiled: tokens/s, tokens per CPU-second, the warm-up and how close the losses stay."""
    print(
        f"train.compile (the same weights and batches, eager and compiled steps in turn; medians after 2 steps):\n"
        f"  tokens/s      eager {c['eager_tokens_per_s']:.0f}, compiled {c['compiled_tokens_per_s']:.0f} "
        f"({c['speedup']:.2f}x; MFU {100 * c['eager_mfu']:.1f}% -> {100 * c['compiled_mfu']:.1f}%)\n"
        f"  tokens/CPU-s  eager {c['eager_tokens_per_cpu_s']:.0f}, compiled {c['compiled_tokens_per_cpu_s']:.0f} "
        f"({c['speedup_cpu']:.2f}x)\n"
        f"  warm-up (first 2 compiled steps beyond the median step): {', '.join(f'{w:.1f}' for w in c['warmup_s'])} s "
        f"wall, {', '.join(f'{w:.1f}' for w in c['warmup_cpu_s'])} CPU-s; per-step losses within "
        f"{c['loss_max_rel_err']:.1e} of eager's (relative)"
    )


def main(argv: list[str] | None = None):
    from ..data import TrainBatches, build_corpus, load_recipe
    from ..peak import peak_flops
    from ..atomic import write_json

    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    corpus = build_corpus(load_recipe(args.recipe))
    domain = corpus.domains[0]
    cfg = _bench_config(args, domain)
    tb = TrainBatches(corpus, weights={domain: 1.0}, seq_len=args.seq_len, batch_size=args.batch, seed=0)
    batches = [tb.batch(s) for s in range(args.steps)]
    stored = peak_flops(torch.device("cpu"), torch.float32, log=print)
    m = _measure_windows(args, cfg, corpus, batches)
    res = _summary(args, corpus.vocab_size, m, stored)
    _print_summary(res)
    if args.compile:
        res["compile"] = _compile_summary(m["compiled"], args.batch * args.seq_len, m["fpt"], res["peak_flops"])
        _print_compile(res["compile"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "train.json", res)
    print(f"written: {out / 'train.json'}")
    return res


if __name__ == "__main__":
    main()
