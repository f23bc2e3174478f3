"""A run on GPUs (docs/scaling.md): memory per GPU from its model on the meta device (model states, communication
buffers, the activations of one micro-batch under bf16 autocast, a fixed reserve) and wall time at an assumed MFU
of the GPUs' dense bf16 peak."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config import RunConfig
from ..config_base import ConfigError
from .sizes import run_sizes

if TYPE_CHECKING:
    from ..mixers.base import Mixer

# dense bf16 peak (TFLOP/s, no sparsity) and memory (GiB) per GPU
GPUS: dict[str, dict[str, float]] = {
    "A100-40GB": {"tflops": 312, "mem_gib": 40},
    "A100-80GB": {"tflops": 312, "mem_gib": 80},
    "H100-80GB": {"tflops": 989, "mem_gib": 80},
    "H200-141GB": {"tflops": 989, "mem_gib": 141},
    "L40S-48GB": {"tflops": 362, "mem_gib": 48},
}
GPU_ALIASES = {"A100": "A100-80GB", "H100": "H100-80GB", "H200": "H200-141GB", "L40S": "L40S-48GB"}

MODEL_STATE_BYTES = 16  # fp32 weights 4 + grads 4 + AdamW exp_avg 4 + exp_avg_sq 4
DDP_BUCKET_BYTES = 4  # DDP's flat fp32 gradient buckets (gradient_as_bucket_view=False)
RESERVE_GIB = 2.0  # CUDA context, cuBLAS/NCCL workspaces, allocator slack
GiB = 2**30


def gpu_spec(gpu: str) -> tuple[str, dict[str, float]]:
    name = GPU_ALIASES.get(gpu.upper(), gpu)
    for known, spec in GPUS.items():
        if known.upper() == name.upper():
            return known, spec
    raise ConfigError(f"--gpu-type: unknown GPU {gpu!r}; allowed: {', '.join(GPUS)} (or {', '.join(GPU_ALIASES)})")


def _chunk_state_bytes(mixer: Mixer, seq_len: int) -> float:
    """Per token: a mixer with a constant-size recurrent state keeps one state per chunk of its
    chunked training form for the backward pass (state_size is fp32 bytes per sequence; the chunk is the
    mixer's declared ``chunk_size()``)."""
    s = mixer.state_size(seq_len)
    if s <= 0 or s != mixer.state_size(max(1, seq_len // 2)):
        return 0.0  # no state, or a KV cache (fused attention keeps only q, k, v, o: counted as projections)
    chunk = mixer.chunk_size()
    if not chunk:
        raise ConfigError(
            f"model.mixer: {mixer.cfg.name} keeps a constant-size recurrent state but declares no chunk_size() (the chunk its "
            "training form keeps one state per), so its activation memory cannot be planned; see docs/adding_a_mixer.md"
        )
    return s / chunk


def activation_bytes_per_token(model, seq_len: int) -> dict[str, float]:
    """bf16-autocast activations kept for the backward pass, per token of a micro-batch (docs/scaling.md):
    per layer 12 D (two RMSNorms: fp32 input + bf16 copy) + 2 (in + out) for every nn.Linear (its bf16 input
    and output) + chunk states; then 6 D for the final norm and 10 V for the logits and their gradient."""
    D, V = model.cfg.d_model, model.cfg.vocab_size
    layers = 0.0
    for blk in model.blocks:
        proj = sum(2 * (m.in_features + m.out_features) for m in blk.modules() if isinstance(m, nn.Linear))
        layers += 12 * D + proj + _chunk_state_bytes(blk.mixer, seq_len)
    return {"layers": layers, "head": 6 * D + 10 * V}


def _fsdp_units(model) -> list[int]:
    """Parameters of each FSDP unit (one per block, plus the root: embeddings, final norm, head)."""
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
    return sorted(blocks + [root], reverse=True)


def memory_per_gpu(model, seq_len: int, micro_batch: int, gpus: int, parallel: str) -> dict[str, float]:
    """GiB per GPU: model states, communication buffers, activations of one micro-batch, reserve."""
    P = sum(p.numel() for p in model.parameters())
    if parallel == "fsdp" and gpus > 1:
        states = MODEL_STATE_BYTES * P / gpus
        units = _fsdp_units(model)
        comm = 8 * sum(units[:2])  # unsharded fp32 params + grads of the current and the prefetched unit
    else:
        states = MODEL_STATE_BYTES * P
        comm = DDP_BUCKET_BYTES * P if gpus > 1 else 0
    act = activation_bytes_per_token(model, seq_len)
    activations = micro_batch * seq_len * (act["layers"] + act["head"])
    out = {"model_states": states / GiB, "comm_buffers": comm / GiB, "activations": activations / GiB, "reserve": RESERVE_GIB}
    out["total"] = sum(out.values())
    return out


def plan_run(rc: RunConfig, gpus: int = 8, gpu: str = "H100-80GB", mfu: float = 0.4, parallel: str | None = None, seeds: int = 1) -> dict:
    """One run on ``gpus`` GPUs of type ``gpu`` at an assumed ``mfu``: memory per GPU and wall time of its training."""
    if gpus < 1:
        raise ConfigError(f"--gpus: must be >= 1, got {gpus}")
    if not 0 < mfu <= 1:
        raise ConfigError(f"--mfu: must be in (0, 1], got {mfu}")
    gpu_name, spec = gpu_spec(gpu)
    parallel = parallel or rc.train.parallel
    model, row = run_sizes(rc)
    T, tr = rc.data.seq_len, rc.train
    issues = []
    per_rank = tr.batch_size / (gpus * tr.grad_accum)
    if tr.batch_size % (gpus * tr.grad_accum):
        issues.append(
            f"train.batch_size={tr.batch_size} is not divisible by gpus x grad_accum = {gpus} x {tr.grad_accum}; the trainer will refuse it"
        )
    micro = max(1, math.ceil(per_rank))
    mem = memory_per_gpu(model, T, micro, gpus, parallel)
    fits = mem["total"] <= spec["mem_gib"]
    if not fits:
        issues.append(
            f"does not fit: ~{mem['total']:.1f} GiB per GPU > {spec['mem_gib']:.0f} GiB ({gpu_name}); "
            + _suggest(model, rc, gpus, parallel, spec["mem_gib"])
        )
    elif mem["total"] > 0.9 * spec["mem_gib"]:
        issues.append(f"tight: ~{mem['total']:.1f} of {spec['mem_gib']:.0f} GiB per GPU")
    flops_per_s = gpus * spec["tflops"] * 1e12 * mfu
    seconds = row["total_train_flops"] / flops_per_s
    return {
        **row,
        "seeds": seeds,
        "device": "gpu",
        "micro_batch_per_gpu": per_rank,
        "gpus": gpus,
        "gpu": gpu_name,
        "parallel": parallel,
        "peak_tflops": spec["tflops"],
        "mfu": mfu,
        "memory_gib": mem,
        "gpu_mem_gib": spec["mem_gib"],
        "fits": fits,
        "tokens_per_s": flops_per_s / row["train_flops_per_token"],
        "est_hours": seconds / 3600,
        "issues": issues,
    }


def _suggest(model, rc: RunConfig, gpus: int, parallel: str, capacity: float) -> str:
    """The smallest grad_accum (a divisor of the per-GPU batch) whose micro-batch fits, else FSDP."""
    T, per_gpu = rc.data.seq_len, rc.train.batch_size // gpus
    for accum in range(1, max(1, per_gpu) + 1):
        if per_gpu % accum == 0 and memory_per_gpu(model, T, per_gpu // accum, gpus, parallel)["total"] <= capacity:
            return f"try train.grad_accum={accum} (micro-batch {per_gpu // accum} per GPU)"
    if parallel != "fsdp" and gpus > 1 and memory_per_gpu(model, T, 1, gpus, "fsdp")["total"] <= capacity:
        return "try train.parallel='fsdp' with a smaller micro-batch"
    return "even a micro-batch of 1 does not fit: use more or larger GPUs, FSDP, or activation checkpointing"


def local_gpus() -> tuple[int, str] | None:
    """This machine's CUDA devices as (count, a type of GPUS), None without CUDA; ConfigError for a type not in GPUS."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    for key in ("H200", "H100", "L40S", "A100"):
        if key in name.upper():
            if key == "A100":
                return torch.cuda.device_count(), "A100-80GB" if torch.cuda.get_device_properties(0).total_memory > 50 * GiB else "A100-40GB"
            return torch.cuda.device_count(), GPU_ALIASES[key]
    raise ConfigError(f"this machine's GPU {name!r} is not in basecap.plan.GPUS ({', '.join(GPUS)}); pass --gpus and --gpu-type")
