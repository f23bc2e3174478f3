"""Typed experiment configuration.

An experiment file (TOML) holds a *base* run (``[data]``, ``[model]``, ``[train]``, ``[eval]``), a list of
``[[runs]]`` that each override parts of the base, the seeds to repeat every run with, and optionally a
``[sweep]`` (config key -> values: every run is repeated at every combination) and a ``tune`` table
(choose each run's value of some swept keys on tuning seeds, then compare at it; docs/experiments.md).
``run_configs`` turns it into validated ``RunConfig`` objects (``config.run``; validation builds nothing);
``resolve`` then applies the explicit resolve step (parameter matching) to each, giving the configs
that are trained, planned and written to ``run.json``.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from ..config_base import (
    ConfigError,
    apply_size_sweep,
    Strict,
    check_name,
    deep_merge,
    flatten_keys,
    format_validation_error,
    key_labels,
    name_problem,
    parse_override,
    set_key,
    sweep_name,
    valid_name,
    value_label,
)
from .overlay import OVERLAYS, DataOverlay, EvalOverlay, ModelOverlay, TrainOverlay, check_overlay
from .run import SECTIONS, RunConfig, check_run_key, validate_point
from .sections import (
    CompareConfig,
)
from ..matching import resolve as resolve_config

__all__ = ["ExperimentConfig", "SpeedConfig", "TuneConfig", "apply_overrides", "load_experiment"]


class SpeedConfig(Strict):
    lengths: list[int] = Field(default_factory=lambda: [512, 2048, 8192], min_length=1)
    contexts: list[int] = Field(default_factory=lambda: [1024, 4096, 16384], min_length=1)
    reps: int = Field(3, gt=0)


class TuneConfig(Strict):
    """Tune, then compare: each run's value of ``keys`` is chosen on ``seeds`` (in-domain validation loss)."""

    keys: list[str] = Field(min_length=1, description="swept keys ([sweep]) whose value every run chooses for itself")
    seeds: list[int] = Field(min_length=1, description="tuning seeds: never used by the comparison")
    metric: str = Field("in_domain_loss", description="what chooses: the final in-domain loss on the validation split (the only one)")

    @model_validator(mode="after")
    def _check(self):
        if self.metric != "in_domain_loss":
            raise ValueError(
                f"metric {self.metric!r}: only 'in_domain_loss' (the final in-domain loss on the validation split) may "
                "choose a value; the OOD domains are the study's test set, and choosing on them would leak the answer"
            )
        if len(set(self.keys)) != len(self.keys) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"repeated keys or seeds: keys={self.keys}, seeds={self.seeds}")
        return self


