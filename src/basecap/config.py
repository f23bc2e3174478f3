"""Typed experiment configuration.

An experiment file (TOML) holds a *base* run (``[data]``, ``[model]``, ``[train]``, ``[eval]``), a list of
``[[runs]]`` that each override parts of the base, the seeds to repeat every run with, and optionally a
``[sweep]`` (config key -> values: every run is repeated at every combination) and a ``tune`` table
(choose each run's value of some swept keys on tuning seeds, then compare at it; docs/experiments.md).
``run_configs`` turns it into validated ``RunConfig`` objects (validation builds nothing);
``resolve`` then applies the explicit resolve step (parameter matching) to each, giving the configs
that are trained, planned and written to ``run.json``.
"""

from __future__ import annotations

import copy
import itertools
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from .config_base import ConfigError, Strict, format_validation_error
from .matching import resolve as resolve_config
from .tracking import normalize_loggers
from .model import ModelConfig


class DataConfig(Strict):
    recipe: str = Field("default", description="built-in recipe name or path to a recipe TOML")
    train_weights: dict[str, float] = Field(default_factory=lambda: {"prose": 1.0},
                                            description="domain -> sampling weight; limited-domain vs mixed-domain setting")
    eval_domains: list[str] | None = Field(None, description="domains evaluated; default: every domain of the corpus")
    seq_len: int = Field(256, gt=1)

    @field_validator("train_weights")
    @classmethod
    def _weights(cls, v):
        if not v or sum(v.values()) <= 0:
            raise ValueError("needs at least one domain with a positive weight")
        bad = {k: w for k, w in v.items() if w < 0}
        if bad:
            raise ValueError(f"weights must be >= 0, got {bad}")
        return v

    def in_domains(self) -> list[str]:
        return [d for d, w in self.train_weights.items() if w > 0]


