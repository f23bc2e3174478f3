"""Experiment tracking: TensorBoard and Weights & Biases as extra sinks of the training records.

``metrics.jsonl`` stays the source of truth; the trainer feeds the same records (``{"kind": "train", ...}``
and ``{"kind": "eval", ...}``) to the loggers opened here, which write scalars at their steps under
``train/...`` and ``eval/...`` tags. Both packages are optional (``pip install 'basecap[tensorboard]'``,
``'basecap[wandb]'``); this module imports neither until a logger is opened.

Resume. Training resumes exactly, so a resumed run recomputes the same records from its checkpoint on (all
but the measured tokens/s). Each sink knows the last step it already holds on disk; it skips records up to
that step and, when it holds fewer than the checkpoint, fills the gap from ``metrics.jsonl`` (``history``). A run killed and resumed so
shows each step once, in the same TensorBoard folder and the same W&B run:

- TensorBoard is flushed at every checkpoint and the flushed step is recorded; a reopened writer purges
  anything after it (``purge_step``), so half-written events of a killed process are hidden.
- W&B offline stores what it received in ``run-<id>.wandb`` files and loses its unwritten tail when the
  process is killed; the step it holds is read back from those files (and from the server, for an online
  run) rather than trusted from what was sent. The run id lives in ``wandb_run.json`` and a reopened
  logger continues that run (``resume="allow"``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import string
import struct
import time
import zlib
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, cast

from .config_base import ConfigError
from .atomic import write_json
from .records import EVAL, TRAIN, MetricsRecord

LOGGERS = ("jsonl", "tensorboard", "wandb")
# logger -> (module that must be importable, extra of basecap that installs it)
_NEEDS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}

TENSORBOARD_DIR = "tensorboard"
TENSORBOARD_STATE = "flushed.json"  # inside TENSORBOARD_DIR: {"step": last step flushed to disk}
WANDB_DIR = "wandb"  # wandb's own folder, created by wandb.init(dir=<run dir>)
WANDB_STATE = "wandb_run.json"  # {"id", "project", "name", "group"}


def normalize_loggers(names: Iterable[str]) -> tuple[str, ...]:
    """The loggers asked for, in order, without repeats and with ``jsonl`` first (it is always on).
    Raises ConfigError on an unknown name. Imports nothing: fit for config validation."""
    names = list(names)
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise ConfigError(f"train.loggers: unknown logger(s) {unknown}; allowed: {', '.join(LOGGERS)}")
    return tuple(dict.fromkeys(["jsonl", *names]))


def check_loggers(names: Iterable[str]) -> tuple[str, ...]:
    """``normalize_loggers``, plus: every logger's package is installed. Call it before any compute; it
    looks the packages up without importing them."""
    names = normalize_loggers(names)
    for n in names:
        if n in _NEEDS and importlib.util.find_spec(_NEEDS[n][0]) is None:
            raise ConfigError(
                f"train.loggers: {n!r} needs the {_NEEDS[n][0]} package, which is not installed; "
                f"install it with: pip install 'basecap[{_NEEDS[n][1]}]'"
            )
    return names


def scalars(rec: MetricsRecord) -> dict[str, float]:
    """A metrics record as tag -> value: ``train/{loss,lr,grad_norm,tokens_per_s,mfu}`` for a training step;
    ``eval/in_domain_loss`` and ``eval/<domain>/{loss,bpb}`` for an evaluation. Other kinds give nothing."""
    fields = cast(Mapping[str, Any], rec)  # by name, as written: a record of an older basecap may lack a field
    if fields.get("kind") == TRAIN:
        return {f"train/{k}": float(fields[k]) for k in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu") if k in fields}
    if fields.get("kind") == EVAL:
        out = {"eval/in_domain_loss": float(fields["in_domain_loss"])} if "in_domain_loss" in fields else {}
        for domain, res in (fields.get("domains") or {}).items():
            out.update({f"eval/{domain}/{k}": float(res[k]) for k in ("loss", "bpb") if k in res})
        return out
    return {}


class Tracker:
    """The opened loggers of one run, fed record by record. ``flush()`` after each checkpoint, ``close()``
    at the end (or use it as a context manager: a run that raised is closed as failed)."""

    def __init__(self, sinks: list | None = None):
        self.sinks = sinks or []

    def log(self, rec: MetricsRecord) -> None:
        for s in self.sinks:
            s.log(rec)

    def flush(self):
        for s in self.sinks:
            s.flush()

    def close(self, ok: bool = True):
        for s in self.sinks:
            s.close(ok)
        self.sinks = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        self.close(ok=exc_type is None)


def open_loggers(
    names: Iterable[str],
    run_dir: str | Path,
    *,
    project: str,
    name: str,
    group: str | None = None,
    config: dict | None = None,
    history: Iterable[MetricsRecord] = (),
    enabled: bool = True,
) -> Tracker:
    """Open the loggers ``names`` (``jsonl`` is written by the trainer and needs nothing here) for the run in
    ``run_dir``. ``history``: the records already in ``metrics.jsonl`` (after the trainer truncated it to
    its checkpoint), used to fill what a sink lacks. ``config`` is logged once, when a sink starts fresh.
    Only rank 0 logs: ``enabled=False`` gives a tracker that does nothing and imports nothing."""
    names = check_loggers(names)
    if not enabled:
        return Tracker()
    run_dir, history = Path(run_dir), list(history)
    sinks: list[TensorBoardSink | WandbSink] = []
    if "tensorboard" in names:
        sinks.append(TensorBoardSink(run_dir, config=config, history=history))
    if "wandb" in names:
        sinks.append(WandbSink(run_dir, project=project, name=name, group=group, config=config, history=history))
    return Tracker(sinks)


class TensorBoardSink:
    """Scalars into ``<run_dir>/tensorboard/`` through ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, run_dir: Path, *, config: dict | None = None, history: Iterable[MetricsRecord] = ()):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(run_dir) / TENSORBOARD_DIR
        state = _read_json(self.dir / TENSORBOARD_STATE)
        self.held = state["step"] if state else 0
        started = self.dir.is_dir() and any(self.dir.glob("events.out.tfevents.*"))
        # events after the last flush may be on disk in part: hide them from every reader, then rewrite
        self.writer = SummaryWriter(str(self.dir), purge_step=self.held + 1 if started else None)
        if not started and config is not None:
            self.writer.add_text("config", "```json\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)
        self.last = self.held
        for rec in history:
            self.log(rec)

    def log(self, rec: MetricsRecord) -> None:
        step = rec["step"]
        if step <= self.held:
            return
        for tag, value in scalars(rec).items():
            self.writer.add_scalar(tag, value, step)
        self.last = max(self.last, step)

    def flush(self):
        self.writer.flush()
        self.held = self.last
        _write_json(self.dir / TENSORBOARD_STATE, {"step": self.held})

    def close(self, ok: bool = True):
        self.flush()
        self.writer.close()


class WandbSink:
    """Scalars into a W&B run; ``WANDB_MODE`` from the environment, else offline (no network needed).
    Every file goes under the run directory: the run folders (``<run_dir>/wandb/``) and wandb's own logs
    (``WANDB_CACHE_DIR``, unless the user set it)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        project: str,
        name: str,
        group: str | None = None,
        config: dict | None = None,
        history: Iterable[MetricsRecord] = (),
        mode: str | None = None,
    ):
        import wandb

        run_dir = Path(run_dir)
        self.state_path = run_dir / WANDB_STATE
        state = _read_json(self.state_path)
        if state is None:
            state = {"id": _new_run_id(), "project": os.environ.get("WANDB_PROJECT") or _project_name(project), "name": name, "group": group}
            _write_json(self.state_path, state)
        self.id = state["id"]
        self.held = max_wandb_step(run_dir, self.id)
        wait_for_a_new_folder_name(run_dir, self.id)
        with _env_default(WANDB_CACHE_DIR=str(run_dir / WANDB_DIR / "cache")):
            self.run = wandb.init(
                project=state["project"],
                name=state["name"],
                group=state["group"],
                id=self.id,
                resume="allow",
                dir=str(run_dir),
                mode=mode or os.environ.get("WANDB_MODE") or "offline",  # type: ignore[arg-type]  # wandb checks it
                config=config if self.held == 0 else None,
                job_type="train",
            )
        # an online run also knows the step the server holds (next step to log, once resumed)
        self.held = max(self.held, (getattr(self.run, "starting_step", 0) or 0) - 1)
        for rec in history:
            self.log(rec)

    def log(self, rec: MetricsRecord) -> None:
        step = rec["step"]
        values = scalars(rec)
        if step > self.held and values:
            self.run.log(values, step=step)

    def flush(self):
        pass  # wandb writes on its own schedule; what it holds is read back from its files on resume

    def close(self, ok: bool = True):
        import wandb

        self.run.finish(exit_code=0 if ok else 1)
        wandb.teardown()  # the next run starts wandb's service again, with its own log folder


# ---- W&B run files: read back what a run holds ------------------------------------------------------
# A run-<id>.wandb file is a LevelDB log (blocks of 32 KiB; records with a 7-byte header: crc32 seeded with
# the record type, length, type) after a 7-byte header ":W&B", magic, version; each record is a protobuf
# ``wandb_internal_pb2.Record``.

_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_log_records(path: Path) -> Iterator[bytes]:
    """The records of one .wandb file, in order; stops at a torn or corrupt tail (a killed writer)."""
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos, parts = 7, None
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer
            pos += left
            continue
        crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and n == 0:  # zero padding to the end of the block
            pos += left
            continue
        body = data[pos + 7 : pos + 7 + n]
        if len(body) < n or zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            return
        pos += 7 + n
        if kind == _FULL:
            yield body
        elif kind == _FIRST:
            parts = [body]
        elif kind in (_MIDDLE, _LAST) and parts is not None:
            parts.append(body)
            if kind == _LAST:
                yield b"".join(parts)
                parts = None


def read_wandb_file(path: str | Path) -> dict[str, Any]:
    """One W&B run file (a folder ``<run_dir>/wandb/*run-*-<id>/``'s ``run-<id>.wandb``) as
    ``{"run_id", "history": [(step, {key: value})]}``, wandb's own keys (``_step``, ``_runtime``...) left out."""
    from wandb.proto import wandb_internal_pb2

    run_id, history = None, []
    for raw in _wandb_log_records(Path(path)):
        rec = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # a generated protobuf module: its classes are made at import
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run_id = rec.run.run_id
        elif kind == "history":
            values = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    values[key] = json.loads(item.value_json)
            history.append((rec.history.step.num, values))
    return {"run_id": run_id, "history": history}


def wandb_run_files(run_dir: str | Path, run_id: str) -> list[Path]:
    """The files of W&B run ``run_id`` under ``run_dir``, one per process that logged to it, oldest first."""
    return sorted((Path(run_dir) / WANDB_DIR).glob(f"*run-*-{run_id}/run-{run_id}.wandb"), key=lambda p: p.parent.name.split("run-", 1)[1])


def wait_for_a_new_folder_name(run_dir: str | Path, run_id: str, clock=time.time, sleep=time.sleep) -> None:
    """wandb names a run's folder by the second its process started (``offline-run-YYYYmmdd_HHMMSS-<id>``):
    a process resuming the run within the second an earlier one started would reuse that folder and
    overwrite the earlier process's file, losing its steps. Wait until the clock is past every such second."""
    taken = {p.parent.name.split("-")[-2] for p in wandb_run_files(run_dir, run_id)}
    while datetime.fromtimestamp(now := clock()).strftime("%Y%m%d_%H%M%S") in taken:
        sleep(1.0 - now % 1.0 + 0.01)


def max_wandb_step(run_dir: str | Path, run_id: str) -> int:
    """The last step W&B run ``run_id`` holds on disk under ``run_dir`` (0 if none)."""
    return max((s for f in wandb_run_files(run_dir, run_id) for s, _ in read_wandb_file(f)["history"]), default=0)


# ---- helpers -----------------------------------------------------------------------------------------
def _new_run_id() -> str:
    """Eight lowercase letters and digits, like the ids wandb makes."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def _project_name(name: str) -> str:
    """A W&B project name: at most 128 characters, none of / \\ # ? % :."""
    return "".join("-" if c in "/\\#?%:" else c for c in name)[:128] or "basecap"


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _write_json(path: Path, obj: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, obj)


@contextmanager
def _env_default(**values: str):
    """Set environment variables the user has not set, for the duration of the block."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


__all__ = [
    "LOGGERS",
    "TensorBoardSink",
    "Tracker",
    "WandbSink",
    "check_loggers",
    "max_wandb_step",
    "normalize_loggers",
    "open_loggers",
    "read_wandb_file",
    "scalars",
    "wandb_run_files",
]
