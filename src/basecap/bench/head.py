"""``basecap bench head``: the LM head and its cross-entropy alone, plain against fused.

- plain: ``F.cross_entropy(hidden @ weight.T, targets)``, the [N, V] logits (and their log-softmax
  and gradient) materialised whole, as the model and trainer computed it before the fused head;
- chunked: ``ops.linear_ce.linear_cross_entropy``, chunks of tokens with their gradient folded in
  forward (default chunk: ``CHUNK_LOGITS`` logits);
- fla: flash-linear-attention's fused Triton kernel (CUDA only, when fla imports).
All three through ``kernels.linear_ce.lm_head_loss`` (``impl`` = "plain", "chunked", "fast").

For every (tokens N, width D, vocab V): forward+backward wall and process CPU time (median after
warm-up; the variants alternate within each round so drift hits both alike; the fastest run is kept
too: on a CPU shared with other jobs, a multi-threaded op waits whenever one of its threads is
descheduled, which costs a form with many ops, like the chunked one, more than its arithmetic) and
peak memory. Peak memory (``bench/common.py``): on CUDA ``max_memory_allocated`` growth; on CPU the
resident-set high-water mark growth over one forward+backward in a fresh subprocess (high-water mark reset through ``/proc/self/clear_refs``,
``ru_maxrss`` where that is refused; glibc's mmap threshold pinned at 64 KiB so freed tensors leave
the resident set; a short warm-up first so one-off library buffers are not counted), the method of
``bench selection``. It includes the gradients of hidden and weight, which both variants allocate.
Every variant is first checked against the plain form (loss and gradients, rel. err <= 1e-4) at a
short N and not timed if it disagrees. Writes ``head.json`` and ``head.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from ..atomic import write_json
from ..kernels.linear_ce import lm_head_loss
from ..ops.linear_ce import CHUNK_LOGITS, default_chunk_tokens
from .common import peak_memory_cuda, peak_rss_growth, pyplot, rel_err, run_probe, sync

VARIANTS = ("plain", "chunked", "fla")


def _loss_fn(variant: str, chunk_tokens: int | None):
    impl = {"plain": "plain", "chunked": "chunked", "fla": "fast"}[variant]
    return lambda h, w, t: lm_head_loss(h, w, t, impl=impl, chunk_tokens=chunk_tokens)


def _inputs(N: int, D: int, V: int, device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(N, D, device=device, generator=g).requires_grad_()
    weight = torch.randn(V, D, device=device, generator=g).mul_(0.02).requires_grad_()
    targets = torch.randint(0, V, (N,), device=device, generator=g)
    return hidden, weight, targets


def _step(variant: str, N: int, D: int, V: int, device, chunk_tokens: int | None):
    """A forward+backward closure over fresh inputs (gradients dropped before each call)."""
    hidden, weight, targets = _inputs(N, D, V, device)
    fn = _loss_fn(variant, chunk_tokens)

    def step():
        hidden.grad = weight.grad = None
        fn(hidden, weight, targets).backward()

    return step


def _check(variant: str, D: int, V: int, device, chunk_tokens: int | None) -> float:
    """Largest relative error of loss, grad hidden and grad weight against the plain form at N = 1100
    (several chunks at the default chunk size, some ignored targets)."""
    out = []
    for v in ("plain", variant):
        h, w, t = _inputs(1100, D, V, device, seed=1)
        t[:7] = -100
        loss = _loss_fn(v, chunk_tokens)(h, w, t)
        loss.backward()
        out.append((loss.detach().float(), h.grad.float(), w.grad.float()))
    return max(rel_err(a, b) for a, b in zip(out[1], out[0]))


def _time_rounds(steps: dict, device, reps: int, warmup: int) -> dict:
    """Median wall and process CPU seconds of each step; one call of every step per round."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    wall: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(reps):
        for k, step in steps.items():
            sync(device)
            t, c = time.perf_counter(), time.process_time()
            step()
            sync(device)
            wall[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)
    return {
        k: {"wall_s": statistics.median(wall[k]), "wall_min_s": min(wall[k]), "cpu_s": statistics.median(cpu[k]), "wall_all_s": wall[k]}
        for k in steps
    }


def _probe(spec: str):
    """Subprocess entry: peak RSS growth (bytes) of one forward+backward, printed as JSON."""
    s = json.loads(spec)
    torch.set_num_threads(s["threads"])
    cpu = torch.device("cpu")
    _step(s["variant"], min(s["N"], 256), s["D"], s["V"], cpu, s["chunk_tokens"])()  # library buffers, thread pool
    res = peak_rss_growth(_step(s["variant"], s["N"], s["D"], s["V"], cpu, s["chunk_tokens"]))
    print(json.dumps({"peak_bytes": res["peak_bytes"], "memory_method": res["method"], "lower_bound": res["lower_bound"]}))


