"""Run a declarative experiment end to end: build the corpus if needed, train every run (finished
runs are skipped, interrupted ones resume), evaluate each on the test split, write the report."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from .config import ExperimentConfig, RunConfig, load_experiment
from .config_base import ConfigError


def run_dirs(exp: ExperimentConfig) -> dict[str, Path]:
    return {rc.run_id: exp.output_dir() / rc.run_id for rc in exp.resolve()}


def prepare_corpus(runs: list[RunConfig], log=print):
    from .data import build_corpus, load_recipe

    recipes = {rc.data.recipe for rc in runs}
    if len(recipes) != 1:
        raise ConfigError(f"data.recipe: every run of an experiment must use the same corpus, got {sorted(recipes)}")
    recipe = load_recipe(recipes.pop())
    names = set(recipe.domains)
    for rc in runs:
        for field, doms in (("data.train_weights", rc.data.train_weights), ("data.eval_domains", rc.data.eval_domains or [])):
            bad = [d for d in doms if d not in names]
            if bad:
                raise ConfigError(f"{rc.name}: {field}: unknown domain(s) {bad}; the recipe has: {', '.join(sorted(names))}")
    return build_corpus(recipe, log=log)


def suite_dir(run_dir: Path, spec: dict) -> Path:
    """Where a suite entry writes: the run directory, or ``suite_<name>/`` when the entry is named (two
    entries of the same suite, e.g. 0-shot and 5-shot lm-eval)."""
    return run_dir / f"suite_{spec['name']}" if "name" in spec else run_dir


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

    for spec in exp.suites:
        opts = {k: v for k, v in spec.items() if k not in ("suite", "name")}
        out = suite_dir(run_dir, spec)
        target = out / f"eval_{spec['suite']}.json"
        if _same_options(target, opts):
            continue
        log(f"[{rc.run_id}] suite {spec['suite']}{' (' + spec['name'] + ')' if 'name' in spec else ''}")
        from_scratch = spec["suite"] == "mqar" and opts.get("mode", "train") == "train"
        if from_scratch and "seed" in opts:
            # trains a fresh model from the mixer config: with a fixed seed every seed of this run gives the
            # same result, so compute it once per architecture and reuse it
            first = suite_dir(run_dir.parent / f"{rc.name}-s{exp.seeds[0]}", spec) / target.name
            if first != target and _same_options(first, opts):
                out.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(first, target)
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
    exp = load_experiment(path, overrides)
    runs = exp.resolve()
    corpus = prepare_corpus(runs, log=log)
    out = exp.output_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.json").write_text(json.dumps(json.loads(exp.model_dump_json()), indent=1))
    for i, rc in enumerate(runs, 1):
        log(f"== run {i}/{len(runs)}: {rc.run_id}")
        rd = out / rc.run_id
        train(rc, rd, corpus=corpus, log=log)
        if not (rd / "eval.json").exists():
            evaluate_run(rd, corpus=corpus, log=log)
        run_suites(exp, rc, rd, log=log)
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
