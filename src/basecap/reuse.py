"""Reusing finished runs of another study (``--reuse DIR``).

Studies share runs: the reference Transformer++ of an ablation is, run for run, the Transformer++ of the
headline study when the data, model, training and evaluation settings and the seed agree. On one machine
and software stack a run is a pure function of its resolved config (the batch of step s is a function of
(seed, s); the name is only a label; on another machine only to floating-point precision, which grows over
training: docs/experiments.md), so a finished run whose config equals this one in everything but ``name`` is this run: it is
copied instead of trained again. The copy keeps its metrics, checkpoints and test evaluation; its
``run.json`` gets this study's name and run id and says where it came from (``reused_from``), and its
``git_commit`` stays the commit that trained it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .atomic import write_json
from .config_base import ConfigError
from .rundir import RunDir

if TYPE_CHECKING:
    from .config import RunConfig

LABELS = ("name",)  # config keys that only label a run
# keys that only change what a run prints: a run trained with and without `--set train.progress=false` is the same
# training, so a record that differs from the config in them alone is reusable
DISPLAY_KEYS = (("train", "progress"),)
# keys that change how a run is carried out, not what it trains: a run may resume (or be skipped as finished) with
# other values of these, never of any other key (``resume_differences``)
RESUME_FREE_KEYS = (
    *DISPLAY_KEYS,
    ("train", "threads"),
    ("train", "loggers"),
    ("train", "log_every"),
    ("train", "checkpoint_every"),
    ("train", "keep_checkpoints"),
    ("train", "keep_cooldown_weights"),
    ("train", "dist_timeout_s"),
    ("train", "peak_flops"),
    ("train", "parallel"),  # DDP or FSDP: the same training, its checkpoints re-sharded on resume (docs/scaling.md)
)


def _as_read_today(config: dict) -> dict:
    """The config as today's code reads it (a field added since the run trained takes its default, which is what
    that run did: a new option never changes what its default does); as stored when today's code refuses it."""
    from .config import RunConfig

    try:
        return json.loads(RunConfig.model_validate(config).model_dump_json())
    except ValueError:  # a config today's code no longer accepts: compared as stored (it matches nothing valid)
        return config


def resume_differences(stored: dict, now: dict) -> list[str]:
    """Where the config a run directory was started with (its run.json's) and the config it is now asked to go on with
    differ, key by key (``train.lr: 0.002 in the run, 0.004 now``), leaving out labels and ``RESUME_FREE_KEYS``."""
    out: list[str] = []

    def walk(a: Any, b: Any, path: tuple[str, ...]) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), (*path, k))
        elif a != b and path not in RESUME_FREE_KEYS and path not in [(label,) for label in LABELS]:
            out.append(f"{'.'.join(path)}: {json.dumps(a)} in the run, {json.dumps(b)} now")

    walk(_as_read_today(stored), _as_read_today(now), ())
    return out


def check_same_run(cfg: RunConfig, rd: RunDir) -> None:
    """A run directory with a checkpoint or a finished run goes on (or is skipped) only with the config it was started
    with, up to the keys that do not change what it trains (``reuse.RESUME_FREE_KEYS``: threads, loggers, ...):
    anything else would splice two trainings into one record, or return another config's results as this one's."""
    started = rd.read_done() is not None or any(rd.checkpoints.glob("step_*"))
    stored = rd.read_info().get("config") if started and rd.info_path.is_file() else None
    if stored is None:
        return
    differ = resume_differences(stored, json.loads(cfg.model_dump_json()))
    if differ:
        raise ConfigError(
            f"{rd.path}: this run was started with another config ({'; '.join(differ)}); a run resumes, or is skipped as "
            "finished, only with the config it started with: remove the folder to train it anew, or give the run another name"
        )


def _key(config: dict) -> str:
    """The config as today's code reads it, without its labels and display keys: equal keys, the same training."""
    out = {k: v for k, v in _as_read_today(config).items() if k not in LABELS}
    for section, field in DISPLAY_KEYS:
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k != field}
    return json.dumps(out, sort_keys=True)


def find_reusable(config: dict, sources: list[Path]) -> Path | None:
    """A finished run directory (done.json at the config's step count) under one of ``sources`` whose
    config equals ``config`` except for its labels; the first found, sources in order."""
    want, steps = _key(config), config["train"]["steps"]
    for src in sources:
        for info in sorted(Path(src).glob("*/run.json")):
            rd = RunDir(info.parent)
            try:
                stored = json.loads(info.read_text(encoding="utf-8"))["config"]
            except (OSError, ValueError, KeyError):
                continue  # not a run directory basecap wrote, or one being written
            done = rd.read_done()
            if done is not None and done.get("steps") == steps and _key(stored) == want:
                return rd.path
    return None


def _study(folder: Path) -> tuple | None:
    """(name, size) of the study whose runs (or, for ``tuning_runs/``, tuning runs) ``folder`` holds, from the
    experiment.json that ``basecap run`` and ``basecap archive`` write beside them; None without one."""
    exp = folder / "experiment.json"
    if not exp.is_file() and folder.name == "tuning_runs":
        exp = folder.parent / "runs" / "experiment.json"
    try:
        info = json.loads(exp.read_text(encoding="utf-8"))
        return info["name"], info.get("size")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_restore(src: Path, run_dir: Path, old_id: str | None, run_id: str) -> bool:
    """Whether ``src`` is this very run's own archived record (the same study and size, the same run id): bringing a
    lost training folder back from ``results/<study>/runs``, not a copy of another study's run."""
    here = _study(Path(run_dir).parent)
    return old_id == run_id and here is not None and _study(Path(src).parent) == here


def reuse_run(config: dict, run_id: str, run_dir: Path, sources: list[Path], log=print) -> bool:
    """Copy a finished, identical run of ``sources`` into ``run_dir`` (which must not exist yet), relabelled
    as ``run_id``. Returns whether a run was reused. The copy lands under a temporary name and is renamed
    into place, so an interrupted copy never looks like a run. A source that is this run's own archived record
    (``is_restore``) is restored as it was: marked ``restored_from``, not ``reused_from``, so no report calls the
    run a copy of itself."""
    run_dir = Path(run_dir)
    if not sources or run_dir.exists():
        return False
    src = find_reusable(config, sources)
    if src is None:
        return False
    tmp = run_dir.with_name(f".{run_dir.name}.reuse-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("run.lock", "*.tmp"))
    info = json.loads((tmp / "run.json").read_text(encoding="utf-8"))
    old_id = info.get("run_id")
    if is_restore(src, run_dir, old_id, run_id):
        info["restored_from"] = str(src)
        how = f"restored from {src} (this study's own archived records of the run"
    else:
        info["reused_from"] = {"run_dir": str(src), "run_id": old_id}
        how = f"reused {src} (the same config but for its name"
    info["config"]["name"] = config["name"]  # the labels: unchanged for a restored run
    info["run_id"] = run_id
    write_json(tmp / "run.json", info)
    ev = tmp / "eval.json"
    if ev.exists():
        rec = json.loads(ev.read_text(encoding="utf-8"))
        rec["run_id"] = run_id
        write_json(ev, rec)
    tmp.rename(run_dir)
    log(f"[{run_id}] {how}; trained at commit {str(info.get('git_commit'))[:7]})")
    return True
