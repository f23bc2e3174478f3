"""Atomic, verifiable checkpoints that resume exactly, at any world size.

A checkpoint directory ``step_N/`` holds:
- ``state/``: model and optimizer state through ``torch.distributed.checkpoint`` (sharded for FSDP,
  re-sharded on load, so a run resumes with a different number of ranks, or in a single process);
- ``model.safetensors``: the full weights, for evaluation and export;
- ``trainer.json``: step and bookkeeping; ``meta.json``: SHA-256 of every file.
It is written under a temporary name and renamed only when complete (all files fsynced), so a kill never
leaves a half checkpoint that looks good; a corrupt one is detected by its hashes and skipped in favour
of the previous one. With several ranks the checkpoint folder must be on a filesystem all ranks share.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from .distributed import DistEnv, barrier
from .rundir import fsync


class CheckpointError(RuntimeError):
    pass


@contextmanager
def _single_process_ok():
    """DCP warns when used without a process group; that is our normal single-process case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "meta.json")


def save_checkpoint(ckpt_root: Path, step: int, model: torch.nn.Module, optimizer, extra: dict, keep: int = 2,
                    env: DistEnv = DistEnv()) -> Path:
    final = ckpt_root / f"step_{step:08d}"
    tmp = ckpt_root / f".tmp_step_{step:08d}"
    if env.is_main:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier(env)
    msd, osd = get_state_dict(model, optimizer)
    with _single_process_ok():
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / "state"))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main:
        # safetensors refuses shared storage (tied embeddings): store each tensor once
        tensors, seen = {}, set()
        for k, v in full.items():
            if v.data_ptr() in seen:
                continue
            seen.add(v.data_ptr())
            tensors[k] = v.detach().contiguous().cpu()
        save_file(tensors, tmp / "model.safetensors")
        (tmp / "trainer.json").write_text(json.dumps({"step": step, "world_size": env.world_size, **extra}))
        files = _files(tmp)
        (tmp / "meta.json").write_text(json.dumps({"step": step, "files": {str(f.relative_to(tmp)): _sha256(f) for f in files}}, indent=1))
        for f in [*files, tmp / "meta.json"]:
            fsync(f)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync(ckpt_root)
        for old in list_checkpoints(ckpt_root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    barrier(env)
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    if not ckpt_root.exists():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step_"))


def verify_checkpoint(path: Path) -> dict:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {path}: unreadable meta.json ({e})") from None
    for name, digest in meta.get("files", {}).items():
        f = path / name
        if not f.exists():
            raise CheckpointError(f"checkpoint {path}: {name} is missing")
        if _sha256(f) != digest:
            raise CheckpointError(f"checkpoint {path}: {name} is corrupt or truncated (SHA-256 mismatch)")
    return meta


def load_weights(path: Path, model: torch.nn.Module):
    """Full weights from ``model.safetensors`` into an unwrapped model (evaluation, export)."""
    verify_checkpoint(path)
    state = load_file(path / "model.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if model.cfg.tie_embeddings and k == "head.weight"}
    if set(missing) - tied or unexpected:
        raise CheckpointError(f"checkpoint {path}: weights do not match the model (missing {sorted(set(missing) - tied)}, unexpected {unexpected})")


def restore(path: Path, model: torch.nn.Module, optimizer) -> dict:
    """Model + optimizer state into a (possibly wrapped / sharded) model; returns trainer.json."""
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=str(path / "state"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return json.loads((path / "trainer.json").read_text())


def latest_good_checkpoint(ckpt_root: Path, log=print) -> Path | None:
    """Newest checkpoint whose hashes verify; corrupt ones are reported and skipped."""
    for path in reversed(list_checkpoints(ckpt_root)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as e:
            log(f"warning: {e}; falling back to the previous checkpoint")
            warnings.warn(str(e))
    return None


__all__ = ["CheckpointError", "latest_good_checkpoint", "list_checkpoints", "load_weights", "restore", "save_checkpoint",
           "verify_checkpoint"]
