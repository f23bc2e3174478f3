"""Run a declarative experiment end to end: build the corpus if needed, tune (a tune experiment: each run's
values chosen on tuning seeds, basecap.sweep), train every run (finished runs are skipped, interrupted ones
resume), evaluate each on the test split, write the report."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .config import ExperimentConfig, RunConfig, load_experiment
from .config_base import ConfigError
from .atomic import atomic_write, write_json
from .rundir import RunDir


def run_dirs(exp: ExperimentConfig) -> dict[str, Path]:
    return {rc.run_id: exp.output_dir() / rc.run_id for rc in exp.run_configs()}


def suite_options(spec: dict) -> dict:
    """A ``[[suites]]`` entry's options: everything but ``suite`` and ``name``."""
    return {k: v for k, v in spec.items() if k not in ("suite", "name")}


def resolve_experiment(path: str | Path, overrides: list[str] | None = None) -> tuple[ExperimentConfig, list[RunConfig]]:
    """An experiment file read, validated and resolved: its suites' options checked and every run
    parameter-matched, all before any compute. For a tune experiment the runs are its tuning runs
    (``compared_runs`` turns them into the comparison)."""
    from .eval.suites import check_suite_options
    from .compile import check_compile
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
        check_compile(rc)  # train.compile with a mixer that does not compile fails here, not at its first step
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
            check_domains(
                {
                    "data.train_weights": rc.data.train_weights,
                    "data.eval_domains": rc.data.eval_domains or [],
                    "train.cooldown_level_domains": rc.train.cooldown_level_domains,
                },
                list(recipe.domains),
                source="recipe",
            )
        except ConfigError as e:
            raise ConfigError(f"{rc.name}: {e}") from None
    return build_corpus(recipe, log=log)


def selected_names(names: list[str], only: list[str] | None) -> list[str]:
    """The names in ``only``: a run's name, or the [[runs]] name a sweep point carries before ``@``."""
    if not only:
        return names
    known = set(names) | {n.split("@")[0] for n in names}
    bad = [o for o in only if o not in known]
    if bad:
        raise ConfigError(f"--run: unknown run(s) {bad}; the experiment has: {', '.join(sorted(known))}")
    return [n for n in names if n in only or n.split("@")[0] in only]


def tuning_points(exp: ExperimentConfig) -> list[str]:
    """A tune experiment's tuning run names (``<run>@<key>=<value>``), each of which --run may name alone."""
    return [name for pts in exp.tuning_grid().values() for _, name in pts]


def check_selection(exp: ExperimentConfig, runs: list[RunConfig], only: list[str] | None):
    """Unknown names in ``only`` (--run) fail before any compute; a tune experiment knows its tuned run names
    and its tuning runs (one point of the grid, so that several processes can share a run's tuning)."""
    selected_names(list(exp.tuning_grid()) + tuning_points(exp) if exp.tune else [r.name for r in runs], only)


def select_runs(runs: list[RunConfig], only: list[str] | None) -> list[RunConfig]:
    keep = set(selected_names(list(dict.fromkeys(r.name for r in runs)), only))
    return [r for r in runs if r.name in keep]


def compared_runs(exp: ExperimentConfig, runs: list[RunConfig], train_fn, only: list[str] | None = None, log=print) -> list[RunConfig]:
    """The runs to compare, of those named in ``only``. A tune experiment's ``runs`` are its tuning runs:
    they are trained first (``train_fn(rc, run_dir)``; tuning.json written by the main rank), then the
    comparison runs are resolved at each run's chosen values."""
    if exp.tune is None:
        return select_runs(runs, only)
    from .sweep import check_trained_at_choice, tune

    out = exp.output_dir()
    known = set(tuning_points(exp))
    points = [n for n in only or [] if n in known]
    for rc in runs:  # tuning runs named alone: trained, nothing chosen (the call naming the run chooses)
        if rc.name in points:
            log(f"== tuning run {rc.run_id} (chosen later, by a call that names {rc.name.split('@')[0]})")
            train_fn(rc, out / rc.run_id)
    if points and len(points) == len(only or []):
        return []
    names = selected_names(list(exp.tuning_grid()), [n for n in only or [] if n not in points] or None)
    chosen = tune(exp, runs, out, train_fn, only=names, log=log, write=int(os.environ.get("RANK", "0")) == 0)
    compared = exp.resolve(exp.comparison_configs(chosen))
    check_trained_at_choice(out, compared, exp.tune.keys)
    return compared


def report_reference(exp: ExperimentConfig, runs: list[RunConfig]) -> str | list[str] | None:
    """The report's reference run: the one named, else (a sweep) the first point of the named run; with
    ``more_references``, the list of every reference, the first one first."""
    names = [r.name for r in runs]

    def one(ref: str) -> str:
        return ref if ref in names else next((n for n in names if n.split("@")[0] == ref), ref)

    if exp.reference is None:
        return None
    if exp.more_references:
        return [one(r) for r in [exp.reference, *exp.more_references]]
    return one(exp.reference)


