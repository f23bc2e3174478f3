"""A finished run as the reports read it: its run.json and the records of its metrics.jsonl."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..rundir import RunDir


@dataclass
class Run:
    dir: Path
    run_id: str
    name: str
    seed: int
    info: dict
    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    annealed: list[dict] = field(default_factory=list)  # cooldown branches' points (kind "anneal"), by fork step

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
    run = Run(rd.path, info["run_id"], cfg["name"], cfg["seed"], info)
    for rec in rd.read_metrics():
        kind = rec.get("kind")
        (run.evals if kind == "eval" else run.annealed if kind == "anneal" else run.train).append(rec)
    return run
