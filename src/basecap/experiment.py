"""Run a declarative experiment end to end: build the corpus if needed, train every run (finished
runs are skipped, interrupted ones resume), evaluate each on the test split, write the report."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .config import ExperimentConfig, RunConfig, load_experiment
from .config_base import ConfigError
from .rundir import RunDir, atomic_write, write_json


def run_dirs(exp: ExperimentConfig) -> dict[str, Path]:
    return {rc.run_id: exp.output_dir() / rc.run_id for rc in exp.run_configs()}


def suite_options(spec: dict) -> dict:
    """A ``[[suites]]`` entry's options: everything but ``suite`` and ``name``."""
    return {k: v for k, v in spec.items() if k not in ("suite", "name")}


def resolve_experiment(path: str | Path, overrides: list[str] | None = None) -> tuple[ExperimentConfig, list[RunConfig]]:
    """An experiment file read, validated and resolved: its suites' options checked and every run
    parameter-matched, all before any compute."""
    from .eval.suites import check_suite_options
    from .tracking import check_loggers

    exp = load_experiment(path, overrides)
    for i, spec in enumerate(exp.suites):
        try:
            check_suite_options(spec["suite"], suite_options(spec))
        except ConfigError as e:
            raise ConfigError(f"suites[{i}]: {e}") from None
    runs = exp.resolve()
    for rc in runs:
        check_loggers(rc.train.loggers)  # a logger's missing package fails before any compute
    return exp, runs


def prepare_corpus(runs: list[RunConfig], log=print):
    """The experiment's one corpus, built (or found cached) after every run's domains are checked against
    its recipe."""
    from .data import build_corpus, load_recipe
    from .data.loader import check_domains

    recipes = {rc.data.recipe for rc in runs}
    if len(recipes) != 1:
        raise ConfigError(f"data.recipe: every run of an experiment must use the same corpus, got {sorted(recipes)}")
    recipe = load_recipe(recipes.pop())
    for rc in runs:
        try:
            check_domains({"data.train_weights": rc.data.train_weights, "data.eval_domains": rc.data.eval_domains or []},
                          list(recipe.domains), source="recipe")
        except ConfigError as e:
            raise ConfigError(f"{rc.name}: {e}") from None
    return build_corpus(recipe, log=log)


def speed_spec(mixer) -> str:
    """The bench's ``NAME[:key=value,...]`` for a run's mixer: its switches that differ from the defaults
    (a sliding window is benchmarked as itself, not as full attention)."""
    over = mixer.model_dump(exclude_defaults=True, exclude={"name", "impl"})
    return mixer.name + (":" + ",".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                                        for k, v in sorted(over.items())) if over else "")


def _stored(result: Path, pick):
    """``pick(json)`` of a stored result file, or None when it is missing or unreadable."""
    try:
        return pick(json.loads(result.read_text()))
    except (OSError, ValueError):
        return None


def _same_options(result: Path, opts: dict) -> bool:
    """Whether a stored suite result was computed with these options (a changed experiment file recomputes it)."""
    return _stored(result, lambda d: d.get("options")) == json.loads(json.dumps(opts))


def run_suites(exp: ExperimentConfig, rc: RunConfig, run_dir: Path, log=print):
    from .eval.suites import run_suite

    rd = RunDir(run_dir)
    for spec in exp.suites:
        opts = suite_options(spec)
        out, target = rd.suite_dir(spec.get("name")), rd.suite_result(spec["suite"], spec.get("name"))
        if _same_options(target, opts):
            continue
        log(f"[{rc.run_id}] suite {spec['suite']}{' (' + spec['name'] + ')' if 'name' in spec else ''}")
        from_scratch = spec["suite"] == "mqar" and opts.get("mode", "train") == "train"
        if from_scratch and "seed" in opts:
            # trains a fresh model from the mixer config: with a fixed seed every seed of this run gives the
            # same result, so compute it once per architecture and reuse it
            first = RunDir(rd.path.parent / f"{rc.name}-s{exp.seeds[0]}").suite_result(spec["suite"], spec.get("name"))
            if first != target and _same_options(first, opts):
                out.mkdir(parents=True, exist_ok=True)
                atomic_write(target, first.read_bytes())
                continue
        elif from_scratch:
            opts["seed"] = rc.seed  # vary the from-scratch training with the run's seed: a spread over seeds
        run_suite(run_dir, spec["suite"], out_dir=out, **opts)


def run_experiment(path: str | Path, overrides: list[str] | None = None, log=print) -> Path:
    """Returns the path of the report (report.md)."""
    from .eval.final import evaluate_run
    from .report import report
    from .train import train

    t0 = time.perf_counter()
    exp, runs = resolve_experiment(path, overrides)
    corpus = prepare_corpus(runs, log=log)
    out = exp.output_dir()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "experiment.json", json.loads(exp.model_dump_json()))
    for i, rc in enumerate(runs, 1):
        log(f"== run {i}/{len(runs)}: {rc.run_id}")
        rd = RunDir(out / rc.run_id)
        train(rc, rd.path, corpus=corpus, log=log)
        if not rd.eval_path.exists():
            evaluate_run(rd.path, corpus=corpus, log=log)
        run_suites(exp, rc, rd.path, log=log)
    speed_json = None
    if exp.speed is not None:
        speed_json = out / "speed" / "mixers.json"
        names = sorted({speed_spec(rc.model.mixer) for rc in runs})
        grid = {"mixers": names, "lengths": exp.speed.lengths, "contexts": exp.speed.contexts, "reps": exp.speed.reps}
        if _stored(speed_json, lambda d: {k: d.get("meta", {}).get("grid", {}).get(k) for k in grid}) != grid:
            from .bench.mixers import main as bench_mixers

            log(f"== speed: {', '.join(names)}")
            bench_mixers(["--mixers", *names, "--lengths", *map(str, exp.speed.lengths), "--contexts", *map(str, exp.speed.contexts),
                          "--reps", str(exp.speed.reps), "--out", str(speed_json.parent)])
    rep = report([out / rc.run_id for rc in runs], out / "report", reference=exp.reference, speed_json=speed_json)
    log((rep.read_text().split("## Figures")[0]).rstrip())
    log(f"\nexperiment {exp.name}: {len(runs)} run(s) in {time.perf_counter() - t0:.0f} s")
    log(f"report: {rep.parent / 'report.html'} (and report.md)")
    return rep