def _reuse_then(train_fn, reuse: list[Path] | None, log):
    """``train_fn`` that first copies a finished identical run from the ``reuse`` folders (basecap.reuse)."""
    if not reuse:
        return train_fn
    from .reuse import reuse_run

    for d in reuse:
        if not Path(d).is_dir():
            raise ConfigError(f"--reuse {d}: no such folder (give a study's output folder, e.g. runs/architectures-small)")

    def fn(rc, run_dir):
        if int(os.environ.get("RANK", "0")) == 0:
            reuse_run(json.loads(rc.model_dump_json()), rc.run_id, Path(run_dir), list(reuse), log=log)
        return train_fn(rc, run_dir)

    return fn


def _silent(*_) -> None:
    """The log of a rank other than 0."""


def train_experiment(
    path: str | Path, overrides: list[str] | None = None, only: list[str] | None = None, log=print, reuse: list[Path] | None = None
) -> list[tuple[RunConfig, dict]]:
    """``basecap train``: train the runs of an experiment (or those in ``only``) without evaluating or
    reporting; a tune experiment tunes first, exactly as ``run_experiment`` does. Under torchrun only rank 0
    logs. Returns (run, final evaluation record) per compared run."""
    import torch

    from .distributed import rank0_first
    from .train import train

    exp, runs = resolve_experiment(path, overrides)
    check_selection(exp, runs, only)
    if int(os.environ.get("RANK", "0")) != 0:
        log = _silent
    device_type = "cuda" if torch.cuda.is_available() and runs[0].train.device != "cpu" else "cpu"
    corpus = rank0_first(lambda: prepare_corpus(runs, log=log), device_type, runs[0].train.dist_timeout_s)

    train_fn = _reuse_then(lambda rc, run_dir: train(rc, run_dir, corpus=corpus, log=log), reuse, log)
    return [(rc, train_fn(rc, exp.output_dir() / rc.run_id)) for rc in compared_runs(exp, runs, train_fn, only, log=log)]


def speed_spec(mixer) -> str:
    """The bench's ``NAME[:key=value,...]`` for a run's mixer: its switches that differ from the defaults
    (a sliding window is benchmarked as itself, not as full attention)."""
    over = mixer.model_dump(exclude_defaults=True, exclude={"name", "impl"})
    return mixer.name + (":" + ",".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(over.items())) if over else "")


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


def run_experiment(
    path: str | Path, overrides: list[str] | None = None, log=print, only: list[str] | None = None, reuse: list[Path] | None = None
) -> Path | None:
    """Returns the path of the report (report.md). With ``only`` (run names, as ``basecap train --run``), the
    part of a study that one process can take while others take the rest: those runs are tuned, trained,
    evaluated and given their suites, and no speed section or report is written (None is returned); a later
    run without ``only`` finds them finished and writes the report."""
    from .eval.final import evaluate_run
    from .report import report
    from .sweep import TUNING_FILE
    from .train import train

    t0 = time.perf_counter()
    exp, runs = resolve_experiment(path, overrides)
    check_selection(exp, runs, only)
    corpus = prepare_corpus(runs, log=log)
    out = exp.output_dir()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "experiment.json", json.loads(exp.model_dump_json()))
    train_fn = _reuse_then(lambda rc, run_dir: train(rc, run_dir, corpus=corpus, log=log), reuse, log)
    runs = compared_runs(exp, runs, train_fn, only, log=log)
    for i, rc in enumerate(runs, 1):
        log(f"== run {i}/{len(runs)}: {rc.run_id}")
        rd = RunDir(out / rc.run_id)
        train_fn(rc, rd.path)
        if not rd.eval_path.exists():
            evaluate_run(rd.path, corpus=corpus, log=log)
        run_suites(exp, rc, rd.path, log=log)
    if only:
        what = f"{len(runs)} run(s) of {', '.join(only)}" if runs else f"tuning run(s) {', '.join(only)}"
        log(f"\nexperiment {exp.name}: {what} done in {time.perf_counter() - t0:.0f} s; run it without --run for the speed section and the report")
        return None
    speed_json = None
    if exp.speed is not None:
        speed_json = out / "speed" / "mixers.json"
        names = sorted({speed_spec(rc.model.mixer) for rc in runs})
        grid = {"mixers": names, "lengths": exp.speed.lengths, "contexts": exp.speed.contexts, "reps": exp.speed.reps}
        if _stored(speed_json, lambda d: {k: d.get("meta", {}).get("grid", {}).get(k) for k in grid}) != grid:
            from .bench.mixers import main as bench_mixers

            log(f"== speed: {', '.join(names)}")
            bench_mixers(
                [
                    "--mixers",
                    *names,
                    "--lengths",
                    *map(str, exp.speed.lengths),
                    "--contexts",
                    *map(str, exp.speed.contexts),
                    "--reps",
                    str(exp.speed.reps),
                    "--out",
                    str(speed_json.parent),
                ]
            )
    tuning_json = out / TUNING_FILE if exp.tune is not None else None
    rep = report(
        [out / rc.run_id for rc in runs], out / "report", reference=report_reference(exp, runs), speed_json=speed_json, tuning_json=tuning_json
    )
    log((rep.read_text().split("## Figures")[0]).rstrip())
    log(f"\nexperiment {exp.name}: {len(runs)} run(s) in {time.perf_counter() - t0:.0f} s")
    log(f"report: {rep.parent / 'report.html'} (and report.md)")
    return rep