class ExperimentConfig(Strict):
    name: str
    description: str = ""
    out_dir: str | None = Field(None, description="default: runs/<name>")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    reference: str | None = Field(None, description="run name the report compares every other run against")
    more_references: list[str] = Field(
        default_factory=list,
        description="further references for an ablation of several base architectures: each run is compared with the "
        "reference of its own mixer (model.mixer.name), else with `reference`",
    )
    size: str | None = Field(None, description="which [sizes.<name>] table to apply to the base (e.g. tiny, 110m, 1.3b)")
    sizes: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="named overrides of the base sections, chosen by size; sizes.<s>.runs.<run> overrides one run at that size"
    )
    suites: list[dict[str, Any]] = Field(
        default_factory=list, description="evaluation suites run on every trained run: [[suites]] suite = 'mqar' plus that suite's options"
    )
    speed: SpeedConfig | None = Field(None, description="also benchmark the runs' mixers against sequence length for the report")
    sweep: dict[str, Any] = Field(
        default_factory=dict,
        description="config key (as --set spells it, e.g. train.lr) -> list of values: "
        "every run is repeated at every combination, named after its values",
    )
    tune: TuneConfig | None = Field(
        None,
        description="tune = { keys, seeds, metric }: choose each run's value of swept keys on "
        "tuning seeds (in-domain validation loss), then compare at the chosen values; "
        "tune = false (--set tune=false) turns it off, e.g. for a shared-value control",
    )
    compare: CompareConfig | None = Field(
        None,
        description="[compare]: the study's comparison design, fixed before results "
        "(band, match_domains, targets, points; docs/metrics.md); absent: the lowest 30% "
        "of each pair's common range, every target, the evaluations",
    )
    data: DataOverlay = Field(default_factory=lambda: DataOverlay({}), description="the base run's [data]: some DataConfig fields")
    model: ModelOverlay = Field(default_factory=lambda: ModelOverlay({}), description="the base run's [model]: some ModelConfig fields")
    train: TrainOverlay = Field(default_factory=lambda: TrainOverlay({}), description="the base run's [train]: some TrainConfig fields")
    eval: EvalOverlay = Field(default_factory=lambda: EvalOverlay({}), description="the base run's [eval]: some EvalConfig fields")
    runs: list[dict[str, Any]] = Field(
        default_factory=list, description="[[runs]]: a name, a seed_offset and overlays of the four sections (each checked as its section's)"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="run config key -> value set on the command line (--set train.steps=50): applied to every run last, over the size table",
    )

    @field_validator("sweep", mode="before")
    @classmethod
    def _flat_sweep(cls, v):
        return flatten_keys(v) if isinstance(v, dict) else v

    @field_validator("tune", mode="before")
    @classmethod
    def _tune_off(cls, v):
        return None if v is False else v  # TOML has no null: false is the way to switch tuning off

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        return valid_name(v, "experiment names")

    @model_validator(mode="after")
    def _check(self):
        names = self._check_names()
        if self.size is not None and self.size not in self.sizes:
            raise ValueError(f"size: {self.size!r} is not defined; allowed: {', '.join(self.sizes) or '(no [sizes.*] tables)'}")
        for sname, over in self.sizes.items():
            check_name(sname, f"sizes[{sname!r}]", "size names")
            extra = set(over) - {*SECTIONS, "runs", "sweep", "compare"}
            if extra:
                raise ValueError(f"sizes.{sname}: unknown key(s) {sorted(extra)}; allowed: {', '.join(SECTIONS)}, runs, sweep, compare")
            if "compare" in over:
                CompareConfig.model_validate(over["compare"])  # checked at every size, not only the chosen one
            unknown_runs = set(over.get("runs", {})) - set(names)
            if unknown_runs:
                raise ValueError(f"sizes.{sname}.runs: unknown run(s) {sorted(unknown_runs)}; runs are {names}")
            _check_sections(over, f"sizes.{sname}")
            for rname, rover in over.get("runs", {}).items():
                extra = set(rover) - set(SECTIONS) if isinstance(rover, dict) else set()
                if extra:
                    raise ValueError(f"sizes.{sname}.runs.{rname}: unknown key(s) {sorted(extra)}; allowed: {', '.join(SECTIONS)}")
                _check_sections(rover, f"sizes.{sname}.runs.{rname}")
        # a sweep point names its run (name@lr=0.003): the reference may be a run or one of its points
        if self.reference is not None and self.runs and self.reference.split("@")[0] not in names:
            raise ValueError(f"reference: {self.reference!r} is not a run name; runs are {names}")
        if self.more_references and self.reference is None:
            raise ValueError("more_references: name the first reference in `reference`")
        bad = [r for r in self.more_references if r.split("@")[0] not in names]
        if bad:
            raise ValueError(f"more_references: {bad} not run names; runs are {names}")
        self._check_sweep()
        for key in self.overrides:
            check_run_key(key, self.sweep)
        return self

    def _check_names(self) -> list[str]:
        """Every [[runs]] and [[suites]] name: present where needed, valid, unique. Returns the run names."""
        names: list[str] = []
        for i, r in enumerate(self.runs):
            n = r.get("name")
            if n is None:
                raise ValueError(f"runs[{i}]: every [[runs]] entry needs a name")
            check_name(n, f"runs[{i}].name", "run names")
            _check_sections(r, f"runs[{i}] ({n})")
            names.append(n)
        folded = [n.lower() for n in names]  # run folders: one on a case-insensitive file system
        dup = {n for n in names if folded.count(n.lower()) > 1}
        if dup:
            raise ValueError(f"runs: duplicate run names (ignoring case) {sorted(dup)}")
        for i, spec in enumerate(self.suites):
            if "suite" not in spec:
                raise ValueError(f"suites[{i}]: needs a 'suite' key")
            if "name" in spec:
                check_name(spec["name"], f"suites[{i}].name", "suite names")
        keys = [(s.get("suite"), s.get("name")) for s in self.suites]
        if len(set(keys)) != len(keys):
            raise ValueError("suites: two entries of the same suite need different `name`s")
        return names

    def _check_sweep(self):
        for key, values in self.sweep.items():
            if key.split(".")[0] not in SECTIONS or "." not in key:
                raise ValueError(f"sweep: {key!r} is not a run's config key (a field of {', '.join(SECTIONS)}, e.g. train.lr)")
            if not isinstance(values, list) or not values:
                raise ValueError(f"sweep.{key}: expected a non-empty list of values, got {values!r}")
            labels = [value_label(key, v) for v in values]
            if len(set(labels)) != len(labels):
                raise ValueError(f"sweep.{key}: repeated values {values}")
        if self.tune is None:
            return
        unswept = [k for k in self.tune.keys if k not in self.sweep]
        if unswept:
            raise ValueError(f"tune.keys: {unswept} not swept; list the values to try in [sweep] (swept: {list(self.sweep) or 'none'})")
        shared = sorted(set(self.tune.seeds) & set(self.seeds))
        if shared:
            raise ValueError(f"tune.seeds and seeds share {shared}: the comparison must never run on a seed its values were chosen on")

    def output_dir(self) -> Path:
        return Path(self.out_dir or (f"runs/{self.name}" + (f"-{self.size}" if self.size else "")))

    def resolve(self, configs: list[RunConfig] | None = None) -> list[RunConfig]:
        """``configs`` (default: ``run_configs()``) resolved for training or planning: parameter-matched."""
        return [resolve_config(rc) for rc in (self.run_configs() if configs is None else configs)]

    def run_configs(self) -> list[RunConfig]:
        """Every run the file fixes before any compute, as a validated RunConfig (no parameter matching): each
        [[runs]] entry x sweep point x seed, seed-major. For a tune experiment, its tuning runs: the comparison
        runs follow from the tuning's choice (``comparison_configs``). All errors are raised before any compute."""
        if self.tune is not None:
            return self.tuning_configs()
        return self._expand(self.seeds, list(self.sweep))

    def tuning_configs(self) -> list[RunConfig]:
        """A tune experiment's tuning runs: every run x sweep point x tuning seed (none without ``tune``)."""
        if self.tune is None:
            return []
        runs = self._expand(self.tune.seeds, list(self.sweep))
        bad = sorted({rc.name.split("@")[0] for rc in runs if rc.eval.split != "validation"})
        if bad:
            raise ConfigError(f"tune: runs {bad} evaluate on eval.split='test'; a value is chosen on the validation split only")
        return runs

    def tuning_grid(self) -> dict[str, list[tuple[dict[str, Any], str]]]:
        """Comparison run name -> [(tuned values, tuning run name)] in the order of the grid."""
        if self.tune is None:
            return {}
        labels = key_labels(list(self.sweep))
        fixed = [k for k in self.sweep if k not in self.tune.keys]
        return {
            sweep_name(base, point, labels): [(tuned, sweep_name(base, {**point, **tuned}, labels)) for tuned in self._points(self.tune.keys)]
            for _, base, _ in self._bases()
            for point in self._points(fixed)
        }

    def comparison_configs(self, chosen: dict[str, dict[str, Any]]) -> list[RunConfig]:
        """A tune experiment's comparison runs named in ``chosen`` (comparison run name -> {tuned key: value}),
        each seed at its chosen values; a name carries no tuned value (``tuning_grid`` lists the names)."""
        if self.tune is None:
            raise ConfigError("comparison_configs: the experiment has no tune table")
        bad = [n for n in chosen if n not in self.tuning_grid() or set(chosen[n]) != set(self.tune.keys)]
        if bad:
            raise ConfigError(f"tune: {bad} are not runs of the tuning grid with a value of every key of {self.tune.keys}")
        return self._expand(self.seeds, [k for k in self.sweep if k not in self.tune.keys], chosen)

    def _bases(self) -> list[tuple[str, str, dict]]:
        """(error prefix, name, sections) of every [[runs]] entry: the base sections < the entry < the size table
        (its per-run entries last) < ``overrides`` (--set)."""
        base = {k: getattr(self, k).root for k in SECTIONS}
        size = self.sizes.get(self.size, {}) if self.size is not None else {}
        base = deep_merge(base, {k: v for k, v in size.items() if k not in ("runs", "sweep", "compare")})
        out = []
        for i, spec in enumerate(self.runs or [{"name": self.name}]):
            extra = set(spec) - {"name", "seed_offset", *SECTIONS}
            if extra:
                raise ConfigError(f"runs[{i}] ({spec['name']}): unknown key(s) {sorted(extra)}; allowed: name, seed_offset, {', '.join(SECTIONS)}")
            merged = deep_merge(base, {k: v for k, v in spec.items() if k in (*SECTIONS, "seed_offset")})
            merged = deep_merge(merged, size.get("runs", {}).get(spec["name"], {}))
            for key, value in self.overrides.items():  # --set: last, over the size table; a table given is replaced
                merged = set_key(merged, key, value, what=f"--set {key}")
            out.append((f"runs[{i}]", spec["name"], merged))
        return out

    def _points(self, keys: list[str]) -> list[dict[str, Any]]:
        return [dict(zip(keys, values)) for values in itertools.product(*(self.sweep[k] for k in keys))]

    def _expand(self, seeds: list[int], keys: list[str], chosen: dict[str, dict[str, Any]] | None = None) -> list[RunConfig]:
        """Every seed x run x point of ``keys``, validated, named after its point; with ``chosen``, only the
        names it holds, each with its chosen values on top (values that do not name the run)."""
        labels = key_labels(list(self.sweep))
        named = [
            (prefix, sweep_name(name, point, labels), sections, point) for prefix, name, sections in self._bases() for point in self._points(keys)
        ]
        # seed-major: every architecture of seed 0 first, so an interrupted study already has complete pairs
        return [
            validate_point(sections, name, seed, {**point, **(chosen or {}).get(name, {})}, prefix)
            for seed in seeds
            for prefix, name, sections, point in named
            if chosen is None or name in chosen
        ]


