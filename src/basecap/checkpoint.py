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
import io
import json
import os
import pickle
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from .distributed import DistEnv, rank0_error
from .atomic import fsync


class CheckpointError(RuntimeError):
    pass


# Every global the metadata pickle of a basecap checkpoint refers to (torch.distributed.checkpoint's own
# dataclasses, sizes, dtypes, layouts); any other global (os.system, builtins.eval, ...) is refused.
_DCP = "torch.distributed.checkpoint"
_METADATA_GLOBALS = {
    (f"{_DCP}.metadata", n)
    for n in (
        "Metadata",
        "StorageMeta",
        "MetadataIndex",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "Path"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles only the types torch.distributed.checkpoint writes into its ``.metadata`` file."""

    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_GLOBALS or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: not a type a basecap checkpoint contains")


class SafeReader(dcp.FileSystemReader):
    """A FileSystemReader whose metadata is read with an allow-list unpickler instead of ``pickle.load``."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
            raise CheckpointError(
                f"{path}: refused ({e}); a checkpoint written by basecap never contains this. "
                "Only resume from run directories you trust (docs/security.md)"
            ) from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path}: refused: holds a {type(metadata).__name__}, not checkpoint metadata")
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class SafeLoadPlanner(dcp.DefaultLoadPlanner):
    """Non-tensor entries (optimizer hyper-parameters) loaded with ``torch.load(weights_only=True)``; the
    default planner unpickles them fully."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            why = next((line.strip() for line in str(e).splitlines() if "WeightsUnpickler error" in line), str(e).splitlines()[0])
            raise CheckpointError(
                f"checkpoint entry {read_item.dest_index.fqn}: refused ({why}); a checkpoint written by "
                "basecap never contains this. Only resume from run directories you trust (docs/security.md)"
            ) from None
        clean = io.BytesIO()
        torch.save(obj, clean)  # the default planner's torch.load then reads only what we re-wrote
        clean.seek(0)
        super().load_bytes(read_item, clean)


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


def save_checkpoint(ckpt_root: Path, step: int, model: torch.nn.Module, optimizer, extra: dict, keep: int = 2, *, env: DistEnv = DistEnv()) -> Path:
    """Write ``step_N/`` atomically. Every rank calls it; rank 0 writes the files. A failure on rank 0
    (a full disk, a permission error) reaches every rank, which all raise CheckpointError with the same
    message; the previous checkpoints stay intact."""
    final = ckpt_root / f"step_{step:08d}"
    tmp = ckpt_root / f".tmp_step_{step:08d}"
    error = _on_main(env, step, lambda: _fresh_dir(ckpt_root, tmp))
    if error is None:
        msd, osd = get_state_dict(model, optimizer)
        try:
            with _single_process_ok():
                dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / "state"))
        except (Exception, dcp.CheckpointException) as e:  # noqa: BLE001 - any failure; DCP's own exception is a BaseException
            if env.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"checkpoint at step {step} failed: {_reason(e)}") from None
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        error = _on_main(env, step, lambda: _finish_checkpoint(tmp, final, full, {"step": step, "world_size": env.world_size, **extra}, keep))
    if error is not None:
        raise CheckpointError(error)
    return final


def _reason(e: BaseException) -> str:
    """One line for an error, looking through DCP's wrapper of the per-rank failures."""
    if isinstance(e, dcp.CheckpointException):
        first = next(iter(e.failures.values()))[0]
        return str(first) if isinstance(first, CheckpointError) else _reason(first)
    return f"{type(e).__name__}: {e}"


def _on_main(env: DistEnv, step: int, fn) -> str | None:
    """Run ``fn`` on rank 0; its error message (or None) on every rank."""
    error = None
    if env.is_main:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - any failure must reach the other ranks before we raise
            error = f"checkpoint at step {step} failed on rank 0: {type(e).__name__}: {e}"
    return rank0_error(error, env)


def _fresh_dir(ckpt_root: Path, tmp: Path):
    ckpt_root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()


def _finish_checkpoint(tmp: Path, final: Path, full: dict, trainer: dict, keep: int):
    """Rank 0: full weights, trainer.json and the hashes into ``tmp``; fsync; rename to ``final``; prune."""
    try:
        # safetensors refuses shared storage (tied embeddings): store each tensor once
        tensors, seen = {}, set()
        for k, v in full.items():
            if v.data_ptr() in seen:
                continue
            seen.add(v.data_ptr())
            tensors[k] = v.detach().contiguous().cpu()
        save_file(tensors, tmp / "model.safetensors")
        (tmp / "trainer.json").write_text(json.dumps(trainer))
        files = _files(tmp)
        (tmp / "meta.json").write_text(json.dumps({"step": trainer["step"], "files": {str(f.relative_to(tmp)): _sha256(f) for f in files}}, indent=1))
        for f in [*files, tmp / "meta.json"]:
            fsync(f)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # free the space a full disk needs; the previous checkpoint stays
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync(final.parent)
    for old in list_checkpoints(final.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    if not ckpt_root.is_dir():
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
    tied = {k for k in missing if model.cfg.tie_embeddings and k == "head.weight"}  # type: ignore[union-attr]  # an LM: cfg is its ModelConfig
    if set(missing) - tied or unexpected:
        raise CheckpointError(f"checkpoint {path}: weights do not match the model (missing {sorted(set(missing) - tied)}, unexpected {unexpected})")


def _drop_stateless_params(osd: dict, metadata: Metadata, path: Path):
    """A parameter that never received a gradient (e.g. the unused norm of a block without MLP) has no
    optimizer state in the checkpoint, while ``get_state_dict`` gives a fresh optimizer state for every
    parameter. Drop those entries so the restored optimizer matches the saved one exactly (such a
    parameter again has no state). A parameter whose state is only partly present is a damaged
    checkpoint and still fails the load."""
    saved, dropped = set(metadata.state_dict_metadata), []
    for fqn in list(osd.get("state", {})):
        keys = [f"optim.state.{fqn}.{k}" for k in osd["state"][fqn]]
        present = [k in saved for k in keys]
        if not any(present):
            del osd["state"][fqn]
            dropped.append(fqn)
        elif not all(present):
            missing = [k for k, ok in zip(keys, present) if not ok]
            raise CheckpointError(f"checkpoint {path}: optimizer state of {fqn} is incomplete (missing {missing})")
    return dropped


def restore(path: Path, model: torch.nn.Module, optimizer) -> dict:
    """Model + optimizer state into a (possibly wrapped / sharded) model; returns trainer.json."""
    msd, osd = get_state_dict(model, optimizer)
    reader = SafeReader(path / "state")
    try:
        with _single_process_ok():
            dropped = _drop_stateless_params(osd, reader.read_metadata(), path)
            state: dict[str, Any] = {"model": msd, "optim": osd}
            dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner())
    except dcp.CheckpointException as e:
        raise CheckpointError(f"checkpoint {path}: {_reason(e)}") from None
    # strict=False only lets parameters without optimizer state stay so; dcp.load above required every
    # model key and the complete state of every other parameter
    # a live optimizer (a cooldown branch restoring its run) already lacks state for such parameters: not strict then either
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    strict = not dropped and len(state["optim"].get("state", {})) >= trainable
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=StateDictOptions(strict=strict))
    return json.loads((path / "trainer.json").read_text())


def latest_good_checkpoint(ckpt_root: Path, log=print) -> Path | None:
    """Newest checkpoint whose hashes verify; corrupt ones are reported and skipped."""
    for path in reversed(list_checkpoints(ckpt_root)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as e:
            log(f"warning: {e}; falling back to the previous checkpoint")
            warnings.warn(str(e), stacklevel=2)
    return None


__all__ = ["CheckpointError", "latest_good_checkpoint", "list_checkpoints", "load_weights", "restore", "save_checkpoint", "verify_checkpoint"]
