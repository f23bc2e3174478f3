"""The run directory: its layout, and the one atomic write every writer of results uses.

A run directory (``<out_dir>/<run_id>/``) holds::

    run.json               resolved config, parameter counts, provenance (written by training)
    metrics.jsonl          one JSON record per training step and per evaluation
    metrics.jsonl.zst      the same records zstd-compressed, as archived under results/ (read alike; a run that
                           trains again expands it to metrics.jsonl first)
    done.json              written last, once training finished: {"steps", "final"}; "final" is the final evaluation
                           record without its per-domain results ("domains"), which metrics.jsonl holds (runs
                           finished before 2026-12-05 kept the whole record there; ``final_eval`` reads both)
    eval.json              test-split loss and bits per byte (basecap eval)
    eval_<suite>.json      a suite's result; a named suite entry writes suite_<name>/eval_<suite>.json
    checkpoints/step_N/    checkpoints (format: basecap.checkpoint)
    run.lock               held (flock) by the one process training into the folder; holds its PID
    tensorboard/           event files and flushed.json, with train.loggers = [..., "tensorboard"] (basecap.tracking)
    wandb_run.json, wandb/ the W&B run id and its offline files, with train.loggers = [..., "wandb"]

Every module that reads or writes one of these goes through ``RunDir``, so a file name is spelled once.

Kept records (``copy_records``: ``basecap report --archive``, ``basecap archive``) are stored compactly: metrics.jsonl
zstd-compressed, done.json short, and the JSON records (done.json, eval.json, suite results) without indentation
(``compact_json``). They hold the same values: JSON writes every float in its shortest round-trip form, with or
without indentation, so each reads back to the same float.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .atomic import atomic_write, fsync, write_json  # the run directory's writes
from .records import EvalRecord, MetricsRecord, check_record, eval_at

if TYPE_CHECKING:
    import torch

    from .distributed import DistEnv


class RunDirBusy(RuntimeError):
    """Another process holds the run directory's lock."""


