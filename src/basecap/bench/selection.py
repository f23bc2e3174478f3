"""``basecap bench selection``: speed and memory of the Top-1 selection mixers (Lu et al. 2025,
arXiv 2505.18522) against causal SDPA attention (Transformer++).

Three measurements, each a median after warm-up, on one device in one run:
- layer: forward+backward of one mixer layer (B=1, H heads x D head dim, projections included)
  for Top-1 Chunk Approx / Exact, Top-1 Element and causal SDPA attention, with peak memory;
- model: one training step (loss, backward, AdamW) of the tiny preset LM at one length, each mixer
  against Transformer++ of the same size;
- decode: per-token latency of that LM after a prefill of each context length.
Peak memory: on CUDA ``max_memory_allocated`` growth; on CPU the peak resident-set growth during the
first forward+backward in a fresh subprocess (Linux high-water mark reset through
``/proc/self/clear_refs``, ``ru_maxrss`` where that is refused; glibc's mmap threshold pinned so that
freed tensors leave the resident set). Every variant is first checked
against its dense reference and skipped if it disagrees. Writes ``selection.json`` and
``selection.png`` into ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ..atomic import write_json
from .common import peak_memory_cuda, peak_rss_growth, pyplot, run_probe, sync

VARIANTS = {
    "sdpa": {"name": "attention", "impl": "fast"},
    "top1_chunk_approx": {"name": "top1_chunk", "selection": "approx"},
    "top1_chunk_exact": {"name": "top1_chunk", "selection": "exact"},
    "top1_element": {"name": "top1_element"},
}
MODEL_BASE = "sdpa"  # Transformer++


def _mixer_cfg(variant: str, args) -> dict:
    cfg = dict(VARIANTS[variant], head_dim=args.head_dim)
    if variant.startswith("top1_chunk"):
        cfg["chunk_len"] = args.chunk_len
    return cfg


def _timed(fn, device, warmup: int, reps: int) -> dict:
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(reps):
        sync(device)
        w, c = time.perf_counter(), time.process_time()
        fn()
        sync(device)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu), "reps": reps}


def _layer(variant, T, args, device):
    from ..mixers import build_mixer, parse_mixer_config

    torch.manual_seed(0)
    m = build_mixer(parse_mixer_config(_mixer_cfg(variant, args)), args.heads * args.head_dim, max_seq_len=T).to(device)
    x = torch.randn(1, T, args.heads * args.head_dim, device=device, requires_grad=True)

    def step():
        y, _ = m(x)
        y.sum().backward()

    return m, x, step


def _core(variant, T, args, device):
    """The sequence-mixing op alone: q, k, v (as the layer's projections and RoPE lay them out) -> o."""
    import torch.nn.functional as F

    m, x, _ = _layer(variant, T, args, device)
    with torch.no_grad():
        q, k, v = (t.detach().requires_grad_() for t in m._qkv(x, 0))
    pos = torch.arange(T, device=device)

    def step():
        if variant == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = m._mix(q, k, v, pos, m.resolve_impl(q), None, None)
        o.sum().backward()

    return step


def _probe(spec: str):
    """Subprocess entry: peak RSS growth (bytes) of one forward+backward, printed as JSON."""
    s = json.loads(spec)
    torch.set_num_threads(s["threads"])
    args = argparse.Namespace(**s["args"])
    _, _, step = _layer(s["variant"], s["T"], args, torch.device("cpu"))
    print(json.dumps(peak_rss_growth(step)))


def _peak_memory_cpu(variant, T, args) -> dict:
    spec = {"variant": variant, "T": T, "threads": args.threads, "args": vars(args)}
    return run_probe("basecap.bench.selection", spec, args.threads)


def self_check(variants, args, device) -> dict:
    """Each variant's benchmarked impl against its dense reference at a short odd length."""
    from ..mixers import build_mixer, parse_mixer_config

    ok = {}
    for v in variants:
        cfg = dict(_mixer_cfg(v, args), chunk_len=16) if v.startswith("top1_chunk") else _mixer_cfg(v, args)
        torch.manual_seed(0)
        d = args.heads * args.head_dim
        fast = build_mixer(parse_mixer_config(cfg), d).to(device)
        ref = build_mixer(parse_mixer_config(dict(cfg, impl="ref")), d).to(device)
        ref.load_state_dict(fast.state_dict())
        x = torch.randn(1, 77, d, device=device, requires_grad=True)
        errs = []
        for m in (ref, fast):
            y, _ = m(x)
            (gx,) = torch.autograd.grad(y.sum(), x)
            errs.append((y.detach(), gx))
        e = max(float((a - b).norm() / b.norm()) for a, b in zip(errs[1], errs[0]))
        ok[v] = e <= 1e-4
        if not ok[v]:
            print(f"{v}: benchmarked impl disagrees with its reference (rel err {e:.1e}); not reported", flush=True)
    return ok


def _model(variant, T, args, device):
    from ..model import LM, ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, max_seq_len=T, mixer=_mixer_cfg(variant, args))
    return LM(cfg).to(device)


