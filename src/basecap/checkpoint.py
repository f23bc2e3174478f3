"""Atomic, verifiable checkpoints: weights in safetensors, optimizer + RNG in a torch file, and a
``meta.json`` with the step and SHA-256 of every file. A checkpoint directory appears only once it is
complete (written to a temporary name, fsynced, then renamed), so a kill never leaves a half one that
looks good; a corrupt one is detected by its hashes and skipped in favour of the previous one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


class CheckpointError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(ckpt_root: Path, step: int, model: torch.nn.Module, optimizer, extra: dict, keep: int = 2) -> Path:
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:08d}"
    tmp = ckpt_root / f".tmp_step_{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # safetensors refuses shared tensors (tied embeddings): store each storage once
    tensors, seen = {}, {}
    for k, v in model.state_dict().items():
        key = v.data_ptr()
        if key in seen:
            continue
        seen[key] = k
        tensors[k] = v.detach().contiguous().cpu()
    save_file(tensors, tmp / "model.safetensors")
    torch.save({"optimizer": optimizer.state_dict(), "rng": {"torch": torch.get_rng_state()}, "extra": extra}, tmp / "trainer.pt")
    meta = {"step": step, "files": {n: _sha256(tmp / n) for n in ("model.safetensors", "trainer.pt")}}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_root)
    for old in list_checkpoints(ckpt_root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    if not ckpt_root.exists():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step_"))


def verify_checkpoint(path: Path) -> dict:
    meta_path = path / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
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
    verify_checkpoint(path)
    state = load_file(path / "model.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if model.cfg.tie_embeddings and k == "head.weight"}
    if set(missing) - tied or unexpected:
        raise CheckpointError(f"checkpoint {path}: weights do not match the model (missing {sorted(set(missing) - tied)}, unexpected {unexpected})")


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


def load_trainer_state(path: Path) -> dict:
    return torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
