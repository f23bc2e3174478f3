"""Every run of an experiment file planned, on GPUs or on this CPU; a tune experiment in its two phases."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..config import RunConfig, load_experiment
from ..config_base import ConfigError
from .cpu import CpuRates, default_results_dirs, plan_run_cpu
from .gpu import local_gpus, plan_run


def plan_experiment(
    path: str | Path,
    overrides: list[str] | None = None,
    gpus: int | None = None,
    gpu: str | None = None,
    mfu: float | None = None,
    parallel: str | None = None,
    *,
    cpu_peak: float | None = None,
    calibrate: bool = False,
    results: list[str | Path] | None = None,
    home=None,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """One row per run of the experiment (seeds share a row; ``seeds`` counts them). A tune experiment has
    two phases, each row tagged with its ``phase``: the tuning runs (every value on the tuning seeds), then
    the comparison runs, sized at the first value of the tuning grid until the tuning has chosen.

    With ``gpus`` or ``gpu`` (or on a machine with CUDA: its devices) the runs are planned on GPUs at an assumed
    ``mfu`` (default 0.4). Otherwise on this CPU (``plan.cpu``): ``cpu_peak`` (FLOP/s) in place of the stored peak,
    ``mfu`` in place of a measured or published rate, ``calibrate`` to measure every run's rate here, ``results``
    the folders of published studies (default: ``results/`` beside the experiment's folders)."""
    if gpus is None and gpu is None:
        here = local_gpus()
        if here is not None:
            gpus, gpu = here
    on_gpu = gpus is not None or gpu is not None
    rates = None
    if not on_gpu:
        if mfu is not None and not 0 < mfu <= 1:
            raise ConfigError(f"--mfu: must be in (0, 1], got {mfu}")
        if cpu_peak is not None and cpu_peak <= 0:
            raise ConfigError(f"--cpu-peak: must be > 0, got {cpu_peak}")
        dirs = [Path(r) for r in results] if results is not None else default_results_dirs(path)
        rates = CpuRates(dirs, peak_flops=cpu_peak, mfu=mfu, calibrate=calibrate, home=home, log=log)
    exp = load_experiment(path, overrides)
    phases: list[tuple[str | None, list[RunConfig]]]
    if exp.tune is None:
        phases = [(None, exp.resolve())]
    else:
        first = {name: points[0][0] for name, points in exp.tuning_grid().items()}
        phases = [("tuning", exp.resolve()), ("comparison", exp.resolve(exp.comparison_configs(first)))]
    out: list[dict] = []
    for phase, runs in phases:
        rows: dict[str, dict] = {}
        for rc in runs:
            if rc.name in rows:
                rows[rc.name]["seeds"] += 1
                continue
            if rates is not None:
                rows[rc.name] = plan_run_cpu(rc, rates)
            else:
                rows[rc.name] = plan_run(
                    rc, gpus=8 if gpus is None else gpus, gpu=gpu or "H100-80GB", mfu=0.4 if mfu is None else mfu, parallel=parallel
                )
            if phase is not None:
                rows[rc.name]["phase"] = phase
        out += rows.values()
    if exp.tune is not None:
        _note_tuned_costs(exp, out)
    return out


def _note_tuned_costs(exp, rows: list[dict]):
    """A comparison row is sized at the grid's first value; say so where the tuned values change the cost."""
    by_name = {r["run"]: r for r in rows if r["phase"] == "tuning"}
    for r in rows:
        if r["phase"] != "comparison":
            continue
        tried = [by_name[name] for _, name in exp.tuning_grid()[r["run"]]]
        if len({(t["total_train_flops"], round(t["memory_gib"]["total"], 3) if "memory_gib" in t else t["tokens_per_s"]) for t in tried}) > 1:
            r["issues"].append("sized at the first tuned value; the chosen one may differ in time and memory (see its tuning rows)")
