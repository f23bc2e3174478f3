"""One run's configuration: ``RunConfig`` (its ``[data]``, ``[model]``, ``[train]`` and ``[eval]`` sections,
``config_sections``), its validation with the key's path in every error (``validate_run``), one run at a sweep
point, and the check of a ``--set`` key against a run's fields (``check_run_key``). The experiment file that
expands into runs is ``config.ExperimentConfig``.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import Field, ValidationError, field_validator, model_validator

from ..config_base import ConfigError, Strict, format_validation_error, run_name_problem, set_key
from .sections import MAX_D_MODEL, MAX_LAYERS, MAX_SEQ_LEN, DataConfig, EvalConfig, TrainConfig
from ..model import ModelConfig


class RunConfig(Strict):
    name: str
    seed: int = 0
    seed_offset: int = Field(
        0,
        ge=0,
        description="added to the seed for initialisation and data order (the run keeps its seed "
        "for pairing): a twin of another run under other random draws, the null check of a comparison",
    )
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        problem = run_name_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _check(self):
        if self.data.seq_len > self.model.max_seq_len:
            raise ValueError(f"data.seq_len={self.data.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}")
        tc = self.train
        if tc.cooldown_levels and not any(s % self.eval.every == 0 for s in tc.cooldowns):
            raise ValueError(
                f"train.cooldown_levels: no step of train.cooldowns={tc.cooldowns} is on the evaluation grid (eval.every="
                f"{self.eval.every}): the drop a branch gains is measured against the run's evaluation at its fork"
            )
        off = [d for d in tc.cooldown_level_domains if self.data.eval_domains and d not in self.data.eval_domains]
        if off:
            raise ValueError(f"train.cooldown_level_domains: {off} not among data.eval_domains={self.data.eval_domains} (a level needs their loss)")
        m = self.model
        for key, value, most in (
            ("d_model", m.d_model, MAX_D_MODEL),
            ("n_layers", m.n_layers, MAX_LAYERS),
            ("max_seq_len", m.max_seq_len, MAX_SEQ_LEN),
        ):
            if value > most:
                raise ValueError(f"model.{key}={value} is over {most} (a typo?)")
        return self

    @property
    def train_seed(self) -> int:
        """The seed of initialisation and data order."""
        return self.seed + self.seed_offset

    @property
    def run_id(self) -> str:
        return f"{self.name}-s{self.seed}"


SECTIONS = ("data", "model", "train", "eval")


def validate_point(sections: dict, name: str, seed: int, values: dict[str, Any], prefix: str) -> RunConfig:
    """One run at one sweep point; a swept key that matches no field of the run is named as such."""
    data = {"name": name, "seed": seed, **sections}
    for key, value in values.items():
        data = set_key(data, key, value)
    try:
        return validate_run(data, prefix=f"{prefix} ({name})")
    except ConfigError:
        base = name.split("@")[0]
        try:  # the run without its sweep values: if valid, it tells whether a swept key exists at all
            plain = RunConfig.model_validate({"name": base, "seed": seed, **sections})
        except (ValidationError, ConfigError):
            plain = None  # invalid apart from the sweep: the error being raised names the key
        unknown = [k for k in values if plain is not None and not _has_field(plain, k.split("."))]
        if unknown:
            raise ConfigError(f"sweep: {unknown[0]!r} matches no config field of {prefix} ({base})") from None
        raise


def _has_field(node, path: list[str]) -> bool:
    for part in path:
        if isinstance(node, dict):
            return True  # a free-form table (domain weights): any key
        if not isinstance(node, Strict) or part not in type(node).model_fields:
            return False
        node = getattr(node, part)
    return True


def validate_run(data: dict, prefix: str = "") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(
            format_validation_error(e, prefix).replace(f"{prefix}.", f"{prefix}: ", 1) if prefix else format_validation_error(e)
        ) from None
    except ConfigError as e:
        raise ConfigError(f"{prefix}: {e}" if prefix else str(e)) from None


def _field_type(annotation):
    """``X`` of ``X | None``."""
    union = get_origin(annotation) in (Union, types.UnionType)
    arms = [a for a in get_args(annotation) if a is not type(None)] if union else []
    return arms[0] if len(arms) == 1 else annotation


def check_run_key(key: str, sweep: dict[str, Any] | None = None) -> None:
    """A --set key of a run's config (``train.steps``): it must name a field, and not a swept one (its values are
    in [sweep]). A mixer's knobs are checked against that mixer when each run is validated."""
    parts, node = key.split("."), RunConfig
    if parts[0] not in SECTIONS or len(parts) < 2:
        raise ConfigError(f"--set {key}: not a run config key (a field of {', '.join(SECTIONS)}, e.g. train.steps)")
    for i, part in enumerate(parts):
        if not (isinstance(node, type) and issubclass(node, Strict)):
            if node is Any or get_origin(node) is dict:
                break  # free keys: domain weights; a mixer's table (checked against its mixer)
            raise ConfigError(f"--set {key}: {'.'.join(parts[:i])} is a value, not a table")
        if part not in node.model_fields:
            where = "" if i == len(parts) - 1 else f" {'.'.join(parts[: i + 1])!r}"
            raise ConfigError(f"--set {key}: unknown key{where}; {'.'.join(parts[:i])} has: {', '.join(node.model_fields)}")
        node = _field_type(node.model_fields[part].annotation)
    for swept in sweep or {}:
        if key == swept or key.startswith(swept + ".") or swept.startswith(key + "."):
            raise ConfigError(f"--set {key}: {swept} is swept; set its values with --set sweep.{swept}=[...]")