def matched_loss(rec: Mapping[str, Any], domains: list[str] | None) -> float | None:
    """A record's loss on the matching coordinate: its in-domain loss, or the token-weighted loss of ``domains``
    (None where the record lacks one of them)."""
    if not domains:
        return rec["in_domain_loss"]
    doms = rec.get("domains") or {}
    if any(d not in doms for d in domains):
        return None
    n = sum(doms[d]["tokens"] for d in domains)
    return sum(doms[d]["loss"] * doms[d]["tokens"] for d in domains) / n


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the source tree, read once per process: a process keeps the code it imported, so a
    later run of the same process (``--run`` trains several) must not report a commit made after it started."""
    try:
        commit = (
            subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent).stdout.strip() or None
        )
        dirty = (
            bool(
                subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent).stdout.strip()
            )
            if commit
            else None
        )
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return commit, dirty


def environment_info(device: torch.device) -> dict:
    """Provenance recorded next to every result: git commit (and whether the tree was dirty), Python,
    platform, package versions and the torch device."""
    import torch

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    commit, dirty = git_state()
    dev = {"type": device.type, "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine()}
    if device.type == "cuda":
        dev["name"] = torch.cuda.get_device_name(device)
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {p: version(p) for p in ("basecap", "torch", "numpy", "tokenizers", "safetensors", "pydantic")},
        "device": dev,
    }


def suite_file(suite: str) -> str:
    return f"eval_{suite}.json"


@dataclass(frozen=True)
class RunDir:
    """One run's folder. Paths are properties; reading and writing go through the methods."""

    path: Path

    def __init__(self, path: str | Path):
        object.__setattr__(self, "path", Path(path))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def info_path(self) -> Path:
        return self.path / "run.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def metrics_archive_path(self) -> Path:
        return self.path / METRICS_ARCHIVE

    def has_metrics(self) -> bool:
        return self.metrics_path.is_file() or self.metrics_archive_path.is_file()

    @property
    def done_path(self) -> Path:
        return self.path / "done.json"

    @property
    def eval_path(self) -> Path:
        return self.path / "eval.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def lock_path(self) -> Path:
        return self.path / "run.lock"

    def suite_dir(self, name: str | None = None) -> Path:
        """Where a suite entry writes: the run directory, or ``suite_<name>/`` for a named entry (two
        entries of the same suite, e.g. 0-shot and 5-shot lm-eval)."""
        return self.path / f"suite_{name}" if name is not None else self.path

    def suite_result(self, suite: str, name: str | None = None) -> Path:
        return self.suite_dir(name) / suite_file(suite)

    def suite_results(self) -> list[Path]:
        """Every stored suite result, unnamed entries first."""
        return sorted([*self.path.glob(suite_file("*")), *self.path.glob(f"suite_*/{suite_file('*')}")])

    def records(self) -> list[Path]:
        """The files a report reads (run.json, metrics.jsonl, done.json, eval.json, suite results): everything
        but checkpoints, locks and logger files. Small, so a study's results can keep them next to its report."""
        fixed = [self.info_path, self.metrics_path, self.metrics_archive_path, self.done_path, self.eval_path]
        return [f for f in fixed if f.is_file()] + self.suite_results()

    @staticmethod
    def suite_label(result: Path) -> str | None:
        """The entry name of a suite result stored under ``suite_<name>/``, else None."""
        return result.parent.name[len("suite_") :] if result.parent.name.startswith("suite_") else None

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    # ---- run.lock -----------------------------------------------------------------------------
    @contextmanager
    def lock(self, env: DistEnv | None = None) -> Iterator[None]:
        """Hold the run directory for the whole run: one process (rank 0 of a torchrun job) takes an
        exclusive ``flock`` on ``run.lock`` and writes its PID there; a second process fails at once with
        RunDirBusy naming that PID (every rank of its job fails alike). The kernel drops the lock when the
        holder exits, even on kill -9, so a crashed run leaves nothing to clean by hand. Once held, the
        temporary checkpoint folders a crash left behind are removed."""
        from .distributed import DistEnv, rank0_error  # torch, only when training

        env = env or DistEnv()
        fd, error = None, None
        if env.is_main:
            self.create()
            fd, error = _take_lock(self.lock_path)
            if fd is not None:
                self.remove_stale_temporaries()
        error = rank0_error(error, env)
        if error is not None:
            raise RunDirBusy(error)
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # releases the flock; the file stays (unlinking it would race a waiting process)

    def remove_stale_temporaries(self) -> list[Path]:
        """Remove ``checkpoints/.tmp_step_*`` folders (a checkpoint write cut short); only the lock's
        holder may call this. Returns what was removed."""
        stale = sorted(self.checkpoints.glob(".tmp_step_*")) if self.checkpoints.is_dir() else []
        for p in stale:
            warnings.warn(f"{p}: removing an incomplete checkpoint left by an interrupted run", stacklevel=2)
            shutil.rmtree(p, ignore_errors=True)
        return stale

    # ---- run.json ---------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.info_path.exists()

    def read_info(self) -> dict:
        if not self.info_path.exists():
            raise FileNotFoundError(f"{self.path} is not a basecap run directory (no run.json)")
        return json.loads(self.info_path.read_text())

    def write_info(self, info: dict) -> None:
        write_json(self.info_path, info)

    # ---- metrics.jsonl ----------------------------------------------------------------------
    def append_metrics(self, rec: MetricsRecord) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def sync_metrics(self) -> None:
        """Flush metrics.jsonl to disk (before a checkpoint that claims to cover its records)."""
        if self.metrics_path.exists():
            fsync(self.metrics_path)

    def _metric_lines(self) -> list[tuple[str, MetricsRecord]]:
        """(line, record) for every record, from metrics.jsonl, else from metrics.jsonl.zst. An unparseable
        last line (an append cut short by a kill or a full disk) is dropped with a warning; one anywhere else
        is an error naming its line, as is a record that is not one (``records.check_record``)."""
        if self.metrics_path.exists():
            path, text = self.metrics_path, self.metrics_path.read_text()
        elif self.metrics_archive_path.exists():
            path, text = self.metrics_archive_path, decompress_text(self.metrics_archive_path.read_bytes())
        else:
            return []
        lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
        out = []
        for k, (i, line) in enumerate(lines):
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                if k < len(lines) - 1:
                    raise ValueError(f"{path}:{i}: not valid JSON (a record in the middle of the file is damaged)") from None
                warnings.warn(f"{path}:{i}: dropping a torn last record (an append was cut short)", stacklevel=2)
                continue
            out.append((line, check_record(raw, f"{path}:{i}")))
        return out

    def read_metrics(self) -> list[MetricsRecord]:
        return [rec for _, rec in self._metric_lines()]

    def truncate_metrics(self, step: int) -> None:
        """Drop records after ``step`` (a resumed run rewrites them) and a torn last line. Archived records
        (metrics.jsonl.zst) become plain metrics.jsonl again, which training appends to."""
        if not self.has_metrics():
            return
        keep = [line for line, rec in self._metric_lines() if rec["step"] <= step]
        atomic_write(self.metrics_path, "".join(line + "\n" for line in keep))
        self.metrics_archive_path.unlink(missing_ok=True)

    def compress_metrics(self) -> Path | None:
        """Replace metrics.jsonl by metrics.jsonl.zst (the same bytes, compressed); returns the archive's
        path, or None when the run has no plain records. For records that are kept, not for a live run."""
        if not self.metrics_path.is_file():
            return self.metrics_archive_path if self.metrics_archive_path.is_file() else None
        atomic_write(self.metrics_archive_path, compress_bytes(self.metrics_path.read_bytes()))
        self.metrics_path.unlink()
        return self.metrics_archive_path

    def copy_records(self, dest: str | Path) -> list[Path]:
        """Copy ``records()`` to the folder ``dest`` (``basecap report --archive``) in their kept form: metrics.jsonl
        compressed as metrics.jsonl.zst (the other form of it removed there), the JSON records compact
        (``archived_json``). Returns the files written."""
        dest, written = Path(dest), []
        for f in self.records():
            target = dest / f.relative_to(self.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            data = self.archived_json(f)
            if data is None:
                data = f.read_bytes()
            if f == self.metrics_path:
                target, data = dest / METRICS_ARCHIVE, compress_bytes(data)
            atomic_write(target, data)
            written.append(target)
        if any(t.name == METRICS_ARCHIVE for t in written):
            (dest / self.metrics_path.name).unlink(missing_ok=True)
        elif (dest / self.metrics_path.name) in written:
            (dest / METRICS_ARCHIVE).unlink(missing_ok=True)
        return written

    def archived_json(self, f: Path) -> bytes | None:
        """The kept form of the JSON record ``f`` of this run (done.json, eval.json, a suite result): compact JSON of the
        same values, done.json short (``short_done``); None for any other file (run.json stays as written)."""
        if f == self.done_path:
            obj = self.short_done(json.loads(f.read_text()))
        elif f == self.eval_path or f in self.suite_results():
            obj = json.loads(f.read_text())
        else:
            return None
        return compact_json(obj).encode()

    def compact_records(self) -> list[Path]:
        """Bring kept records to the form ``copy_records`` writes, in place (``basecap archive --compact``): metrics.jsonl
        compressed, done.json short, the JSON records compact; the values the same. Returns the files rewritten. For
        records that are kept, not for a live run."""
        written: list[Path] = []
        if self.metrics_path.is_file() and (archived := self.compress_metrics()) is not None:
            written.append(archived)
        for f in self.records():
            data = self.archived_json(f)
            if data is not None and data != f.read_bytes():
                atomic_write(f, data)
                written.append(f)
        return written

    # ---- done.json, eval.json ---------------------------------------------------------------
    def read_done(self) -> dict | None:
        return json.loads(self.done_path.read_text()) if self.done_path.exists() else None

    def _eval_record(self, step: int) -> EvalRecord | None:
        """The last evaluation record (kind "eval") at ``step`` in metrics.jsonl, or None."""
        return eval_at(self.read_metrics(), step)

    def short_done(self, done: dict) -> dict:
        """``done`` without the copy of the final evaluation's per-domain results that runs finished before 2026-12-05
        kept in it: {"steps", "final": the record's other fields}. Kept whole when metrics.jsonl lacks that record
        (nothing is dropped that is not held elsewhere)."""
        final: dict[str, Any] = done.get("final") or {}
        rec = self._eval_record(done["steps"]) if "domains" in final else None
        if rec is None or dict(rec) != final:
            return done
        return {**done, "final": {k: v for k, v in final.items() if k != "domains"}}

    def final_eval(self) -> EvalRecord | None:
        """A finished run's final evaluation record (kind "eval" at done.json's step count), whole: done.json's "final"
        where it holds the per-domain results (runs finished before 2026-12-05), else the record in metrics.jsonl.
        None when the run has not finished."""
        done = self.read_done()
        if done is None:
            return None
        if "domains" in (done.get("final") or {}):
            return cast(EvalRecord, done["final"])
        rec = self._eval_record(done["steps"])
        if rec is None:
            raise ValueError(f"{self.path}: its final evaluation (step {done['steps']}, done.json) is not in its metrics records")
        return rec

    def write_done(self, steps: int, final: Mapping[str, Any]) -> None:
        """done.json: the step count and ``final``, the final evaluation record (already in metrics.jsonl), without its
        per-domain results."""
        write_json(self.done_path, {"steps": steps, "final": {k: v for k, v in final.items() if k != "domains"}})

    def write_eval(self, result: dict) -> None:
        write_json(self.eval_path, result)


METRICS_ARCHIVE = "metrics.jsonl.zst"
ZSTD_LEVEL = 19  # the records are written once and read many times; the level changes only the writer's time


def compact_json(obj: Any) -> str:
    """A kept JSON record: no indentation, no spaces after separators. ``json`` writes a float as its shortest
    round-trip form (``repr``) either way, so the record reads back to the same values as the indented one."""
    return json.dumps(obj, separators=(",", ":"))


def compress_bytes(data: bytes) -> bytes:
    """zstd at ``ZSTD_LEVEL``, with the content size in the frame; the same input gives the same bytes."""
    import zstandard

    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(data)


def decompress_text(data: bytes) -> str:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(data).decode("utf-8")


def _take_lock(path: Path) -> tuple[int | None, str | None]:
    """(fd holding an exclusive flock on ``path`` with our PID written in it, None), or (None, why not)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        return None, (
            f"run directory {path.parent} is in use by process {holder} (lock file {path}); wait for that run to finish or stop it, then rerun"
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd, None


__all__ = ["RunDir", "RunDirBusy", "compact_json", "environment_info", "suite_file"]
