"""A finished run as the reports read it: its run.json and the records of its metrics.jsonl."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..records import AnnealRecord, EvalRecord, TrainRecord, anneals, evals, trains
from ..rundir import RunDir


@dataclass
class Run:
    dir: Path
    run_id: str
    name: str
    seed: int
    info: dict
    train: list[TrainRecord] = field(default_factory=list)
    evals: list[EvalRecord] = field(default_factory=list)
    annealed: list[AnnealRecord] = field(default_factory=list)  # cooldown branches' points (kind "anneal"), by fork step

    @property
    def in_domains(self) -> list[str]:
        w = self.info["config"]["data"]["train_weights"]
        return [d for d, v in w.items() if v > 0]

    @property
    def domains(self) -> list[str]:
        return list(self.evals[-1]["domains"]) if self.evals else []

    @property
    def ood_domains(self) -> list[str]:
        return [d for d in self.domains if d not in self.in_domains]


def load_run(run_dir: str | Path) -> Run:
    rd = RunDir(run_dir)
    info = rd.read_info()
    cfg = info["config"]
    records = rd.read_metrics()
    return Run(rd.path, info["run_id"], cfg["name"], cfg["seed"], info, trains(records), evals(records), anneals(records))
