"""``basecap bench data``: tokenisation speed and training-batch loader speed.

Tokenisation: MB of UTF-8 text per second through the build's unit pipeline (worker processes,
committed units; pool start-up included), with 1 worker and with N, and MB per CPU second (which
shows per-core efficiency when the machine is shared). The text is a sample decoded
from a built corpus (``--corpus``, or the default corpus when it is already built), else real text
found on any machine (the Python standard library's sources and reference topics) with a BPE
trained on it.

Loader: ``TrainBatches.batch`` (one rank's rows of one step) at the 110m preset's shape (global
batch 256 x 2048 tokens over 8 ranks: 32 rows per rank) and at the tiny shape (16 x 256, one
rank), median after warm-up, from the page cache. The 110m per-rank time is compared with the
planner's step time on 8 x H100 (``basecap plan``), or with ``--step-time``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {"110m": {"seq_len": 2048, "batch_size": 32, "world_size": 8}, "tiny": {"seq_len": 256, "batch_size": 16, "world_size": 1}}


def _default_corpus():
    from ..data import data_home, load_corpus

    built = sorted((data_home() / "corpora").glob("default-*/manifest.json"), key=lambda p: p.stat().st_mtime)
    return load_corpus(built[-1].parent) if built else None


def _sample_from_corpus(corpus, mb: float) -> list[str]:
    """Documents decoded from the train splits, in shard order, about ``mb`` MB spread over domains."""
    texts, want = [], mb * 1e6 / len(corpus.domains)
    for d in corpus.domains:
        toks = np.asarray(corpus.tokens(d, "train"))
        ends = np.flatnonzero(toks == corpus.eot_id)
        got, start = 0, 0
        for end in ends:
            if got >= want:
                break
            text = corpus.tokenizer.decode(toks[start:end].tolist(), skip_special_tokens=False)
            texts.append(text)
            got += len(text.encode("utf-8"))
            start = int(end) + 1
    return texts


def _sample_from_python(mb: float) -> list[str]:
    from pydoc_data import topics

    texts = list(topics.topics.values())
    size = sum(len(t.encode("utf-8")) for t in texts)
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if size >= mb * 1e6:
            break
        text = p.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        size += len(text.encode("utf-8"))
    return texts


def _first_bytes(texts: list[str], n: int) -> list[str]:
    out = []
    for t in texts:
        if n <= 0:
            break
        out.append(t[:n])
        n -= len(t.encode("utf-8"))
    return out


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (workers), where the OS reports them."""
    try:
        import resource
    except ImportError:
        return float("nan")
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def bench_tokenize(texts: list[str], tokenizer_path: Path, workers: int, unit_bytes: int, reps: int) -> dict:
    """MB/s of text through ``run_units`` (median wall time; fresh output folder each time), and MB per CPU second."""
    from ..data.tokenize import plan_units, run_units
    from ..data.tokenizer import EOT, load_tokenizer

    tok, eot_id = load_tokenizer(tokenizer_path)
    nbytes = [len(t.encode("utf-8")) for t in texts]
    digests = [i.to_bytes(8, "big") for i in range(len(texts))]
    units = plan_units("bench", digests, nbytes, range(len(texts)), "bench", unit_bytes)
    dtype = np.uint16 if tok.get_vocab_size() <= 65535 else np.uint32
    times, cpu = [], _cpu_s()
    for _ in range(reps):
        folder = Path(tempfile.mkdtemp(prefix="basecap-bench-tok-"))
        try:
            t = time.perf_counter()
            run_units(
                units,
                lambda u: [texts[i] for i in u.docs],
                folder,
                tokenizer_path,
                EOT,
                eot_id,
                dtype=dtype,
                workers=workers,
                progress=False,
                log=lambda m: None,
            )
            times.append(time.perf_counter() - t)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    mb = sum(nbytes) / 1e6
    return {"workers": workers, "mb_per_s": mb / statistics.median(times), "mb_per_cpu_s": mb * reps / (_cpu_s() - cpu)}


