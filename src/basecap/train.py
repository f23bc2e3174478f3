"""The training loop: one loop for every architecture (no mixer-specific branches).

AdamW with warmup + cosine decay, gradient clipping and accumulation, fp32 on CPU and bf16 autocast
on CUDA; evaluation of every domain every K steps into ``metrics.jsonl``; atomic checkpoints that
resume exactly (the batch of step s is a pure function of (seed, s), and optimizer + RNG state are
restored), so a killed run continues with the same loss sequence it would have had.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from contextlib import nullcontext
from functools import partial
from importlib import metadata
from pathlib import Path

import torch

from .checkpoint import latest_good_checkpoint, restore, save_checkpoint
from .config import RunConfig
from .config_base import ConfigError
from .distributed import grad_sync, init_distributed, mean_across_ranks, wrap
from .eval.ood import DomainEvaluator, in_domain_loss
from .model import LM


class TrainingDiverged(RuntimeError):
    pass


def resolve_device(cfg: RunConfig, local_rank: int = 0) -> tuple[torch.device, torch.dtype | None]:
    want = cfg.train.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' requested but no CUDA device is available; allowed here: cpu, auto")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dtype = cfg.train.dtype
    if dtype == "auto":
        dtype = "bf16" if dev.type == "cuda" else "fp32"
    return dev, (torch.bfloat16 if dtype == "bf16" else None)


def lr_at(step: int, cfg) -> float:
    """Linear warmup to ``lr`` then cosine decay to ``lr * min_lr_ratio`` (step counts from 0)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, foreach=True)


def environment_info(device: torch.device) -> dict:
    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).parent).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5,
                                    cwd=Path(__file__).parent).stdout.strip()) if commit else None
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    dev = {"type": device.type, "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine()}
    if device.type == "cuda":
        dev["name"] = torch.cuda.get_device_name(device)
    return {
        "git_commit": commit, "git_dirty": dirty, "python": sys.version.split()[0], "platform": platform.platform(),
        "packages": {p: version(p) for p in ("basecap", "torch", "numpy", "tokenizers", "safetensors", "pydantic")},
        "device": dev,
    }


def build_model(cfg: RunConfig, vocab_size: int) -> LM:
    mcfg = cfg.model.model_copy(update={"vocab_size": vocab_size})
    return LM(mcfg)


def _truncate_metrics(path: Path, step: int):
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)


def check_domains(cfg: RunConfig, corpus):
    for field, names in (("data.train_weights", list(cfg.data.train_weights)), ("data.eval_domains", cfg.data.eval_domains or [])):
        bad = [d for d in names if d not in corpus.domains]
        if bad:
            raise ConfigError(f"{field}: unknown domain(s) {bad}; the corpus has: {', '.join(corpus.domains)}")


