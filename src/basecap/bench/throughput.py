"""``basecap bench throughput``: whole-model training throughput and peak memory against sequence length.

For each mixer: the LM at a size preset (parameters matched to Transformer++), batch 1, one AdamW
training step (forward, backward, optimizer) per measurement, bf16 autocast on CUDA and fp32 on CPU;
median over repeats after warm-up. With several ``--head-impls`` (the LM head's loss: ``plain`` whole
logits, ``chunked``, ``auto``) each length builds one model per head from the same weights and the
heads alternate within every round, so drift on a shared machine hits them alike. Reports step time,
tokens/s and peak memory (CUDA: ``max_memory_allocated`` growth over a step; CPU, with ``--memory``:
the resident-set high-water mark growth over one step in a fresh process, ``bench/common.py``'s probe).
A configuration that runs out of memory is reported as OOM, not dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from .common import peak_memory_cuda, peak_rss_growth, run_probe, sync


def _step(model, opt, idx, autocast):
    def run():
        with autocast() if autocast else nullcontext():
            loss, _ = model(idx[:, :-1], targets=idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(idx.device)

    return run


def _setup(name: str, T: int, head: str, args, dev):
    """The model (seeded: every head gets the same weights), its optimizer and one batch, as a step closure."""
    from ..matching import resolve
    from ..model import LM, ModelConfig

    mixer = {"name": name}
    if args.impl != "auto":
        mixer["impl"] = args.impl
    if name == "top1_chunk":
        mixer["selection"] = "approx"
    torch.manual_seed(0)
    cfg = resolve(ModelConfig(preset=args.preset, vocab_size=args.vocab, max_seq_len=T, mixer=mixer, head_impl=head))
    model = LM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    idx = torch.randint(0, args.vocab, (1, T + 1), device=dev, generator=torch.Generator(dev).manual_seed(1))
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dev.type == "cuda" else None
    return model, _step(model, opt, idx, autocast)


def _probe(spec: str):
    """Subprocess entry: peak RSS growth of one training step after a warm-up step, printed as JSON."""
    s = json.loads(spec)
    torch.set_num_threads(s["threads"])
    args = argparse.Namespace(**s["args"])
    _, step = _setup(s["mixer"], s["T"], s["head"], args, torch.device("cpu"))
    step()  # optimizer state, library buffers
    print(json.dumps(peak_rss_growth(step)))


def _time_rounds(steps: dict, reps: int, warmup: int) -> dict:
    """Median seconds of each step closure; one call of each per round."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(reps):
        for k, step in steps.items():
            t = time.perf_counter()
            step()
            times[k].append(time.perf_counter() - t)
    return {k: {"step_s": statistics.median(v), "step_min_s": min(v), "step_all_s": v} for k, v in times.items()}


def _parser():
    from ..presets import preset_names

    ap = argparse.ArgumentParser(prog="basecap bench throughput", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixers", nargs="*", default=["attention", "mamba2", "gated_deltanet", "top1_chunk"])
    ap.add_argument("--preset", default="110m", choices=preset_names())
    ap.add_argument("--lengths", nargs="*", type=int, default=[2048, 8192, 32768])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--impl", default="auto", help="mixer impl (auto, fast, chunked, ref) where the mixer has it")
    ap.add_argument(
        "--head-impls",
        nargs="+",
        default=["auto"],
        choices=["auto", "chunked", "fast", "plain"],
        help="the LM head's loss (model.head_impl); several alternate within each round",
    )
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's, all cores)")
    ap.add_argument("--memory", action="store_true", help="CPU: peak memory of a step in a fresh process (CUDA: always)")
    ap.add_argument("--out", default="bench_results/throughput")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None):
    from ..atomic import write_json

    args = _parser().parse_args(argv)
    if args.probe:
        return _probe(args.probe)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    probe_args = {k: v for k, v in vars(args).items() if k in ("preset", "vocab", "impl")}
    rows = []
    for name in args.mixers:
        for T in args.lengths:
            base = {"mixer": name, "T": T}
            try:
                steps, params = {}, None
                for head in args.head_impls:
                    model, steps[head] = _setup(name, T, head, args, dev)
                    params = model.param_counts()["total"]
                times = _time_rounds(steps, args.reps, args.warmup)
                for head in args.head_impls:
                    row = {**base, "head_impl": head, "params": params, **times[head], "tokens_per_s": T / times[head]["step_s"]}
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
                        row["peak_mem_gib"] = peak_memory_cuda(steps[head], dev) / 2**30
                    elif args.memory:
                        spec = {"mixer": name, "T": T, "head": head, "threads": torch.get_num_threads(), "args": probe_args}
                        row["peak_mem_gib"] = run_probe("basecap.bench.throughput", spec, torch.get_num_threads())["peak_bytes"] / 2**30
                    rows.append(row)
                del steps, model
            except torch.OutOfMemoryError:
                rows += [{**base, "head_impl": head, "oom": True} for head in args.head_impls]
            for row in rows[-len(args.head_impls) :]:
                msg = (
                    "OOM"
                    if row.get("oom")
                    else (
                        f"{row['step_s']:8.3f} s/step {row['tokens_per_s']:>10.0f} tok/s"
                        + (f"  {row['peak_mem_gib']:.3f} GiB" if row.get("peak_mem_gib") is not None else "")
                    )
                )
                print(f"{name:<16} T={T:<6} head={row['head_impl']:<8} {msg}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu, {torch.get_num_threads()} thread(s)",
        "preset": args.preset,
        "vocab": args.vocab,
        "dtype": "bf16 autocast" if dev.type == "cuda" else "fp32",
        "torch": torch.__version__,
        "load_average": os.getloadavg() if dev.type == "cpu" else None,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json(out / "throughput.json", {"meta": meta, "rows": rows})
    print(f"written: {out / 'throughput.json'}")
    return rows


if __name__ == "__main__":
    main()