def _synthetic_corpus(folder: Path, n_tokens: int, vocab: int):
    """A one-domain corpus of random tokens, for the loader (whose speed does not depend on the text)."""
    from ..data.corpus import MANIFEST_FORMAT, Corpus

    (folder / "tokens").mkdir(parents=True)
    np.random.default_rng(0).integers(0, vocab, n_tokens, dtype=np.uint16).tofile(folder / "tokens" / "web.train.bin")
    splits = {s: {"documents": 0, "bytes": 0, "tokens": 0, "file": f"tokens/web.{s}.bin", "sha256": ""} for s in ("validation", "test")}
    splits["train"] = {"documents": 1, "bytes": 4 * n_tokens, "tokens": n_tokens, "file": "tokens/web.train.bin", "sha256": ""}
    manifest = {
        "format": MANIFEST_FORMAT,
        "dtype": "uint16",
        "splits": ["train", "validation", "test"],
        "tokenizer": {"vocab_size": vocab, "eot_id": vocab - 1, "eot_token": "<|endoftext|>"},
        "domains": {"web": {"role": "train", "splits": splits, "tokens": n_tokens}},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return Corpus(folder)


def bench_loader(corpus, seq_len: int, batch_size: int, world_size: int, steps: int = 200) -> float:
    """Median seconds of one rank's ``batch(step)`` over ``steps`` steps, after warm-up."""
    from ..data import TrainBatches

    tb = TrainBatches(
        corpus, weights={d: 1.0 for d in corpus.domains}, seq_len=seq_len, batch_size=batch_size, seed=0, rank=world_size - 1, world_size=world_size
    )
    for s in range(10):
        tb.batch(10**6 + s)
    times = []
    for s in range(steps):
        t = time.perf_counter()
        tb.batch(s)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def planned_step_time(experiment: str, gpus: int) -> dict:
    """Seconds per step at the 110m size from the planner: the reference run and the fastest run."""
    from ..plan import plan_experiment

    rows = plan_experiment(experiment, ["size=110m"], gpus=gpus)
    per = {r["run"]: r["est_hours"] * 3600 / r["steps"] for r in rows}
    fastest = min(per, key=lambda r: per[r])
    ref = next((r["run"] for r in rows if r["run"] == "transformer_pp"), rows[0]["run"])
    return {
        "reference_run": ref,
        "reference_s": per[ref],
        "fastest_run": fastest,
        "fastest_s": per[fastest],
        "gpu": rows[0]["gpu"],
        "gpus": gpus,
        "mfu": rows[0]["mfu"],
        "vocab_size": rows[0]["vocab_size"],
        "tokens_per_step": rows[0]["tokens_per_step"],
        "micro_batch_per_gpu": rows[0]["micro_batch_per_gpu"],
    }


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="basecap bench data", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--corpus",
        default=None,
        help="a built corpus folder or a recipe name (built if needed); default: the default corpus if already built, else Python's own text",
    )
    ap.add_argument("--mb", type=float, default=8.0, help="MB of text to tokenise per measurement")
    ap.add_argument("--workers", type=int, default=None, help="N for the N-worker measurement (default: usable CPUs)")
    ap.add_argument("--unit-bytes", type=int, default=1_000_000, help="text per unit of work")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument(
        "--experiment",
        default="experiments/paper/architectures.toml",
        help="experiment whose 110m plan gives the step time (its fastest run is the strictest budget)",
    )
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--step-time", type=float, default=None, help="seconds per 110m step (skips the planner)")
    ap.add_argument("--out", default="bench_results/data")
    return ap


def _text_sample(corpus, mb: float, tmp: Path) -> tuple[str, Path, list[str]]:
    """(where the text comes from, the tokenizer, the texts): documents of the corpus with its own tokenizer, or
    without a corpus Python's own text with a BPE trained on it (saved in ``tmp``)."""
    from ..data.tokenizer import train_bpe

    if corpus is not None:
        return f"corpus {corpus.name}", Path(corpus.tokenizer_path), _sample_from_corpus(corpus, mb)
    texts = _sample_from_python(mb)
    tok_path = tmp / "tokenizer.json"
    train_bpe(_first_bytes(texts, 4_000_000), 32768).save(str(tok_path))
    return "Python standard library sources and reference topics", tok_path, texts