def _check_sections(table: Any, where: str) -> None:
    """Each of the four sections ``table`` sets, checked as an overlay of its run section (``config.overlay``)."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table, got {table!r}")
    for key in SECTIONS:
        if key in table:
            check_overlay(table[key], OVERLAYS[key].section, f"{where}.{key}")


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """``data`` (copied) with every ``key=value`` of ``overrides`` set where its dotted key points."""
    for item in overrides:
        path, value = parse_override(item)
        data = set_key(data, ".".join(path), value, what=f"--set {item!r}")
    return data


def _split_overrides(overrides: list[str]) -> tuple[list[str], dict[str, Any]]:
    """(--set items of the experiment's own keys (size, seeds, sweep...), run config key -> value)."""
    top, runs = [], {}
    for item in overrides:
        path, value = parse_override(item)
        if path[0] in SECTIONS:
            runs[".".join(path)] = value
        elif path[0] in ExperimentConfig.model_fields and path[0] != "overrides":
            top.append(item)
        else:
            allowed = [k for k in ExperimentConfig.model_fields if k not in (*SECTIONS, "overrides")]
            raise ConfigError(
                f"--set {'.'.join(path)}: unknown key; a run's keys start with "
                f"{', '.join(s + '.' for s in SECTIONS)}; the experiment's are {', '.join(allowed)}"
            )
    return top, runs


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read and validate an experiment TOML. ``overrides`` (``a.b=c``, from --set) win over everything in the file:
    a run config key (``train.steps``) applies to every run after its size table, any other key (``size``,
    ``seeds``, ``sweep.train.lr``) to the experiment itself."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"experiment file not found: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    if "name" not in data and name_problem(path.stem):
        raise ConfigError(
            f"{path}: name: the experiment is named after its file, and {name_problem(path.stem, 'experiment names')}; set name = \"...\" in the file"
        )
    data.setdefault("name", path.stem)
    if "overrides" in data:
        raise ConfigError(f"{path}: overrides: set with --set on the command line, not in the file")
    top, runs = _split_overrides(overrides or [])
    swept = [o for o in top if o.startswith("sweep.") or o.split("=")[0].strip() == "sweep"]  # file < size's sweep < --set sweep*
    data = apply_overrides(apply_size_sweep(apply_overrides(data, [o for o in top if o not in swept])), swept)
    for key in runs:
        check_run_key(key)
    data["overrides"] = runs
    try:
        exp = ExperimentConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: " + format_validation_error(e)) from None
    exp.run_configs()  # validate every run now, before any compute (a tune experiment: every tuning run)
    return exp