def _model_step(variant, T, args, device) -> dict:
    model = _model(variant, T, args, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, args.vocab, (1, T + 1), device=device)

    def step():
        loss = model.loss(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _timed(step, device, args.warmup, args.model_reps)


@torch.no_grad()
def _decode(variant, ctx, args, device) -> dict:
    model = _model(variant, ctx + args.decode_steps + 4, args, device).eval()
    idx = torch.randint(0, args.vocab, (1, ctx), device=device)
    logits, state = model(idx, model.init_state(1, device))
    nxt = logits[:, -1:].argmax(-1)
    times = []
    for i in range(args.decode_steps + 2):
        sync(device)
        t = time.perf_counter()
        logits, state = model(nxt, state)
        nxt = logits[:, -1:].argmax(-1)
        sync(device)
        if i >= 2:  # two warm-up tokens
            times.append(time.perf_counter() - t)
    return {"ms_per_token": 1e3 * statistics.median(times)}


def _targets(res) -> dict:
    def layer(v, T, key="wall_s"):
        return next((r[key] for r in res["layer"] if r["variant"] == v and r["T"] == T and key in r), None)

    def mem(v, T):
        return next((r["peak_bytes"] for r in res["layer"] if r["variant"] == v and r["T"] == T and "peak_bytes" in r), None)

    out = {}
    for T, need in ((16384, 10.0), (4096, 1.0)):
        a, s = layer("top1_chunk_approx", T), layer("sdpa", T)
        if a and s:
            out[f"approx_vs_sdpa_speedup_{T}"] = {
                "value": s / a,
                "target": f">= {need:g}" if need > 1 else "> 1",
                "met": s / a >= need if need > 1 else s / a > 1,
                "cpu_time_ratio": layer("sdpa", T, "cpu_s") / layer("top1_chunk_approx", T, "cpu_s"),
            }
    core = {(r["variant"], r["T"]): r["wall_s"] for r in res["core"]}
    if ("sdpa", 16384) in core and ("top1_chunk_approx", 16384) in core:
        r = core[("sdpa", 16384)] / core[("top1_chunk_approx", 16384)]
        out["approx_vs_sdpa_core_speedup_16384"] = {"value": r, "target": ">= 25 (FLOP limit ~53)", "met": r >= 25}
    a, s = mem("top1_chunk_approx", 16384), mem("sdpa", 16384)
    if a is not None and s is not None:
        out["approx_vs_sdpa_memory_16384"] = {"value": a / max(s, 1), "target": "<= 0.7", "met": a <= 0.7 * s}
    base = next((r for r in res["model"] if r["variant"] == MODEL_BASE), None)
    appr = next((r for r in res["model"] if r["variant"] == "top1_chunk_approx"), None)
    if base and appr:
        out[f"model_step_speedup_{appr['T']}"] = {
            "value": base["wall_s"] / appr["wall_s"],
            "target": ">= 5",
            "met": base["wall_s"] / appr["wall_s"] >= 5,
        }
    dec = {r["ctx"]: r["ms_per_token"] for r in res["decode"] if r["variant"] == "top1_chunk_approx"}
    if 1024 in dec and 16384 in dec:
        out["approx_decode_16k_over_1k"] = {"value": dec[16384] / dec[1024], "target": "< 3", "met": dec[16384] / dec[1024] < 3}
    return out


def _plot(res, path: Path):
    plt = pyplot()
    fig, ax = plt.subplots(1, 4, figsize=(20, 4.5))
    for v in VARIANTS:
        rows = [r for r in res["layer"] if r["variant"] == v]
        if rows:
            ax[0].plot([r["T"] for r in rows], [r["wall_s"] for r in rows], "o-", label=v)
        core = [r for r in res["core"] if r["variant"] == v]
        if core:
            ax[0].plot([r["T"] for r in core], [r["wall_s"] for r in core], "x--", label=f"{v} (op only)")
        rows = [r for r in rows if "peak_bytes" in r]
        if rows:
            ax[1].plot([r["T"] for r in rows], [r["peak_bytes"] / 2**20 for r in rows], "o-", label=v)
        rows = [r for r in res["decode"] if r["variant"] == v]
        if rows:
            ax[3].plot([r["ctx"] for r in rows], [r["ms_per_token"] for r in rows], "o-", label=v)
    ax[2].bar([r["variant"] for r in res["model"]], [r["wall_s"] for r in res["model"]])
    for a, (title, ylabel) in zip(
        ax, [("layer fwd+bwd", "s"), ("layer peak memory", "MiB"), ("model train step", "s"), ("decode latency", "ms / token")]
    ):
        a.set_title(title)
        a.set_ylabel(ylabel)
        if a is not ax[2]:
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            if a.get_legend_handles_labels()[0]:
                a.legend(fontsize=7)
    ax[2].tick_params(axis="x", labelrotation=20, labelsize=7)
    fig.suptitle(res["meta"]["device"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="basecap bench selection", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--chunk-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (after --warmup) up to 8k")
    ap.add_argument("--long-reps", type=int, default=2, help="timed repetitions above 8k")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--memory-max-len", type=int, default=16384, help="peak memory measured up to this length")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument(
        "--core-variants",
        nargs="+",
        default=["sdpa", "top1_chunk_approx"],
        choices=list(VARIANTS),
        help="also time the mixing op alone (q, k, v -> o, no projections)",
    )
    ap.add_argument("--model-len", type=int, default=16384)
    ap.add_argument("--model-variants", nargs="+", default=["sdpa", "top1_chunk_approx", "top1_chunk_exact"], choices=list(VARIANTS))
    ap.add_argument("--model-reps", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--decode-lens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (others may share the machine)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="small grid: lengths 1k-4k, model 4k, decode 256-2k")
    ap.add_argument("--out", default="bench_results/selection")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    return ap


def _meta(args, device) -> dict:
    name = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.processor() or platform.machine()} CPU, {args.threads} thread(s)"
    )
    return {
        "device": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "args": vars(args),
        "load_average": os.getloadavg(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "memory_method": "cuda max_memory_allocated" if device.type == "cuda" else "fresh-process peak RSS growth",
        "note": "medians after warm-up; cpu_s is process CPU time (on a shared CPU wall time also counts waiting)",
    }


def _run_layers(args, device, variants, ok, res, save):
    """Layer forward+backward (and peak memory) of every variant, and the mixing op alone, per length."""
    print(f"{'T':>6} {'variant':<18} {'wall s':>9} {'cpu s':>9} {'peak MiB':>9}", flush=True)
    for T in args.lengths:
        reps = args.reps if T <= 8192 else args.long_reps
        for v in variants:
            _, _, step = _layer(v, T, args, device)
            row = {"variant": v, "T": T, **_timed(step, device, args.warmup, reps)}
            if not args.no_memory and T <= args.memory_max_len:
                row |= {"peak_bytes": peak_memory_cuda(step, device)} if device.type == "cuda" else _peak_memory_cpu(v, T, args)
            res["layer"].append(row)
            save()
            mib = f"{row['peak_bytes'] / 2**20:9.1f}" if "peak_bytes" in row else f"{'-':>9}"
            print(f"{T:>6} {v:<18} {row['wall_s']:9.3f} {row['cpu_s']:9.3f} {mib}", flush=True)
            del step
        for v in [c for c in args.core_variants if ok.get(c)]:
            row = {"variant": v, "T": T, **_timed(_core(v, T, args, device), device, args.warmup, reps)}
            res["core"].append(row)
            save()
            print(f"{T:>6} {v + ' (core)':<18} {row['wall_s']:9.3f} {row['cpu_s']:9.3f}", flush=True)


def _run_models(args, device, variants, ok, res, save):
    """One training step of the model per variant, then decode latency per context length."""
    for v in [m for m in args.model_variants if ok.get(m, True)]:
        row = {"variant": v, "T": args.model_len, **_model_step(v, args.model_len, args, device)}
        res["model"].append(row)
        save()
        print(f"model step T={args.model_len} {v:<18} wall {row['wall_s']:.3f} s  cpu {row['cpu_s']:.3f} s", flush=True)
    for ctx in args.decode_lens:
        for v in variants:
            res["decode"].append({"variant": v, "ctx": ctx, **_decode(v, ctx, args, device)})
            save()
            print(f"decode ctx={ctx:>6} {v:<18} {res['decode'][-1]['ms_per_token']:.2f} ms/token", flush=True)


def main(argv: list[str] | None = None):
    args = _parser().parse_args(argv)
    if args.probe:
        return _probe(args.probe)
    if args.quick:
        args.lengths, args.model_len, args.decode_lens, args.reps, args.long_reps = [1024, 2048, 4096], 4096, [256, 1024, 2048], 2, 1
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    res: dict[str, Any] = {"meta": _meta(args, device), "layer": [], "core": [], "model": [], "decode": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save():  # after every row: an interrupted run keeps what it measured
        write_json(out / "selection.json", res)

    ok = self_check(args.variants, args, device)
    variants = [v for v in args.variants if ok[v]]
    _run_layers(args, device, variants, ok, res, save)
    _run_models(args, device, variants, ok, res, save)
    res["targets"] = _targets(res)
    for k, t in res["targets"].items():
        print(f"target {k}: {t['value']:.2f} (want {t['target']}) {'MET' if t['met'] else 'MISSED'}", flush=True)
    save()
    _plot(res, out / "selection.png")
    print(f"wrote {out / 'selection.json'} and {out / 'selection.png'}")
    return res


if __name__ == "__main__":
    main()
