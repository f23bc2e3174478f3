"""``basecap bench throughput``: whole-model training throughput and peak memory against sequence length.

For each mixer: the LM at a size preset (parameters matched to Transformer++), batch 1, one AdamW
training step (forward, backward, optimizer) per measurement, bf16 autocast on CUDA and fp32 on CPU;
median over repeats after warm-up. Reports tokens/s and peak memory (CUDA: max allocated; CPU: not
measured). A configuration that runs out of memory is reported as OOM, not dropped.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path

import torch

from .common import median_time


def _step(model, opt, idx, autocast):
    def run():
        with autocast() if autocast else nullcontext():
            loss, _ = model(idx[:, :-1], targets=idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if idx.is_cuda:
            torch.cuda.synchronize()
    return run


def main(argv: list[str] | None = None):
    from ..matching import resolve
    from ..model import LM, ModelConfig
    from ..presets import preset_names
    from ..rundir import write_json

    ap = argparse.ArgumentParser(prog="basecap bench throughput", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixers", nargs="*", default=["attention", "mamba2", "gated_deltanet", "top1_chunk"])
    ap.add_argument("--preset", default="110m", choices=preset_names())
    ap.add_argument("--lengths", nargs="*", type=int, default=[2048, 8192, 32768])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--impl", default="auto", help="mixer impl (auto, fast, chunked, ref) where the mixer has it")
    ap.add_argument("--out", default="bench_results/throughput")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dev.type == "cuda" else None
    rows = []
    for name in args.mixers:
        for T in args.lengths:
            mixer = {"name": name}
            if args.impl != "auto":
                mixer["impl"] = args.impl
            if name == "top1_chunk":
                mixer["selection"] = "approx"
            row = {"mixer": name, "T": T}
            try:
                torch.manual_seed(0)
                cfg = resolve(ModelConfig(preset=args.preset, vocab_size=args.vocab, max_seq_len=T, mixer=mixer))
                model = LM(cfg).to(dev)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
                idx = torch.randint(0, args.vocab, (1, T + 1), device=dev)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(dev)
                t = median_time(_step(model, opt, idx, autocast), reps=args.reps, warmup=1)
                row.update(params=model.param_counts()["total"], step_s=t, tokens_per_s=T / t,
                           peak_mem_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None)
                del model, opt
            except torch.OutOfMemoryError:
                row.update(oom=True)
            rows.append(row)
            msg = "OOM" if row.get("oom") else f"{row['tokens_per_s']:>10.0f} tok/s" + (f"  {row['peak_mem_gib']:.1f} GiB" if row["peak_mem_gib"] else "")
            print(f"{name:<16} T={T:<6} {msg}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "preset": args.preset, "vocab": args.vocab,
            "dtype": "bf16 autocast" if autocast else "fp32", "torch": torch.__version__}
    write_json(out / "throughput.json", {"meta": meta, "rows": rows})
    print(f"written: {out / 'throughput.json'}")
    return rows


if __name__ == "__main__":
    main()