def train(cfg: RunConfig, run_dir: str | Path, corpus=None, log=print) -> dict:
    """Train one run into ``run_dir`` (resuming from its last good checkpoint) and return the final
    evaluation record. A finished run is not trained again."""
    from .data import TrainBatches, build_corpus, load_recipe

    run_dir = Path(run_dir)
    device, amp_dtype = resolve_device(cfg, int(os.environ.get("LOCAL_RANK", "0")))
    env = init_distributed(device.type)
    if env.active and cfg.train.batch_size % (env.world_size * cfg.train.grad_accum):
        raise ConfigError(f"train.batch_size={cfg.train.batch_size} must be divisible by world_size x grad_accum = "
                          f"{env.world_size} x {cfg.train.grad_accum}")
    if not env.is_main:
        log = lambda *_: None  # noqa: E731 - only rank 0 talks and writes
    done_path = run_dir / "done.json"
    if done_path.exists():
        done = json.loads(done_path.read_text())
        if done.get("steps") == cfg.train.steps:
            log(f"[{cfg.run_id}] already finished ({cfg.train.steps} steps); skipping")
            return done["final"]
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    corpus = corpus or build_corpus(load_recipe(cfg.data.recipe), log=log)
    check_domains(cfg, corpus)
    if cfg.train.threads and device.type == "cpu":
        torch.set_num_threads(cfg.train.threads)
    autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype) if amp_dtype else None

    torch.manual_seed(cfg.seed)
    core = build_model(cfg, corpus.vocab_size).to(device)
    counts, flops, state_bytes = core.param_counts(), core.flops_per_token(cfg.data.seq_len), core.state_size(cfg.data.seq_len)
    model = wrap(core, cfg.train.parallel, env, device)
    opt = make_optimizer(model, cfg.train)
    metrics_path = run_dir / "metrics.jsonl"
    ckpt_root = run_dir / "checkpoints"
    start = 0
    ckpt = latest_good_checkpoint(ckpt_root, log=log)
    if ckpt is not None:
        start = restore(ckpt, model, opt)["step"]
        log(f"[{cfg.run_id}] resuming from {ckpt.name} (step {start})")
    if env.is_main:
        _truncate_metrics(metrics_path, start)

    info = {
        "run_id": cfg.run_id, "config": json.loads(cfg.model_dump_json()), "vocab_size": corpus.vocab_size,
        "corpus": {"dir": corpus.dir.name, "tokenizer": corpus.tokenizer_path.name},
        "params": counts, "flops_per_token": flops, "state_bytes": state_bytes,
        "world_size": env.world_size, "parallel": cfg.train.parallel if env.active else None, **environment_info(device),
    }
    if env.is_main:
        (run_dir / "run.json").write_text(json.dumps(info, indent=1))
    if start == 0:
        log(f"[{cfg.run_id}] {cfg.model.mixer.name}: {counts['total'] / 1e6:.2f}M params "
            f"({counts['non_embedding'] / 1e6:.2f}M non-embedding), {info['flops_per_token'] / 1e6:.1f} MFLOPs/token fwd, device {device}")

    # the batch of a step does not depend on grad_accum (a memory knob): micro-batches are slices of it
    batches = TrainBatches(corpus, weights=cfg.data.train_weights, seq_len=cfg.data.seq_len, batch_size=cfg.train.batch_size // env.world_size,
                           seed=cfg.seed, rank=env.rank, world_size=env.world_size)
    eval_domains = cfg.data.eval_domains or corpus.domains
    evaluator = DomainEvaluator(corpus, eval_domains, cfg.eval.split, cfg.data.seq_len, cfg.eval.batch_size, cfg.eval.max_tokens)
    tokens_per_step = cfg.train.batch_size * cfg.data.seq_len
    final = None

    def run_eval(step):
        res = evaluator.evaluate(model, device, autocast)  # every rank (FSDP needs all of them); rank 0 writes
        rec = {"kind": "eval", "step": step, "tokens": step * tokens_per_step, "split": cfg.eval.split,
               "in_domain_loss": in_domain_loss(res, cfg.data.train_weights), "domains": res}
        if env.is_main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        return rec

    bar = None
    if cfg.train.progress and env.is_main:
        from tqdm import tqdm

        bar = tqdm(total=cfg.train.steps, initial=start, desc=cfg.run_id, unit="step", mininterval=1.0, dynamic_ncols=True, file=sys.stderr)
    model.train()
    t_last, tok_since = time.perf_counter(), 0
    for step in range(start, cfg.train.steps):
        lr = lr_at(step, cfg.train)
        for g in opt.param_groups:
            g["lr"] = lr
        loss_sum = 0.0
        xb, yb = batches.batch(step)
        micro = list(zip(xb.chunk(cfg.train.grad_accum), yb.chunk(cfg.train.grad_accum)))
        for i, (x, y) in enumerate(micro):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with grad_sync(model, cfg.train.parallel, env, sync=i == len(micro) - 1):
                with autocast() if autocast else nullcontext():
                    loss = _loss(model, x, y) / cfg.train.grad_accum
                loss.backward()
            loss_sum += loss.item()
        loss_sum = mean_across_ranks(loss_sum, env)
        if not math.isfinite(loss_sum):
            if bar:
                bar.close()
            good = latest_good_checkpoint(ckpt_root, log=lambda *_: None)
            raise TrainingDiverged(f"[{cfg.run_id}] loss is {loss_sum} at step {step + 1}; stopped. "
                                   f"Saved checkpoints are intact (latest: {good.name if good else 'none'}).")
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf"))
        gnorm = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        tok_since += tokens_per_step
        now = time.perf_counter()
        rec = {"kind": "train", "step": done, "loss": loss_sum, "lr": lr, "grad_norm": float(gnorm),
               "tokens_per_s": tok_since / max(now - t_last, 1e-9)}
        if env.is_main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_sum:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}", refresh=False)
        elif done % cfg.train.log_every == 0:
            log(f"[{cfg.run_id}] step {done}/{cfg.train.steps} loss {loss_sum:.4f} lr {lr:.2e} {rec['tokens_per_s']:.0f} tok/s")
        t_last, tok_since = now, 0
        if done % cfg.eval.every == 0 or done == cfg.train.steps:
            final = run_eval(done)
        if done % cfg.train.checkpoint_every == 0 or done == cfg.train.steps:
            save_checkpoint(ckpt_root, done, model, opt, {}, keep=cfg.train.keep_checkpoints, env=env)
    if bar:
        bar.close()
    if final is None:  # resumed exactly at the end
        final = run_eval(cfg.train.steps)
    if env.is_main:
        tmp = done_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"steps": cfg.train.steps, "final": final}, indent=1))
        os.replace(tmp, done_path)
    return final


def _loss(model, x, y):
    """Cross-entropy through the (possibly DDP/FSDP-wrapped) model's forward, so wrappers see the call."""
    logits, _ = model(x)
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
