"""The published study a new architecture joins: its design (experiment file, size, seeds, plan, reference and the
reference's other learning rates), and its records checked against that design and this machine's corpus.

The design is the study's experiment file at its size (``experiments/paper/claims.toml`` names both for every
published study; ``--experiment`` and ``--size`` for one it does not list), with the run-config overrides the study
was run with (``--set train.threads=1``: recorded in ``results/<study>/runs/experiment.json``, and for the keys that
only say how a run executed, ``EXECUTION_KEYS``, read from its records) and the learning rates
a tune study chose (its ``tuning.json``) written into its runs, so that every run the design describes is config for
config the run that was trained. A reference record is found by that config (``basecap.reuse``), never by name.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

from pydantic import ValidationError

from ..config import ExperimentConfig, RunConfig, load_experiment
from ..config_base import ConfigError, format_validation_error, set_key
from ..reuse import DISPLAY_KEYS, find_reusable
from ..scorecard.claims import CLAIMS_FILE, ClaimsFile, experiment_path
from ..scorecard.sequential import Plan
from ..sweep import TUNING_FILE, read_tuning

DEFAULT_TUNING_SEEDS = [100]  # as every tune study of this project: a seed no comparison uses


@dataclasses.dataclass
class Design:
    """A published study's design, ready to take a new architecture's runs."""

    name: str  # the study (its [studies.*] key, else its folder's name)
    results: Path  # the published folder (summary.json, runs/)
    experiment: Path
    size: str | None
    exp: ExperimentConfig  # plain (no sweep, no tune): every [[runs]] entry at its trained values
    reference: str
    rate: float  # the reference's learning rate
    rate_runs: dict[float, str]  # the reference's runs at other learning rates (rate arm B): rate -> run name
    grid: list[float]  # the learning rates a new architecture is tuned over
    tuning_seeds: list[int]
    plan: Plan
    margin: float
    alpha: float
    domains: list[str]


def read_claims(path: Path) -> ClaimsFile:
    """The claims file's settings and studies (validated; its runs are not loaded: that is the scorecard's check)."""
    try:
        return ClaimsFile.model_validate(tomllib.loads(Path(path).read_text(encoding="utf-8")))
    except ValidationError as e:
        raise ConfigError(f"{path}: {format_validation_error(e)}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None


# run-config keys that say how a run was executed rather than what it computes; a study's processes may have been
# started with different --set values of them, so its records, not its last command, say which the study ran with
EXECUTION_KEYS = ("train.progress", "train.threads")


def _recorded_overrides(results: Path) -> dict:
    """The run-config overrides (--set) the study's runs were trained with: its experiment.json's (the last command's),
    then the execution keys as its records have them."""
    try:
        out = dict(json.loads((results / "runs" / "experiment.json").read_text(encoding="utf-8")).get("overrides") or {})
    except (OSError, ValueError):
        out = {}
    for info in sorted((results / "runs").glob("*/run.json")):
        try:
            config = json.loads(info.read_text(encoding="utf-8"))["config"]
        except (OSError, ValueError, KeyError):
            continue
        for key in EXECUTION_KEYS:
            section, field = key.split(".")
            if field in config.get(section, {}):
                out[key] = config[section][field]
        break
    return out


def _plain(exp: ExperimentConfig, results: Path) -> ExperimentConfig:
    """``exp`` without its sweep and tuning: each [[runs]] entry with the values its tune study chose written in."""
    entries = [dict(e) for e in exp.runs]
    if exp.tune is not None:
        fixed = [k for k in exp.sweep if k not in exp.tune.keys]
        if fixed:
            raise ConfigError(f"study {exp.name}: a sweep over {fixed} besides the tuned keys; compare joins studies of plain runs")
        chosen = {n: e.get("chosen") for n, e in read_tuning(results / TUNING_FILE).get("runs", {}).items()}
        for i, e in enumerate(entries):
            if not chosen.get(e["name"]):
                raise ConfigError(f"study {exp.name}: {results / TUNING_FILE} has no chosen values of run {e['name']!r}")
            for key, value in chosen[e["name"]].items():
                entries[i] = set_key(entries[i], key, value, what=f"{TUNING_FILE}: {e['name']}")
    elif exp.sweep:
        raise ConfigError(f"study {exp.name}: a sweep ({', '.join(exp.sweep)}); compare joins studies of plain runs")
    return with_runs(exp, entries)


def with_runs(exp: ExperimentConfig, runs: list[dict], **update) -> ExperimentConfig:
    """``exp`` with other [[runs]] entries (and other top-level fields), validated again."""
    data = {**json.loads(exp.model_dump_json()), "sweep": {}, "tune": None, "runs": runs, **update}
    return ExperimentConfig.model_validate(data)


def _without(cfg: RunConfig, *keys: str) -> str:
    d = json.loads(cfg.model_dump_json())
    d.pop("name")
    for key in keys:
        section, field = key.split(".")
        d[section].pop(field)
    return json.dumps(d, sort_keys=True)


def find_design(
    results: Path,
    *,
    experiment: Path | None = None,
    size: str | None = None,
    sets: list[str] | None = None,
    claims_path: Path | None = None,
    root: Path = Path("."),
    grid: list[float] | None = None,
) -> Design:
    """The design of the study published in ``results`` (see the module's docstring)."""
    results = Path(results)
    if not (results / "runs").is_dir():
        raise ConfigError(
            f"--study {results}: not a published study (no runs/ folder); give its results folder, e.g. results/architectures_rate_arms"
        )
    claims = read_claims(Path(claims_path) if claims_path else root / CLAIMS_FILE)
    key = next((k for k in claims.studies if claims.results_dir(k) == results.name), None)
    entry = claims.studies.get(key) if key else None
    if experiment is None:
        if entry is None:
            raise ConfigError(
                f"--study {results}: not a study of {claims_path or CLAIMS_FILE}; give its experiment file with --experiment and --size"
            )
        experiment = experiment_path(root, entry)
    size = size or (entry.size if entry else None)
    exp = load_experiment(experiment, ([f"size={size}"] if size else []) + list(sets or []))
    recorded = _recorded_overrides(results)
    if recorded:  # the study's own --set values; the ones given now win
        exp = ExperimentConfig.model_validate({**json.loads(exp.model_dump_json()), "overrides": {**recorded, **exp.overrides}})
    tuning_seeds = exp.tune.seeds if exp.tune is not None else DEFAULT_TUNING_SEEDS
    swept = sorted(float(v) for v in exp.sweep.get("train.lr", [])) if exp.tune is not None and "train.lr" in exp.tune.keys else []
    plain = _plain(exp, results)
    if plain.reference is None or plain.reference not in {e["name"] for e in plain.runs}:
        raise ConfigError(f"study {plain.name}: no reference run (reference = {plain.reference!r}); compare measures a gap against it")
    first = {rc.name: rc for rc in plain.resolve([rc for rc in plain.run_configs() if rc.seed == plain.seeds[0]])}
    ref = first[plain.reference]
    rate_runs = {rc.train.lr: n for n, rc in first.items() if n != plain.reference and _without(rc, "train.lr") == _without(ref, "train.lr")}
    plan = Plan(tuple(entry.looks), entry.spending, tuple(entry.looks_taken)) if entry else Plan()
    return Design(
        name=key or results.name,
        results=results,
        experiment=Path(experiment),
        size=plain.size,
        exp=plain,
        reference=plain.reference,
        rate=ref.train.lr,
        rate_runs=rate_runs,
        grid=sorted(grid) if grid else swept or sorted({ref.train.lr, *rate_runs}),
        tuning_seeds=list(tuning_seeds),
        plan=plan,
        margin=claims.margin,
        alpha=claims.alpha,
        domains=list(claims.domains),
    )


def look_seeds(design: Design, until_look: int | None = None) -> list[list[int]]:
    """The study's seeds in the order its plan reads them: one group per look (declared or taken), else one group;
    ``until_look``: only the groups up to that look."""
    seeds = design.exp.seeds
    sizes = list(design.plan.looks or design.plan.looks_taken)
    sizes = [n for n in sizes if n < len(seeds)] + [len(seeds)]
    groups = [seeds[a:b] for a, b in zip([0, *sizes], sizes) if b > a]
    if until_look is not None:
        if not 1 <= until_look <= len(groups):
            raise ConfigError(f"--until-look: the study is read at {len(groups)} look(s) ({', '.join(map(str, sizes))} seeds), got {until_look}")
        groups = groups[:until_look]
    return groups


def rate_label(lr: float) -> str:
    """2e-3 for 0.002, 2.5e-4 for 0.00025: the rate arms' run names (``mamba2_lr2e-3``)."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys where two configs differ (``name`` aside), with both values."""
    out = []
    for k in sorted(set(a) | set(b)):
        key = f"{prefix}{k}"
        if key == "name":
            continue
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _diff(x, y, key + ".")
        elif x != y:
            out.append(f"{key}: {json.dumps(y)} in the record, {json.dumps(x)} in the design")
    return out


def _variants(config: dict) -> list[dict]:
    """``config``, then with each boolean display key the other way."""
    out = [config]
    for section, field in DISPLAY_KEYS:
        if isinstance(config.get(section, {}).get(field), bool):
            out += [{**c, section: {**c[section], field: not c[section][field]}} for c in list(out)]
    return out


def locate(rc: RunConfig, sources: list[Path]) -> Path | None:
    """The finished record of ``rc`` (its config but for the name and the display keys) in the first source that
    has one."""
    config = json.loads(rc.model_dump_json())
    for src in sources:
        if Path(src).is_dir():
            for variant in _variants(config):
                found = find_reusable(variant, [Path(src)])
                if found is not None:
                    return found
    return None


def as_recorded(config: dict, found: Path) -> dict:
    """``config`` with the display keys as the record in ``found`` has them (what ``basecap.reuse`` compares)."""
    stored = json.loads((found / "run.json").read_text(encoding="utf-8"))["config"]
    out = json.loads(json.dumps(config))
    for section, field in DISPLAY_KEYS:
        if field in stored.get(section, {}):
            out[section][field] = stored[section][field]
    return out


def check_record(design: Design, rc: RunConfig, found: Path | None, corpus_key: str) -> None:
    """Refuse a study whose records do not fit: the study's own record of this run (by name) trained with another
    config than the design gives today, or a record of another corpus than this machine builds for the recipe."""
    if found is None:
        own = design.results / "runs" / rc.run_id / "run.json"
        if own.is_file():
            stored = json.loads(own.read_text(encoding="utf-8"))["config"]
            differ = _diff(json.loads(rc.model_dump_json()), stored)
            raise ConfigError(
                f"study {design.name}: the record {own.parent} does not match the study's design as this code reads "
                f"{design.experiment} at size {design.size}: {'; '.join(differ[:4]) or 'it is unfinished'}; a gap against it would not be "
                "in the study's design (give the settings it was trained with by --set, or another --study)"
            )
        return
    stored = json.loads((found / "run.json").read_text(encoding="utf-8")).get("corpus", {}).get("dir")
    if stored != corpus_key:
        raise ConfigError(
            f"study {design.name}: {found} was trained on corpus {stored}, and recipe {rc.data.recipe!r} builds corpus {corpus_key} "
            "here: the data differ, so a gap against these records would compare models trained on different text"
        )