def _tokenize_rows(texts: list[str], tok_path: Path, workers: int, unit_bytes: int, reps: int) -> list[dict]:
    """``bench_tokenize`` with 1 worker and with ``workers``, each printed as it is measured."""
    rows = []
    for n in dict.fromkeys([1, workers]):
        row = bench_tokenize(texts, tok_path, n, unit_bytes, reps)
        rows.append(row)
        print(f"  {n:>3} worker{'s' if n > 1 else ' '}  {row['mb_per_s']:8.2f} MB/s  ({row['mb_per_cpu_s']:.2f} MB per CPU second)", flush=True)
    return rows


def _loader_rows(corpus, plan: dict) -> list[dict]:
    """``bench_loader`` at every shape of ``SHAPES``, the 110m one against the planned step times; each printed."""
    rows = []
    for shape, kw in SHAPES.items():
        t = bench_loader(corpus, **kw)
        row = {"shape": shape, **kw, "batch_s": t, "batches_per_s": 1 / t, "tokens_per_s": kw["batch_size"] * kw["seq_len"] / t}
        if shape == "110m":
            row["pct_of_step_reference"] = 100 * t / plan["reference_s"]
            row["pct_of_step_fastest"] = 100 * t / plan["fastest_s"]
        rows.append(row)
        pct = f"  {row['pct_of_step_fastest']:.2f}% of the fastest 110m step" if shape == "110m" else ""
        print(
            f"  {shape:<5} {kw['batch_size']:>3} x {kw['seq_len']:<5} rank {kw['world_size'] - 1} of "
            f"{kw['world_size']}  {t * 1e3:7.3f} ms/batch  {1 / t:8.0f} batches/s{pct}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None):
    from ..data import build_corpus, load_corpus
    from ..data.tokenize import usable_cpus

    args = _parser().parse_args(argv)
    import torch

    torch.set_num_threads(1)
    workers = args.workers or usable_cpus()

    corpus = None
    if args.corpus:
        corpus = load_corpus(args.corpus) if Path(args.corpus).is_dir() else build_corpus(args.corpus)
    else:
        corpus = _default_corpus()
    tmp = Path(tempfile.mkdtemp(prefix="basecap-bench-data-"))
    try:
        text_source, tok_path, texts = _text_sample(corpus, args.mb, tmp)
        mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
        print(f"tokenisation: {mb:.1f} MB of text from {text_source}, units of {args.unit_bytes / 1e6:g} MB", flush=True)
        tok_rows = _tokenize_rows(texts, tok_path, workers, args.unit_bytes, args.reps)

        loader_corpus = corpus or _synthetic_corpus(tmp / "corpus", 32_000_000, 32768)
        if args.step_time is not None:
            plan = {"reference_run": "given", "reference_s": args.step_time, "fastest_run": "given", "fastest_s": args.step_time}
        else:
            plan = planned_step_time(args.experiment, args.gpus)
        print(
            f"loader: TrainBatches on {loader_corpus.name}; 110m step time from the plan: "
            f"{plan['reference_s'] * 1e3:.1f} ms ({plan['reference_run']}), fastest "
            f"{plan['fastest_s'] * 1e3:.1f} ms ({plan['fastest_run']})",
            flush=True,
        )
        load_rows = _loader_rows(loader_corpus, plan)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "meta": {
            "cpus": usable_cpus(),
            "text": text_source,
            "text_mb": mb,
            "unit_bytes": args.unit_bytes,
            "loader_corpus": loader_corpus.name,
            "plan": plan,
        },
        "tokenize": tok_rows,
        "loader": load_rows,
    }
    (out / "data.json").write_text(json.dumps(result, indent=1))
    print(f"written: {out / 'data.json'}")
    return result


if __name__ == "__main__":
    main()