def _peak_memory_cpu(variant: str, N: int, D: int, V: int, args) -> dict:
    spec = {"variant": variant, "N": N, "D": D, "V": V, "threads": args.threads, "chunk_tokens": args.chunk_tokens}
    return run_probe("basecap.bench.head", spec, args.threads)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="basecap bench head", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384], help="N = batch x sequence length")
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 192], help="D (d_model)")
    ap.add_argument("--vocabs", type=int, nargs="+", default=[8192, 2048], help="V")
    ap.add_argument(
        "--variants", nargs="+", default=None, choices=list(VARIANTS), help="default: plain and chunked (and fla on CUDA when it imports)"
    )
    ap.add_argument("--chunk-tokens", type=int, default=None, help=f"chunked form's tokens per chunk (default: {CHUNK_LOGITS} // V)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (others may share the machine)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="small grid: N 1024, D 128, V 2048, 3 reps")
    ap.add_argument("--out", default="bench_results/head")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    return ap


def _default_variants(device) -> list[str]:
    if device.type != "cuda":
        return ["plain", "chunked"]
    from ..kernels.fla import fla_import_error

    return ["plain", "chunked"] + (["fla"] if fla_import_error() is None else [])


def main(argv: list[str] | None = None):
    args = _parser().parse_args(argv)
    if args.probe:
        return _probe(args.probe)
    if args.quick:
        args.tokens, args.widths, args.vocabs, args.reps = [1024], [128], [2048], 3
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    variants = args.variants or _default_variants(device)
    if "plain" not in variants:
        variants = ["plain", *variants]
    name = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.processor() or platform.machine()} CPU, {args.threads} thread(s)"
    )
    meta = {
        "device": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "args": vars(args),
        "chunk_logits": CHUNK_LOGITS,
        "load_average": os.getloadavg(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "memory_method": "cuda max_memory_allocated growth" if device.type == "cuda" else "fresh-process peak RSS growth",
        "note": "medians after warm-up; cpu_s is process CPU time (on a shared CPU wall time also counts waiting)",
    }
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"{'N':>6} {'D':>4} {'V':>6} {'variant':<8} {'chunk':>6} {'wall s':>8} {'min s':>8} {'cpu s':>8} {'peak MiB':>9} "
        f"{'x plain':>8} {'min x':>6} {'mem/plain':>9}",
        flush=True,
    )
    for D in args.widths:
        for V in args.vocabs:
            ok = {v: (0.0 if v == "plain" else _check(v, D, V, device, args.chunk_tokens)) for v in variants}
            timed = [v for v in variants if ok[v] <= 1e-4]
            for v in variants:
                if v not in timed:
                    print(f"{v} at D={D} V={V}: disagrees with the plain form (rel err {ok[v]:.2e}); not benchmarked")
            for N in args.tokens:
                steps = {v: _step(v, N, D, V, device, args.chunk_tokens) for v in timed}
                times = _time_rounds(steps, device, args.reps, args.warmup)
                del steps
                chunk = args.chunk_tokens or default_chunk_tokens(V)
                for v in timed:
                    row = {
                        "variant": v,
                        "N": N,
                        "D": D,
                        "V": V,
                        "check_rel_err": ok[v],
                        **times[v],
                        "chunk_tokens": chunk if v == "chunked" else None,
                    }
                    if not args.no_memory:
                        if device.type == "cuda":
                            row["peak_bytes"] = peak_memory_cuda(_step(v, N, D, V, device, args.chunk_tokens), device)
                        else:
                            row |= _peak_memory_cpu(v, N, D, V, args)
                    rows.append(row)
                base = next(r for r in rows if r["variant"] == "plain" and (r["N"], r["D"], r["V"]) == (N, D, V))
                for r in rows[-len(timed) :]:
                    r["speedup_vs_plain"] = base["wall_s"] / r["wall_s"]
                    r["min_speedup_vs_plain"] = base["wall_min_s"] / r["wall_min_s"]
                    if "peak_bytes" in r:
                        r["memory_vs_plain"] = r["peak_bytes"] / max(base["peak_bytes"], 1)
                    mib = f"{r['peak_bytes'] / 2**20:9.1f}" if "peak_bytes" in r else f"{'-':>9}"
                    mem = f"{r['memory_vs_plain']:9.3f}" if "memory_vs_plain" in r else f"{'-':>9}"
                    ch = str(r["chunk_tokens"]) if r["chunk_tokens"] else "-"
                    print(
                        f"{N:>6} {D:>4} {V:>6} {r['variant']:<8} {ch:>6} {r['wall_s']:8.3f} {r['wall_min_s']:8.3f} {r['cpu_s']:8.3f} {mib} "
                        f"{r['speedup_vs_plain']:8.2f} {r['min_speedup_vs_plain']:6.2f} {mem}",
                        flush=True,
                    )
                write_json(out / "head.json", {"meta": meta, "results": rows})
    _plot(rows, variants, out / "head.png")
    print(f"written: {out / 'head.json'}, {out / 'head.png'}")
    return rows


def _plot(rows, variants, path):
    plt = pyplot()
    cases = sorted({(r["N"], r["D"], r["V"]) for r in rows})
    labels = [f"N{n}\nD{d} V{v}" for n, d, v in cases]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.4 * len(cases)), 4))
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        by = {(r["N"], r["D"], r["V"]): r for r in rows if r["variant"] == v}
        xs = [j + i * width for j in range(len(cases))]
        axes[0].bar(xs, [by[c]["wall_s"] if c in by else 0 for c in cases], width, label=v)
        axes[1].bar(xs, [by[c].get("peak_bytes", 0) / 2**20 if c in by else 0 for c in cases], width, label=v)
    measured = any("peak_bytes" in r for r in rows)
    for ax, title, unit in zip(axes, ("LM head + cross-entropy, forward+backward", "peak memory"), ("s", "MiB")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], labels, fontsize=7)
        ax.set(
            title=title if unit == "s" or measured else "peak memory (not measured)",
            ylabel=unit,
            yscale="log" if unit == "s" or measured else "linear",
        )
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
