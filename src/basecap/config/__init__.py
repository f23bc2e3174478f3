"""Typed configuration: an experiment file (``experiment``: ``ExperimentConfig``, ``load_experiment``, ``--set``
overrides), one run's config and its validation (``run``: ``RunConfig``, ``validate_run``, ``check_run_key``), and the
sections of a run and a study (``sections``: ``[data]``, ``[train]``, ``[eval]``, ``[compare]``). Every config name
is imported from here; the strict base model, ``ConfigError`` and the key helpers live one layer down, in
``config_base``."""

from .experiment import ExperimentConfig, SpeedConfig, TuneConfig, apply_overrides, load_experiment
from .run import SECTIONS, RunConfig, check_run_key, validate_point, validate_run
from .sections import (
    MAX_BATCH,
    MAX_D_MODEL,
    MAX_LAYERS,
    MAX_SEQ_LEN,
    MAX_STEPS,
    CompareConfig,
    DataConfig,
    EvalConfig,
    RetrievalMix,
    TrainConfig,
)

__all__ = [
    "MAX_BATCH",
    "MAX_D_MODEL",
    "MAX_LAYERS",
    "MAX_SEQ_LEN",
    "MAX_STEPS",
    "SECTIONS",
    "CompareConfig",
    "DataConfig",
    "EvalConfig",
    "ExperimentConfig",
    "RetrievalMix",
    "RunConfig",
    "SpeedConfig",
    "TrainConfig",
    "TuneConfig",
    "apply_overrides",
    "check_run_key",
    "load_experiment",
    "validate_point",
    "validate_run",
]
