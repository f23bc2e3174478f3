"""``basecap bench mixers``: training and decoding speed of every mixer against sequence length.

One mixer layer at the tiny preset's width (d_model 192), batch 1, fp32:
- forward+backward time of the training form (``impl = auto``) at T = 512, 2048, 8192;
- the step-by-step reference at T = 2048 (chunked-vs-reference speed-up);
- per-token decode latency after prefilling a context of 1k, 4k, 16k tokens (interleaved rounds);
- the scaling exponent of the training form between the first and last length (slope of log time against
  log T) next to the one the mixer's cost string in ``basecap mixers`` predicts (``catalog.cost_exponent``).
A mixer whose fast form disagrees with its reference (rel. err > 1e-4 at T = 100) is reported as
failed and its numbers are not used. Targets (issue): stateful training form <= 2x Transformer++ at
T = 2048 and faster at 8192; chunked >= 10x the reference at 2048; decode at 16k within 1.2x of 1k.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ..atomic import write_json
from ..mixers import build_mixer, mixer_class, mixer_names, parse_mixer_config
from .common import fwd_bwd, median_time, pyplot, rel_err

D_MODEL = 192


DEFAULT_VARIANTS = ["attention:window=256"]  # sliding window (the paper's W at 2k), besides every registered mixer


def parse_spec(spec: str) -> tuple[str, dict]:
    """``NAME`` or ``NAME:key=value,key=value`` (e.g. ``attention:window=256``) -> (name, config overrides)."""
    name, _, rest = spec.partition(":")
    over = {}
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq:
            raise SystemExit(f"bench mixers: {spec!r}: expected key=value after ':', got {item!r}")
        try:
            over[key] = json.loads(val)
        except ValueError:
            over[key] = val
    parse_mixer_config({"name": name, **over})  # a bad name or switch fails here, before any timing
    return name, over


def _make(spec: str, **over):
    torch.manual_seed(0)
    name, base = parse_spec(spec)
    cfg = parse_mixer_config({"name": name, **base, **over})
    return build_mixer(cfg, D_MODEL, max_seq_len=16384 + 64)


def _correct(spec: str) -> float | None:
    impls = mixer_class(parse_spec(spec)[0]).impls
    if len(impls) < 2:
        return None
    ref, fast = _make(spec, impl=impls[0]), _make(spec, impl="auto")
    x = torch.randn(1, 100, D_MODEL)
    with torch.no_grad():
        return rel_err(fast(x)[0], ref(x)[0])


def _decode_latencies(m, contexts, steps: int = 16, rounds: int = 9) -> dict[int, float]:
    """Seconds per decoded token after a prefill of each context length.

    Every context is prefilled first; then rounds of ``steps`` decode steps from each saved state
    alternate over the contexts and the median round counts. Interleaving matters: timing one context
    after the other charged the process's warm-up to whichever came first (decode at 1k measured up to
    1.6x slower than at 16k for a constant-size state).
    """
    with torch.no_grad():
        states = {}
        for ctx in contexts:
            _, states[ctx] = m(torch.randn(1, ctx, D_MODEL), m.init_state(1))
        tok = torch.randn(1, 1, D_MODEL)
        times: dict[int, list[float]] = {ctx: [] for ctx in contexts}
        for r in range(rounds + 1):
            for ctx in contexts:
                s = states[ctx]  # forward never mutates a state, so every round starts from the prefill
                t = time.perf_counter()
                for _ in range(steps):
                    _, s = m(tok, s)
                if r:  # round 0 is warm-up
                    times[ctx].append((time.perf_counter() - t) / steps)
        return {ctx: statistics.median(v) for ctx, v in times.items()}


def train_exponent(spec: str, lengths: tuple[int, int] = (2048, 8192), reps: int = 2) -> dict:
    """The measured scaling exponent of a mixer's training form (forward + backward) between two lengths: the
    slope of log time against log T, each time the fastest of ``reps`` in process CPU time after a warm-up (CPU
    time, so other jobs on a shared machine move it less), and the exponent its cost string predicts."""
    from ..catalog import cost_exponent, mixer_cost

    m = _make(spec)
    times = {}
    for T in lengths:
        step = fwd_bwd(m, torch.randn(1, T, D_MODEL, requires_grad=True))
        step()
        best = float("inf")
        for _ in range(reps):
            c = time.process_time()
            step()
            best = min(best, time.process_time() - c)
        times[T] = best
    t1, t2 = lengths
    cost = mixer_cost(m, t2)
    return {
        "cost": cost,
        "times": times,
        "exponent": math.log(times[t2] / times[t1]) / math.log(t2 / t1),
        "predicted": cost_exponent(cost, t1, t2, chunk=getattr(m.cfg, "chunk_len", 1), window=getattr(m.cfg, "window", 1) or 1),
    }


def _add_exponents(results: dict, args) -> None:
    """Each benchmarked mixer's measured exponent between the first and last length, beside its cost string's."""
    from ..catalog import cost_exponent, mixer_cost

    t1, t2 = args.lengths[0], args.lengths[-1]
    for name, row in results.items():
        if not row["ok"] or t1 == t2:
            continue
        m = _make(name)
        cost = mixer_cost(m, t2)
        row["cost"] = cost
        row["exponent"] = math.log(row["train_s"][t2] / row["train_s"][t1]) / math.log(t2 / t1)
        row["cost_exponent"] = cost_exponent(cost, t1, t2, chunk=getattr(m.cfg, "chunk_len", 1), window=getattr(m.cfg, "window", 1) or 1)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="basecap bench mixers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--mixers", nargs="*", default=None, help="NAME or NAME:key=value,... (default: every registered mixer, plus attention:window=256)"
    )
    ap.add_argument("--lengths", nargs="*", type=int, default=[512, 2048, 8192])
    ap.add_argument("--contexts", nargs="*", type=int, default=[1024, 4096, 16384])
    ap.add_argument("--ref-length", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="small grid (T = 256, 1024; contexts 512, 2048)")
    ap.add_argument("--out", default="bench_results/mixers")
    return ap


def _measure(name: str, args) -> dict:
    """Correctness against the reference, then training-form, reference and decode timings of one mixer."""
    err = _correct(name)
    row: dict[str, Any] = {"correct_rel_err": err, "ok": err is None or err <= 1e-4, "train_s": {}, "decode_ms": {}}
    if not row["ok"]:
        print(f"{name}: fast form disagrees with the reference (rel err {err:.2e}); not benchmarked")
        return row
    m = _make(name)
    for T in args.lengths:
        x = torch.randn(1, T, D_MODEL, requires_grad=True)
        row["train_s"][T] = median_time(fwd_bwd(m, x), reps=args.reps, budget_s=120)
    impls = mixer_class(parse_spec(name)[0]).impls
    if len(impls) > 1:
        ref = _make(name, impl=impls[0])
        x = torch.randn(1, args.ref_length, D_MODEL, requires_grad=True)
        fwd_bwd(ref, torch.randn(1, 64, D_MODEL, requires_grad=True))()  # warm up on a short input
        row.update(_ref_vs_fast(fwd_bwd(ref, x), fwd_bwd(m, x), rounds=3))
    row["decode_ms"] = {ctx: 1e3 * t for ctx, t in _decode_latencies(m, args.contexts).items()}
    print(f"{name}: done", flush=True)
    return row


def _ref_vs_fast(ref_step, fast_step, rounds: int) -> dict:
    """Reference and fast form timed in alternation (one of each per round), wall and process CPU time, so a
    change in machine load moves both sides alike; medians over the rounds."""
    fast_step()  # warm-up of the fast form at this length
    walls: dict[str, list[float]] = {"ref": [], "fast": []}
    cpus: dict[str, list[float]] = {"ref": [], "fast": []}
    for _ in range(rounds):
        for side, step in (("ref", ref_step), ("fast", fast_step)):
            w, c = time.perf_counter(), time.process_time()
            step()
            walls[side].append(time.perf_counter() - w)
            cpus[side].append(time.process_time() - c)
    med = {k: {side: statistics.median(v) for side, v in d.items()} for k, d in (("wall", walls), ("cpu", cpus))}
    return {
        "ref_train_s": med["wall"]["ref"],
        "ref_fast_train_s": med["wall"]["fast"],
        "speedup_vs_ref": med["wall"]["ref"] / med["wall"]["fast"],
        "speedup_vs_ref_cpu": med["cpu"]["ref"] / med["cpu"]["fast"],
    }


def _grid_points(args) -> tuple[int, int, int, int]:
    """The two training lengths and the two decode contexts the targets and ratios compare."""
    L2, L8 = (2048, 8192) if 8192 in args.lengths else (args.lengths[0], args.lengths[-1])
    return L2, L8, args.contexts[0], args.contexts[-1]


def _add_targets(results: dict, args) -> None:
    att = results["attention"]
    L2, L8, c1, c16 = _grid_points(args)
    for name, row in results.items():
        if not row["ok"] or name == "attention":
            continue
        tr = row["train_s"]
        probe = _make(name)
        grows = probe.state_size(c16) != probe.state_size(c1)
        row["targets"] = {
            f"train_{L2}_le_2x_attention": tr[L2] <= 2 * att["train_s"][L2] if L2 in tr else None,
            f"train_{L8}_faster_than_attention": tr[L8] < att["train_s"][L8] if L8 in tr else None,
            "chunked_10x_ref": (row["speedup_vs_ref"] >= 10) if "speedup_vs_ref" in row else None,
            f"decode_{c16}_within_1.2x_of_{c1}": (row["decode_ms"][c16] <= 1.2 * row["decode_ms"][c1]) if not grows else None,
        }


def _print_table(results: dict, args) -> None:
    att = results["attention"]
    L2, L8, c1, c16 = _grid_points(args)
    head = (
        f"{'mixer':<22}"
        + "".join(f"{'fb T=' + str(T):>11}" for T in args.lengths)
        + f"{'x attn@' + str(L2):>11}{'x attn@' + str(L8):>11}{'ref/fast':>10}"
        + "".join(f"{'dec@' + str(c):>11}" for c in args.contexts)
        + f"{'  dec ' + str(c16) + '/' + str(c1):>13}"
    )
    print("\nforward+backward seconds (B=1, d_model 192), decode ms/token; ratios against attention (Transformer++)")
    print(head)
    for name, row in results.items():
        if not row["ok"]:
            print(f"{name:<22}FAILED correctness (rel err {row['correct_rel_err']:.2e})")
            continue
        tr = row["train_s"]
        line = f"{name:<22}" + "".join(f"{tr[T]:>11.3f}" for T in args.lengths)
        line += f"{tr[L2] / att['train_s'][L2]:>11.2f}{tr[L8] / att['train_s'][L8]:>11.2f}"
        line += f"{row.get('speedup_vs_ref', float('nan')):>10.1f}"
        line += "".join(f"{row['decode_ms'][c]:>11.2f}" for c in args.contexts)
        line += f"{row['decode_ms'][c16] / row['decode_ms'][c1]:>13.2f}"
        print(line)


def main(argv: list[str] | None = None):
    args = _parser().parse_args(argv)
    if args.quick:
        args.lengths, args.contexts, args.ref_length, args.reps = [256, 1024], [512, 2048], 512, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.mixers or [*mixer_names(), *DEFAULT_VARIANTS]
    for spec in names:
        parse_spec(spec)
    if "attention" not in names:
        names = ["attention", *names]
    results = {name: _measure(name, args) for name in names}
    _add_targets(results, args)
    _add_exponents(results, args)
    _print_table(results, args)
    if any("exponent" in r for r in results.values()):
        print(f"\nscaling exponent of forward+backward, T = {args.lengths[0]} -> {args.lengths[-1]}: measured vs the cost string's")
        for name, row in results.items():
            if "exponent" in row:
                print(f"{name:<22}{row['exponent']:>8.2f}{row['cost_exponent']:>8.2f}   {row['cost']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "d_model": D_MODEL,
        "batch": 1,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "grid": {
            "mixers": list(args.mixers or names),
            "lengths": args.lengths,
            "contexts": args.contexts,
            "ref_length": args.ref_length,
            "reps": args.reps,
        },
    }
    write_json(out / "mixers.json", {"meta": meta, "results": results})
    _plot(results, args, out / "mixers.png")
    print(f"written: {out / 'mixers.json'}, {out / 'mixers.png'}")
    return results


def _plot(results, args, path):
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, row in results.items():
        if not row["ok"]:
            continue
        a.plot(args.lengths, [row["train_s"][T] for T in args.lengths], "-o", label=name, lw=2.5 if name == "attention" else 1)
        b.plot(args.contexts, [row["decode_ms"][c] for c in args.contexts], "-o", label=name, lw=2.5 if name == "attention" else 1)
    a.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="forward+backward s", title="training form, one layer")
    b.set(xscale="log", yscale="log", xlabel="context length", ylabel="ms / token", title="decoding, one layer")
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