class TrainConfig(Strict):
    steps: int = Field(300, gt=0)
    batch_size: int = Field(8, gt=0, description="sequences per optimizer step (all micro-batches together)")
    grad_accum: int = Field(1, gt=0, description="micro-batches per step; batch_size must divide evenly")
    lr: float = Field(3e-3, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(30, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(1.0, ge=0, description="0 disables clipping")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto: fp32 on CPU, bf16 autocast on CUDA")
    threads: int | None = Field(None, gt=0, description="torch intra-op threads on CPU (default: all cores)")
    compile: bool = False
    parallel: Literal["ddp", "fsdp"] = Field("ddp", description="data parallelism under torchrun (DDP, or FSDP2 sharding)")
    dist_timeout_s: float = Field(600.0, gt=0, le=86400, description="seconds a collective may wait for the other ranks under torchrun")
    checkpoint_every: int = Field(100, gt=0)
    keep_checkpoints: int = Field(2, gt=0)
    log_every: int = Field(10, gt=0)
    progress: bool = True
    loggers: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["jsonl"], description="jsonl (always on, the source of truth), tensorboard, wandb (docs/tracking.md)")

    @field_validator("loggers")
    @classmethod
    def _loggers(cls, v):
        return list(normalize_loggers(v))

    @model_validator(mode="after")
    def _check(self):
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size={self.batch_size} is not divisible by grad_accum={self.grad_accum}")
        if self.warmup_steps >= self.steps and self.steps > 1:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be < steps={self.steps}")
        return self


class EvalConfig(Strict):
    every: int = Field(50, gt=0, description="evaluate every K steps (and at the last step)")
    split: Literal["validation", "test"] = "validation"
    max_tokens: int = Field(32768, gt=0, description="evaluation tokens per domain")
    batch_size: int = Field(8, gt=0)


_NAME = r"[A-Za-z0-9_.+-]+"
# a run of a sweep is named after its point: the run's name, then each swept key's label and value
# (transformer_pp@lr=0.003,d_model=64); "@", "=" and "," appear nowhere else, so the name reads back unambiguously
_RUN_NAME = rf"{_NAME}(@{_NAME}={_NAME}(,{_NAME}={_NAME})*)?"


class RunConfig(Strict):
    name: str
    seed: int = 0
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not re.fullmatch(_RUN_NAME, v):
            raise ValueError("run names may use letters, digits and _ . + - only (a sweep point adds @key=value,...)")
        return v

    @model_validator(mode="after")
    def _check(self):
        if self.data.seq_len > self.model.max_seq_len:
            raise ValueError(f"data.seq_len={self.data.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}")
        return self

    @property
    def run_id(self) -> str:
        return f"{self.name}-s{self.seed}"


_SECTIONS = ("data", "model", "train", "eval")


class SpeedConfig(Strict):
    lengths: list[int] = Field(default_factory=lambda: [512, 2048, 8192], min_length=1)
    contexts: list[int] = Field(default_factory=lambda: [1024, 4096, 16384], min_length=1)
    reps: int = Field(3, gt=0)


class ExperimentConfig(Strict):
    name: str
    description: str = ""
    out_dir: str | None = Field(None, description="default: runs/<name>")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    reference: str | None = Field(None, description="run name the report compares every other run against")
    size: str | None = Field(None, description="which [sizes.<name>] table to apply to the base (e.g. tiny, 110m, 1.3b)")
    sizes: dict[str, dict[str, Any]] = Field(default_factory=dict, description="named overrides of the base sections, chosen by size; "
                                             "sizes.<s>.runs.<run> overrides one run at that size")
    suites: list[dict[str, Any]] = Field(default_factory=list, description="evaluation suites run on every trained run: "
                                         "[[suites]] suite = 'mqar' plus that suite's options")
    speed: SpeedConfig | None = Field(None, description="also benchmark the runs' mixers against sequence length for the report")
    data: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] = Field(default_factory=dict)
    train: dict[str, Any] = Field(default_factory=dict)
    eval: dict[str, Any] = Field(default_factory=dict)
    runs: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self):
        names = [r.get("name") for r in self.runs]
        if any(n is None for n in names):
            raise ValueError("runs: every [[runs]] entry needs a name")
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"runs: duplicate run names {sorted(dup)}")
        if self.size is not None and self.size not in self.sizes:
            raise ValueError(f"size: {self.size!r} is not defined; allowed: {', '.join(self.sizes) or '(no [sizes.*] tables)'}")
        for sname, over in self.sizes.items():
            extra = set(over) - {*_SECTIONS, "runs"}
            if extra:
                raise ValueError(f"sizes.{sname}: unknown key(s) {sorted(extra)}; allowed: {', '.join(_SECTIONS)}, runs")
            unknown_runs = set(over.get("runs", {})) - set(names)
            if unknown_runs:
                raise ValueError(f"sizes.{sname}.runs: unknown run(s) {sorted(unknown_runs)}; runs are {names}")
        for i, spec in enumerate(self.suites):
            if "suite" not in spec:
                raise ValueError(f"suites[{i}]: needs a 'suite' key")
        keys = [(s.get("suite"), s.get("name")) for s in self.suites]
        if len(set(keys)) != len(keys):
            raise ValueError("suites: two entries of the same suite need different `name`s")
        if self.reference is not None and self.runs and self.reference not in names:
            raise ValueError(f"reference: {self.reference!r} is not a run name; runs are {names}")
        return self

    def output_dir(self) -> Path:
        return Path(self.out_dir or (f"runs/{self.name}" + (f"-{self.size}" if self.size else "")))

    def resolve(self) -> list[RunConfig]:
        """Every (run, seed) resolved for training or planning: validated, then parameter-matched."""
        return [resolve_config(rc) for rc in self.run_configs()]

    def run_configs(self) -> list[RunConfig]:
        """Every (run, seed) as a validated RunConfig, as written (no parameter matching); all errors
        are raised before any compute."""
        base = {k: getattr(self, k) for k in _SECTIONS}
        size = self.sizes.get(self.size, {}) if self.size is not None else {}
        base = deep_merge(base, {k: v for k, v in size.items() if k != "runs"})
        runs = self.runs or [{"name": self.name}]
        merged_runs = []
        for i, spec in enumerate(runs):
            extra = set(spec) - {"name", *_SECTIONS}
            if extra:
                raise ConfigError(f"runs[{i}] ({spec['name']}): unknown key(s) {sorted(extra)}; allowed: name, {', '.join(_SECTIONS)}")
            merged = deep_merge(base, {k: v for k, v in spec.items() if k in _SECTIONS})
            merged_runs.append((i, spec["name"], deep_merge(merged, size.get("runs", {}).get(spec["name"], {}))))
        # seed-major: every architecture of seed 0 first, so an interrupted study already has complete pairs
        return [validate_run({"name": name, "seed": seed, **merged}, prefix=f"runs[{i}] ({name})")
                for seed in self.seeds for i, name, merged in merged_runs]


def deep_merge(base: dict, over: dict) -> dict:
    """Recursive merge. A table whose ``name`` changes (e.g. a different mixer) replaces the base table
    instead of merging, so one mixer's knobs never leak into another's config."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not ("name" in v and v["name"] != out[k].get("name")):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def validate_run(data: dict, prefix: str = "") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, prefix).replace(f"{prefix}.", f"{prefix}: ", 1) if prefix else format_validation_error(e)) from None
    except ConfigError as e:
        raise ConfigError(f"{prefix}: {e}" if prefix else str(e)) from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value); the value is parsed as a TOML value, else kept as a string."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. train.steps=100")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = copy.deepcopy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for p in path[:-1]:
            if not isinstance(node.setdefault(p, {}), dict):
                raise ConfigError(f"--set {item!r}: {p!r} is not a table")
            node = node[p]
        node[path[-1]] = value
    return data


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read and validate an experiment TOML; ``overrides`` (``a.b=c``) apply to the base sections."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"experiment file not found: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    data.setdefault("name", path.stem)
    data = apply_overrides(data, overrides or [])
    try:
        exp = ExperimentConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: " + format_validation_error(e)) from None
    exp.run_configs()  # validate every run now, before any compute
    return exp
