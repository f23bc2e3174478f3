"""``basecap bench train``: the trainer's overhead against a minimal plain PyTorch loop.

Both train the same model (same config, same initial weights, same batches materialised up front
for the plain loop) in the same process, alternating trainer and plain windows to cancel drift.
Reported: median tokens/s of optimizer steps (evaluation and checkpointing are excluded from both:
they are configured work, not overhead), and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _plain_steps(model, opt, batches, clip):
    times = []
    for x, y in batches:
        t = time.perf_counter()
        loss = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t)
    return times


def main(argv: list[str] | None = None):
    from ..config import validate_run
    from ..data import TrainBatches, build_corpus, load_recipe
    from ..matching import resolve
    from ..model import build_model
    from ..rundir import RunDir, write_json
    from ..train import make_optimizer, train

    ap = argparse.ArgumentParser(prog="basecap bench train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="default")
    ap.add_argument("--mixer", default="attention")
    ap.add_argument("--steps", type=int, default=30, help="steps per window")
    ap.add_argument("--windows", type=int, default=2, help="alternating trainer/plain windows")
    ap.add_argument("--d-model", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default="bench_results/train")
    args = ap.parse_args(argv)

    corpus = build_corpus(load_recipe(args.recipe))
    domain = corpus.domains[0]
    steps = args.steps
    cfg = resolve(validate_run({
        "name": "bench", "data": {"recipe": args.recipe, "train_weights": {domain: 1.0}, "seq_len": args.seq_len, "eval_domains": [domain]},
        "model": {"d_model": args.d_model, "n_layers": args.layers, "max_seq_len": args.seq_len, "mixer": {"name": args.mixer}},
        "train": {"steps": steps, "batch_size": args.batch, "warmup_steps": 1, "checkpoint_every": 10**9, "progress": False},
        "eval": {"every": 10**9, "max_tokens": args.seq_len * 8, "batch_size": 8},
    }))
    tb = TrainBatches(corpus, weights={domain: 1.0}, seq_len=args.seq_len, batch_size=args.batch, seed=0)
    batches = [tb.batch(s) for s in range(steps)]
    tok = args.batch * args.seq_len
    trainer_tps, plain_tps = [], []
    for w in range(args.windows):
        with tempfile.TemporaryDirectory() as tmp:
            train(cfg, Path(tmp) / "run", corpus=corpus, log=lambda *_: None)
            recs = RunDir(Path(tmp) / "run").read_metrics()
            trainer_tps += [r["tokens_per_s"] for r in recs if r["kind"] == "train"][2:]  # skip warm-up steps
        torch.manual_seed(0)
        model = build_model(cfg.model, corpus.vocab_size)
        opt = make_optimizer(model, cfg.train)
        plain_tps += [tok / t for t in _plain_steps(model, opt, batches, cfg.train.grad_clip)[2:]]
    tr, pl = statistics.median(trainer_tps), statistics.median(plain_tps)
    overhead = pl / tr - 1
    res = {"mixer": args.mixer, "d_model": args.d_model, "layers": args.layers, "seq_len": args.seq_len, "batch": args.batch,
           "threads": torch.get_num_threads(), "trainer_tokens_per_s": tr, "plain_tokens_per_s": pl,
           "overhead_pct": 100 * overhead, "target_pct": 5.0, "met": overhead <= 0.05}
    print(f"{'loop':<10}{'tokens/s (median)':>20}")
    print(f"{'trainer':<10}{tr:>20.0f}\n{'plain':<10}{pl:>20.0f}")
    print(f"trainer overhead: {100 * overhead:+.1f}% (target <= 5%: {'met' if res['met'] else 'MISSED'})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "train.json", res)
    print(f"written: {out / 'train.json'}")
    return res


if __name__ == "__main__":
    main()
