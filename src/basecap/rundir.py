"""The run directory: its layout, and the one atomic write every writer of results uses.

A run directory (``<out_dir>/<run_id>/``) holds::

    run.json               resolved config, parameter counts, provenance (written by training)
    metrics.jsonl          one JSON record per training step and per evaluation
    done.json              written last, once training finished: {"steps", "final"}
    eval.json              test-split loss and bits per byte (basecap eval)
    eval_<suite>.json      a suite's result; a named suite entry writes suite_<name>/eval_<suite>.json
    checkpoints/step_N/    checkpoints (format: basecap.checkpoint)
    tensorboard/           event files and flushed.json, with train.loggers = [..., "tensorboard"] (basecap.tracking)
    wandb_run.json, wandb/ the W&B run id and its offline files, with train.loggers = [..., "wandb"]

Every module that reads or writes one of these goes through ``RunDir``, so a file name is spelled once.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .atomic import atomic_write, fsync, write_json  # noqa: F401 - the run directory's writes


def environment_info(device) -> dict:
    """Provenance recorded next to every result: git commit (and whether the tree was dirty), Python,
    platform, package versions and the torch device."""
    import torch

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
    def done_path(self) -> Path:
        return self.path / "done.json"

    @property
    def eval_path(self) -> Path:
        return self.path / "eval.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def suite_dir(self, name: str | None = None) -> Path:
        """Where a suite entry writes: the run directory, or ``suite_<name>/`` for a named entry (two
        entries of the same suite, e.g. 0-shot and 5-shot lm-eval)."""
        return self.path / f"suite_{name}" if name is not None else self.path

    def suite_result(self, suite: str, name: str | None = None) -> Path:
        return self.suite_dir(name) / suite_file(suite)

    def suite_results(self) -> list[Path]:
        """Every stored suite result, unnamed entries first."""
        return sorted([*self.path.glob(suite_file("*")), *self.path.glob(f"suite_*/{suite_file('*')}")])

    @staticmethod
    def suite_label(result: Path) -> str | None:
        """The entry name of a suite result stored under ``suite_<name>/``, else None."""
        return result.parent.name[len("suite_"):] if result.parent.name.startswith("suite_") else None

    def create(self):
        self.path.mkdir(parents=True, exist_ok=True)

    # ---- run.json ---------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.info_path.exists()

    def read_info(self) -> dict:
        if not self.info_path.exists():
            raise FileNotFoundError(f"{self.path} is not a basecap run directory (no run.json)")
        return json.loads(self.info_path.read_text())

    def write_info(self, info: dict):
        write_json(self.info_path, info)

    # ---- metrics.jsonl ----------------------------------------------------------------------
    def append_metrics(self, rec: dict):
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def read_metrics(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        out = []
        for i, line in enumerate(self.metrics_path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise ValueError(f"{self.metrics_path}:{i}: not valid JSON") from None
        return out

    def truncate_metrics(self, step: int):
        """Drop records after ``step`` (a resumed run rewrites them)."""
        if not self.metrics_path.exists():
            return
        keep = [line for line in self.metrics_path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
        atomic_write(self.metrics_path, "".join(line + "\n" for line in keep))

    # ---- done.json, eval.json ---------------------------------------------------------------
    def read_done(self) -> dict | None:
        return json.loads(self.done_path.read_text()) if self.done_path.exists() else None

    def write_done(self, steps: int, final: dict):
        write_json(self.done_path, {"steps": steps, "final": final})

    def write_eval(self, result: dict):
        write_json(self.eval_path, result)


__all__ = ["RunDir", "atomic_write", "environment_info", "fsync", "suite_file", "write_json"]
