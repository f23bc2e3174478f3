"""``basecap bench longctx``: the CPU analogue of the paper's long-context speed row (Lu et al. 2025, arXiv
2505.18522, section 7: Top-1 Chunk Approx pre-trains 4.5x faster than Transformer++ at 100k tokens, 1.3B models on
GPUs). Not the paper's setting: the small CPU size (width 128, depth 4, vocabulary 2048, C = 128), batch 1, fp32.

Per thread count and length T (default 16k, 32k, 64k, 100k), for Top-1 Chunk Approx and Transformer++ (causal SDPA):
- train: one training step (forward, backward, AdamW) at T after one warm-up step at ``--warmup-len``; seconds per
  step (min and median of ``--reps``; one step only when the first takes over ``--single-step-s``, or when the
  repeats are predicted not to fit what is left of the budget), tokens/s (T / median), and the peak resident-set
  growth of the first step;
- decode: after a warm-up prefill of ``--warmup-len`` tokens, a prefill of T tokens (forward only), then
  ``--decode-tokens`` tokens one at a time (after two warm-up tokens); tokens/s (1 / median seconds per token), the
  state's bytes per token (``LM.state_size(T) / T``: the KV cache, plus Approx's per-chunk key sums), the
  resident-set growth the state holds after the prefill, per token, and the peak resident-set growth over prefill and
  decode.
Each measurement runs in a fresh process (glibc's mmap threshold pinned, as ``bench/common.py``'s probes) that may add
at most ``--mem-limit-gib`` of address space (RLIMIT_AS), so that running out of memory is reported rather than left
to the kernel's OOM killer (which might pick another job). Each variant is first checked against its dense reference
(``bench selection``'s check) and not timed if it disagrees. No length is dropped silently: with ``--budget-s``
(seconds per thread count), a measurement whose predicted time (the last measured length of the same variant and
kind, scaled by the model's FLOPs ``LM.flops_per_token(T) x T``) exceeds what is left is recorded as ``over_budget``
with its prediction; one that overruns is killed and recorded as ``timeout``; after ``out_of_memory`` or ``timeout``
the longer lengths of that variant and kind are recorded as ``skipped``.

Writes ``speed.json`` and ``speed.md`` (the tables, ready for a README) into ``--out``. speed.json, schema
``basecap.bench.longctx/1``:
- ``analogue`` (what it is and is not), ``paper`` (the row it is the analogue of), ``meta`` (device, torch, model
  shape and parameters, options, command, load averages at start and end);
- ``rows``, one per threads x T x kind x variant: ``variant`` (``transformer_pp``, ``top1_chunk_approx``, ...),
  ``kind`` ("train" | "decode"), ``T``, ``threads``, ``status`` ("ok" | "over_budget" | "timeout" | "out_of_memory" |
  "skipped" | "error"), ``reason``, ``predicted_s``, ``wall_s``, ``load_average``; when ok, train: ``step_s_min``,
  ``step_s_median``, ``step_s_all`` (every timed step), ``reps``, ``tokens_per_s``, ``peak_rss_growth_bytes``;
  decode: ``prefill_s``, ``decode_s_per_token_min``, ``decode_s_per_token_median``, ``decode_s_per_token_all``,
  ``decode_tokens_per_s``, ``state_bytes``, ``state_bytes_per_token``, ``held_rss_bytes_per_token``,
  ``peak_rss_growth_bytes``;
- ``ratios``, per threads x T x variant other than the reference (the first of ``--variants``): ``train_speedup``
  (the reference's median step over the variant's), ``train_speedup_best`` (of the minima), ``decode_speedup`` (the
  variant's tokens/s over the reference's), ``state_bytes_ratio``, null where either side was not measured; and
  ``flop_ratio``, the reference's forward FLOPs per token over the variant's (``LM.flops_per_token(T)``), the speed-up
  the arithmetic allows (about 38x at 100k for this width; 4.7x by the same count for the paper's 1.3B model).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..atomic import write_json
from .common import peak_rss_growth, rss_kb

SCHEMA = "basecap.bench.longctx/1"
VARIANTS = {
    "transformer_pp": "sdpa",
    "top1_chunk_approx": "top1_chunk_approx",
    "top1_chunk_exact": "top1_chunk_exact",
    "top1_element": "top1_element",
}
LABELS = {"transformer_pp": "Transformer++ (SDPA)", "top1_chunk_approx": "Top-1 Chunk Approx", "top1_chunk_exact": "Top-1 Chunk Exact"}
KINDS = ("train", "decode")
PAPER = {
    "claim": "speed_100k_top1_chunk",
    "row": "pre-training speed at 100k tokens: Top-1 Chunk Approx 4.50x Transformer++",
    "setting": "1.3B, GPUs",
}
ANALOGUE = (
    "CPU analogue of the paper's section-7 speed row, not the paper's setting: a ~1M-parameter model (the small CPU "
    "size) at batch 1 in fp32 on this CPU, Transformer++ on PyTorch's SDPA and Top-1 Chunk Approx on basecap's CPU form"
)


def _model(variant: str, T: int, o: dict):
    from ..matching import resolve
    from ..model import LM, ModelConfig
    from .selection import VARIANTS as MIXERS

    mixer = dict(MIXERS[VARIANTS[variant]], head_dim=o["head_dim"])
    if variant.startswith("top1_chunk"):
        mixer["chunk_len"] = o["chunk_len"]
    torch.manual_seed(0)
    cfg = ModelConfig(preset="tiny", d_model=o["d_model"], n_layers=o["layers"], vocab_size=o["vocab"], max_seq_len=T, mixer=mixer)
    return LM(resolve(cfg))


def _train(model, T: int, o: dict) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)

    def step(idx):
        model.loss(idx[:, :-1], idx[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step(torch.randint(0, o["vocab"], (1, min(T, o["warmup_len"]) + 1), generator=gen))  # threads, kernels, optimizer state
    idx = torch.randint(0, o["vocab"], (1, T + 1), generator=gen)
    times: list[float] = []

    def timed():
        t = time.perf_counter()
        step(idx)
        times.append(time.perf_counter() - t)

    peak = peak_rss_growth(timed)
    while len(times) < o["reps"] and times[0] <= o["single_step_s"]:  # a step this long is its own stable number
        timed()
    med = statistics.median(times)
    return {
        "step_s_min": min(times),
        "step_s_median": med,
        "step_s_all": times,
        "reps": len(times),
        "tokens_per_s": T / med,
        "peak_rss_growth_bytes": peak["peak_bytes"],
        "peak_rss_method": peak["method"],
    }


@torch.no_grad()
def _decode(model, T: int, o: dict) -> dict:
    model.eval()
    idx = torch.randint(0, o["vocab"], (1, T), generator=torch.Generator().manual_seed(1))
    _, warm = model(idx[:, : min(T, o["warmup_len"])], model.init_state(1))  # threads, kernels, one-time buffers
    model(idx[:, :1], warm)
    del warm
    out: dict[str, Any] = {}

    def run():
        base = rss_kb("VmRSS")
        t = time.perf_counter()
        x, state = model.features(idx, model.init_state(1))
        nxt = model.head(x[:, -1:]).argmax(-1)  # the last position's logits only
        out["prefill_s"] = time.perf_counter() - t
        del x
        out["held_rss_bytes"] = (rss_kb("VmRSS") - base) * 1024
        times = []
        for i in range(o["decode_tokens"] + 2):
            t = time.perf_counter()
            logits, state = model(nxt, state)
            nxt = logits[:, -1:].argmax(-1)
            if i >= 2:
                times.append(time.perf_counter() - t)
        out["times"] = times

    peak = peak_rss_growth(run)
    times = out.pop("times")
    med = statistics.median(times)
    return {
        "prefill_s": out["prefill_s"],
        "decode_s_per_token_min": min(times),
        "decode_s_per_token_median": med,
        "decode_s_per_token_all": times,
        "decode_tokens_per_s": 1 / med,
        "state_bytes": model.state_size(T),
        "state_bytes_per_token": model.state_size(T) / T,
        "held_rss_bytes_per_token": out["held_rss_bytes"] / T,
        "peak_rss_growth_bytes": peak["peak_bytes"],
        "peak_rss_method": peak["method"],
    }


def measure(spec: dict) -> dict:
    """One measurement (``spec``: variant, kind, T, threads, options) in this process: the fields of an ok row."""
    torch.set_num_threads(spec["threads"])
    model = _model(spec["variant"], spec["T"], spec["options"])
    return (_train if spec["kind"] == "train" else _decode)(model, spec["T"], spec["options"])


def _probe(spec_json: str) -> None:
    """Subprocess entry: ``measure`` under the address-space limit; prints one JSON line (the row's fields)."""
    spec = json.loads(spec_json)
    _die_with_parent(spec.get("parent"))
    torch.set_num_threads(spec["threads"])
    _model(spec["variant"], 1, spec["options"])  # every import before the limit: only the measurement may hit it
    extra = spec["options"]["mem_limit_gib"]
    if extra > 0:
        limit = rss_kb("VmSize") * 1024 + int(extra * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        res = {"status": "ok", **measure(spec)}
    except (MemoryError, RuntimeError) as e:  # torch's allocator raises RuntimeError when mmap fails
        if not isinstance(e, MemoryError) and "alloc" not in str(e).lower():
            raise
        res = {"status": "out_of_memory", "reason": f"more than {extra:g} GiB of address space: {str(e)[:160]}"}
    print(json.dumps(res))


def _die_with_parent(parent: int | None) -> None:
    """A measurement never outlives the benchmark that started it (Linux: the parent-death signal)."""
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def run_child(spec: dict, timeout: float | None) -> dict:
    """``measure`` in a fresh process: its fields, or the status (timeout, error) with a reason."""
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, "-m", "basecap.bench.longctx", "--probe", json.dumps({**spec, "parent": os.getpid()})]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "reason": f"killed after {timeout:.0f} s"}
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        status = "out_of_memory" if p.returncode in (-9, 137) else "error"
        return {"status": status, "reason": f"exit status {p.returncode}: {tail[:200]}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _cost(variant: str, T: int, o: dict, cache: dict) -> float:
    """The model's forward FLOPs over T tokens: what a prediction scales by."""
    if variant not in cache:
        cache[variant] = _model(variant, 1, o)
    return cache[variant].flops_per_token(T) * T


def _predict(rows: list[dict], spec: dict, o: dict, cache: dict, left: float = float("inf")) -> tuple[float | None, str, int]:
    """Predicted seconds of a measurement, from the last measured length of its variant and kind (or, for a decode,
    the training step at its length), scaled by the model's FLOPs; and the training steps to time: ``reps``, or one
    where a step is predicted over ``single_step_s`` or ``reps`` of them over the ``left`` seconds."""
    v, kind, T, th = spec["variant"], spec["kind"], spec["T"], spec["threads"]
    ok = [r for r in rows if r["status"] == "ok" and r["variant"] == v and r["threads"] == th]
    prev = max((r for r in ok if r["kind"] == kind and r["T"] < T), key=lambda r: r["T"], default=None)
    if prev is not None:
        scale = _cost(v, T, o, cache) / _cost(v, prev["T"], o, cache)
        if kind == "train":
            step = prev["step_s_median"] * scale
            n = 1 if step > o["single_step_s"] or o["reps"] * step > left else o["reps"]
            return n * step, f"{n} x {prev['T']}'s step x {scale:.2f} (FLOPs)", n
        per_token = prev["decode_s_per_token_median"] * T / prev["T"]
        return prev["prefill_s"] * scale + (o["decode_tokens"] + 2) * per_token, f"{prev['T']}'s decode x {scale:.2f} (FLOPs)", o["reps"]
    same = next((r for r in ok if r["kind"] == "train" and r["T"] == T), None)
    if kind == "decode" and same is not None:
        return same["step_s_median"] / 3, "a third of the training step (forward only)", o["reps"]
    return None, "no measurement to scale", o["reps"]


def run_grid(o: dict, runner: Callable[[dict, float | None], dict] = run_child, log=print) -> list[dict]:
    """Every threads x T x kind x variant of ``o``, each a row: measured, or with the reason it was not. Per thread
    count, every training step comes first (the paper's row is training speed), then every decode; within a kind,
    each variant's lengths go in increasing order and the measurement predicted to be shortest goes next, so that a
    budget is spent on what it can hold (a long reference step is what it leaves out). Rows come back sorted by
    threads, T, kind and variant."""
    rows: list[dict] = []
    cache: dict = {}
    for threads in o["threads"]:
        left = o["budget_s"] or float("inf")
        for kind in KINDS:
            pending = {v: sorted(o["lengths"]) for v in o["variants"]}
            failed: dict[str, str] = {}
            while any(pending.values()):
                options = []
                for i, (v, todo) in enumerate(pending.items()):
                    if todo:
                        spec = {"variant": v, "kind": kind, "T": todo[0], "threads": threads, "options": o}
                        pred, how, n = _predict(rows, spec, o, cache, left)
                        spec["options"] = {**o, "reps": n}
                        options.append((pred or 0.0, todo[0], i, spec, pred, how))
                _, T, _, spec, pred, how = min(options, key=lambda x: x[:3])
                v = spec["variant"]
                pending[v].pop(0)
                row: dict[str, Any] = {"variant": v, "kind": kind, "T": T, "threads": threads, "predicted_s": pred, "reason": None}
                if v in failed:
                    row |= {"status": "skipped", "reason": failed[v]}
                elif left <= 0:
                    row |= {"status": "over_budget", "reason": f"the budget of {o['budget_s']:g} s is spent"}
                elif pred is not None and pred > left:
                    row |= {"status": "over_budget", "reason": f"predicted {pred:.0f} s ({how}), {left:.0f} s of the budget left"}
                else:
                    timeout = None if left == float("inf") else max(30.0, min(left, 3 * pred if pred else left))
                    t0, load = time.perf_counter(), os.getloadavg()[0]
                    row |= runner(spec, timeout)
                    row["wall_s"], row["load_average"] = time.perf_counter() - t0, [load, os.getloadavg()[0]]
                    left -= row["wall_s"]
                    if row["status"] in ("out_of_memory", "timeout"):
                        failed[v] = f"{row['status']} at T={T}"
                rows.append(row)
                log(_line(row))
    order = {v: i for i, v in enumerate(o["variants"])}
    return sorted(rows, key=lambda r: (o["threads"].index(r["threads"]), r["T"], KINDS.index(r["kind"]), order[r["variant"]]))


def _line(r: dict) -> str:
    head = f"threads={r['threads']} T={r['T']:<7} {r['kind']:<6} {r['variant']:<18}"
    if r["status"] != "ok":
        return f"{head} not run: {r['status']} ({r['reason']})"
    if r["kind"] == "train":
        return f"{head} {r['step_s_min']:8.2f} / {r['step_s_median']:8.2f} s/step  {r['tokens_per_s']:9.0f} tok/s  peak +{r['peak_rss_growth_bytes'] / 2**30:.2f} GiB"
    return (
        f"{head} prefill {r['prefill_s']:7.2f} s  {r['decode_tokens_per_s']:8.1f} tok/s  state {r['state_bytes_per_token']:.0f} B/token "
        f"(held {r['held_rss_bytes_per_token']:.0f})  peak +{r['peak_rss_growth_bytes'] / 2**30:.2f} GiB"
    )


def ratios(rows: list[dict], reference: str, flops: dict | None = None) -> list[dict]:
    """Each other variant against ``reference`` per threads and T (None where either side was not measured); with
    ``flops`` ({variant: {T: forward FLOPs per token}}) also the FLOP ratio, the speed-up the arithmetic allows."""
    get = {(r["variant"], r["kind"], r["T"], r["threads"]): r for r in rows if r["status"] == "ok"}
    out = []
    for th, T, v in sorted({(r["threads"], r["T"], r["variant"]) for r in rows if r["variant"] != reference}):
        rt, vt = get.get((reference, "train", T, th)), get.get((v, "train", T, th))
        rd, vd = get.get((reference, "decode", T, th)), get.get((v, "decode", T, th))
        out.append(
            {
                "variant": v,
                "reference": reference,
                "T": T,
                "threads": th,
                "train_speedup": rt["step_s_median"] / vt["step_s_median"] if rt and vt else None,
                "train_speedup_best": rt["step_s_min"] / vt["step_s_min"] if rt and vt else None,
                "decode_speedup": vd["decode_tokens_per_s"] / rd["decode_tokens_per_s"] if rd and vd else None,
                "state_bytes_ratio": vd["state_bytes"] / rd["state_bytes"] if rd and vd else None,
                "flop_ratio": flops[reference][T] / flops[v][T] if flops else None,
            }
        )
    return out


def _cell(r: dict | None, kind: str) -> str:
    if r is None:
        return "-"
    if r["status"] != "ok":
        pred = f", predicted {r['predicted_s']:,.0f} s" if r["status"] == "over_budget" and r["predicted_s"] else ""
        return f"not run: {r['status'].replace('_', ' ')}{pred}"
    if kind == "train":
        return f"{r['step_s_min']:.2f} / {r['step_s_median']:.2f} s ({r['tokens_per_s']:,.0f} tok/s, +{r['peak_rss_growth_bytes'] / 2**30:.2f} GiB)"
    return (
        f"{r['decode_tokens_per_s']:,.1f} tok/s; {r['state_bytes_per_token']:,.0f} B/token ({r['held_rss_bytes_per_token']:,.0f} held); "
        f"prefill {r['prefill_s']:.1f} s"
    )


def markdown(res: dict) -> str:
    """The README-ready tables: training step and decoding, a row per threads x T, a column per variant."""
    m, rows, ref = res["meta"], res["rows"], res["meta"]["reference"]
    variants = m["options"]["variants"]
    get = {(r["variant"], r["kind"], r["T"], r["threads"]): r for r in rows}
    rat = {(r["variant"], r["T"], r["threads"]): r for r in res["ratios"]}
    others = [v for v in variants if v != ref]
    lines = [f"**{res['analogue']}.** The paper: {PAPER['row']} ({PAPER['setting']}).", ""]
    lines.append(
        f"{m['device']}; width {m['model']['d_model']}, {m['model']['layers']} layers, vocabulary {m['model']['vocab']}, "
        f"C = {m['model']['chunk_len']}, {m['model']['params']:,} parameters; batch 1, fp32; {m['options']['reps']} timed steps "
        f"(min / median; one where the first took over {m['options']['single_step_s']:g} s), {m['options']['decode_tokens']} decoded tokens (median); load average {m['load_average_start']:.2f} at the start; "
        f"`{m['command']}`."
    )
    for kind, title, key in (
        ("train", "Training step (forward, backward, AdamW): seconds per step min / median, tokens/s, peak RSS growth", "train_speedup"),
        ("decode", "Decoding after a prefill of T tokens: tokens/s, state bytes per token (resident bytes held), prefill time", "decode_speedup"),
    ):
        cols = [LABELS.get(v, v) for v in variants] + [f"{LABELS.get(v, v)}: speed-up" for v in others]
        lines += ["", f"**{title}**", "", "| threads | T | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
        for th in m["options"]["threads"]:
            for T in sorted(m["options"]["lengths"]):
                cells = [_cell(get.get((v, kind, T, th)), kind) for v in variants]
                for v in others:
                    r = rat.get((v, T, th)) or {}
                    limit = f" (FLOPs: {r['flop_ratio']:.1f}x)" if kind == "train" and r.get("flop_ratio") else ""
                    cells.append((f"{r[key]:.2f}x" if r.get(key) else "-") + limit)
                lines.append(f"| {th} | {T:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="basecap bench longctx", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768, 65536, 100000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--variants", nargs="+", default=["transformer_pp", "top1_chunk_approx"], choices=list(VARIANTS), help="the first is the reference"
    )
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=2048, help="the small-vocab corpus's")
    ap.add_argument("--chunk-len", type=int, default=128, help="Top-1 Chunk's C (the paper's 128)")
    ap.add_argument("--reps", type=int, default=2, help="timed training steps per length (min and median reported)")
    ap.add_argument(
        "--single-step-s", type=float, default=300, help="a step longer than this is timed once (so is one whose repeats would not fit the budget)"
    )
    ap.add_argument("--warmup-len", type=int, default=2048, help="the one warm-up training step's length")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--budget-s", type=float, default=600, help="seconds per thread count (0: no budget)")
    ap.add_argument("--mem-limit-gib", type=float, default=16, help="address space a measurement may add to its process (RLIMIT_AS; 0: no limit)")
    ap.add_argument("--in-process", action="store_true", help="measure in this process (tests; memory numbers then carry its history)")
    ap.add_argument("--out", default="bench_results/longctx")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None):
    from .selection import self_check

    args = _parser().parse_args(argv)
    if args.probe:
        return _probe(args.probe)
    for name in ("lengths", "threads"):
        if min(getattr(args, name)) < 1:
            raise SystemExit(f"bench longctx: --{name} must be positive, got {getattr(args, name)}")
    if args.reps < 1 or args.decode_tokens < 1:
        raise SystemExit(f"bench longctx: --reps and --decode-tokens must be >= 1, got {args.reps}, {args.decode_tokens}")
    o = {k: v for k, v in vars(args).items() if k not in ("probe", "out")}
    check = argparse.Namespace(heads=max(1, args.d_model // args.head_dim), head_dim=args.head_dim, chunk_len=args.chunk_len)
    good = self_check([VARIANTS[v] for v in args.variants], check, torch.device("cpu"))
    o["variants"] = [v for v in args.variants if good[VARIANTS[v]]]
    load0 = os.getloadavg()[0]
    if args.in_process:
        rows = run_grid(o, lambda spec, _timeout: {"status": "ok", **measure(spec)})
    else:
        rows = run_grid(o)
    model = _model(o["variants"][0], 1, o)
    meta = {
        "device": f"{platform.processor() or platform.machine()} CPU ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "reference": o["variants"][0],
        "model": {
            "d_model": args.d_model,
            "layers": args.layers,
            "vocab": args.vocab,
            "chunk_len": args.chunk_len,
            "params": model.param_counts()["total"],
        },
        "options": o,
        "command": "basecap bench longctx " + " ".join(argv if argv is not None else sys.argv[1:]),
        "load_average_start": load0,
        "load_average_end": os.getloadavg()[0],
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    flops = {v: {T: _model(v, 1, o).flops_per_token(T) for T in args.lengths} for v in o["variants"]}
    res = {"schema": SCHEMA, "analogue": ANALOGUE, "paper": PAPER, "meta": meta, "rows": rows, "ratios": ratios(rows, o["variants"][0], flops)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "speed.json", res)
    table = markdown(res)
    (out / "speed.md").write_text(table, encoding="utf-8")
    print("\n" + table + f"\nwritten: {out / 'speed.json'}, {out / 'speed.md'}")
    return res


if __name__ == "__main__":
    main()
