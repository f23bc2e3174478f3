"""Data-parallel training under ``torchrun``: DDP or FSDP2 (``train.parallel``).

Launched with ``torchrun --nproc-per-node N -m basecap train EXPERIMENT``, every rank runs the same
trainer; this module holds the few places where ranks differ. On CPU the backend is gloo, on CUDA NCCL.
Each rank takes rows ``[r * B/N, (r+1) * B/N)`` of the step's global batch (a pure function of seed and
step), so the run sees the same data at any world size.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str, timeout_s: float | None = None) -> DistEnv:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); a no-op otherwise.
    ``timeout_s`` bounds every collective (``train.dist_timeout_s``; None: torch's default). The first
    call creates the group, so its timeout is the one that holds."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistEnv()
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s) if timeout_s else None)
    return DistEnv(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def wrap(model: torch.nn.Module, mode: str, env: DistEnv, device: torch.device) -> torch.nn.Module:
    if not env.active:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for block in cast(Iterable[torch.nn.Module], model.blocks):  # shard per block, then the root (embedding, head)
        fully_shard(block)
    fully_shard(model)
    return model


@contextmanager
def grad_sync(model: torch.nn.Module, mode: str, env: DistEnv, sync: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of a step."""
    wrapped: Any = model  # DDP (no_sync) or an FSDP module (set_requires_gradient_sync)
    if not env.active or sync:
        if env.active and mode == "fsdp":
            wrapped.set_requires_gradient_sync(True)
        yield
        return
    if mode == "ddp":
        with wrapped.no_sync():
            yield
    else:
        wrapped.set_requires_gradient_sync(False)
        yield


def rank0_first(fn, device_type: str = "cpu", timeout_s: float | None = None):
    """Run ``fn`` on rank 0 first (e.g. building the corpus into the shared data home), then on the
    other ranks, which then find the result cached."""
    env = init_distributed(device_type, timeout_s)
    if not env.active:
        return fn()
    out = fn() if env.is_main else None
    barrier(env)
    return out if env.is_main else fn()


def mean_across_ranks(value: float, env: DistEnv) -> float:
    if not env.active:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / env.world_size


def leave() -> None:
    """End a torchrun job's process group: wait for every rank, then destroy the group, so that no Gloo
    worker thread is still alive when the interpreter finalizes (a rank exiting with the group alive can
    abort with "terminate called without an active exception", failing a job that finished). A no-op
    outside torchrun."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier(env: DistEnv):
    if env.active:
        dist.barrier()


def rank0_error(message: str | None, env: DistEnv) -> str | None:
    """Rank 0's error message (None: rank 0 succeeded), on every rank. Ranks call this together after a
    step only rank 0 performs (writing a checkpoint, taking the run-directory lock), then fail together
    with the same message instead of waiting for the collective timeout. Sent as bytes, not pickled."""
    if not env.active:
        return message
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    data = (message or "").encode()
    size = torch.tensor([len(data) if message is not None else -1], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if int(size) < 0:
        return None
    buf = torch.tensor(list(data), dtype=torch.uint8, device=device) if env.is_main else torch.empty(int(size), dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=0)
    return bytes(buf.cpu().tolist()).decode(errors="replace")
