"""``basecap compare``: a new architecture's verdict in one command (docs/compare.md).

Given a mixer (a registered name, or a Python file that registers one with ``basecap.mixers.register_mixer``) and a
published study (``results/<study>``), it trains only the new architecture's runs in the study's design: its learning
rate tuned over the study's grid on the tuning seed, then the study's seeds in the order of its plan of looks, at
the tuned rate and at the reference's rate (rate arm A); the reference's runs (Transformer++ at its rate, and at the
tuned rate where the study trained it: arm B) are the study's published records, copied (``basecap.reuse``), never
trained. It writes a published-style study of its own (``results/compare-<arch>-<study>``: the runs' records, the
report, summary.json) and the row (``compare.json``): the gap at matched in-domain loss in each arm with its interval
and verdict (``compare.row``), MQAR, state size, speed and cost (``compare.measure``). A study whose records do not
match its design or this machine's corpus is refused before anything trains (``compare.study``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import write_json
from ..config_base import ConfigError, check_name
from ..rundir import git_state
from . import measure
from .row import ArmReading, CompareRow, arm_reading, overall, robustness, row_text, spec_readings
from .study import Design, as_recorded, check_record, find_design, locate, look_seeds, rate_label, with_runs

if TYPE_CHECKING:
    from ..config import ExperimentConfig, RunConfig
    from ..scorecard.compute import Study

__all__ = ["CompareRequest", "compare", "load_mixer_files", "row_text"]


_FILE_MIXERS: dict[str, list[str]] = {}  # module name of an imported mixer file -> the names it registered


def load_mixer_files(paths: list[str | Path]) -> list[str]:
    """Import each Python file (once per process; it registers its mixer with ``register_mixer``) and return the
    names the files registered."""
    from ..mixers import mixer_names

    names: list[str] = []
    for p in map(Path, paths):
        if not p.is_file() or p.suffix != ".py":
            raise ConfigError(f"--mixer-file {p}: not a Python file")
        modname = "basecap_mixer_file_" + hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:12]
        if modname not in _FILE_MIXERS:
            before = set(mixer_names())
            spec = importlib.util.spec_from_file_location(modname, p)
            assert spec is not None and spec.loader is not None  # a .py file that exists
            module = importlib.util.module_from_spec(spec)
            sys.modules[modname] = module
            try:
                spec.loader.exec_module(module)
            except Exception:
                del sys.modules[modname]
                raise
            _FILE_MIXERS[modname] = sorted(set(mixer_names()) - before)
        names += [n for n in _FILE_MIXERS[modname] if n not in names]
    return names


def _mixer(spec: str | None, registered: list[str]) -> dict:
    """``NAME`` or ``NAME:key=value,...`` (values read as JSON, else strings) as a mixer config table; without a spec,
    the one mixer the files registered."""
    from ..mixers import parse_mixer_config

    if spec is None:
        if len(registered) != 1:
            raise ConfigError(f"compare: name the mixer (the files registered {registered or 'none'})")
        spec = registered[0]
    name, _, rest = spec.partition(":")
    table: dict = {"name": name}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"mixer {spec!r}: expected key=value after ':', got {item!r}")
        try:
            table[key] = json.loads(value)
        except ValueError:
            table[key] = value
    parse_mixer_config(table, "mixer")  # an unknown name or switch fails here, before any compute
    return table


def _file_info(paths: list[str | Path]) -> list[dict]:
    return [{"path": str(p), "sha256": hashlib.sha256(Path(p).read_bytes()).hexdigest()} for p in paths]


def _train_runs(exp: ExperimentConfig, setup: _Setup, log) -> list[str | Path]:
    """Every run of ``exp`` at the setup's seeds (look by look): the reference's copied from its located record (a
    seed without one is left out, and said), the new architecture's copied where an identical run exists, else
    trained; each evaluated on the test split. Returns the run folders that exist."""
    from ..eval.final import evaluate_run
    from ..reuse import reuse_run
    from ..train import train

    work, corpus, located = setup.work, setup.corpus, setup.located
    configs = exp.resolve()
    done: list[str | Path] = []
    for k, group in enumerate(setup.groups, 1):
        log(f"== look {k} of {len(setup.groups)}: seeds {', '.join(map(str, group))}")
        for rc in (rc for rc in configs if rc.seed in group):
            run_dir = work / rc.run_id
            config = json.loads(rc.model_dump_json())
            if rc.run_id in located:
                found = located[rc.run_id]
                if found is None:
                    log(f"[{rc.run_id}] no published record of this reference run: seed {rc.seed} is not paired with it")
                    continue
                reuse_run(as_recorded(config, found), rc.run_id, run_dir, [found.parent], log=log)
            elif not reuse_run(config, rc.run_id, run_dir, [work, *setup.sources], log=log):
                train(rc, run_dir, corpus=corpus, log=log)
            if not (run_dir / "eval.json").exists():
                evaluate_run(run_dir, corpus=corpus, log=log)
            done.append(run_dir)
    return done


def _find_reference(design: Design, rc, sources: list[Path], log) -> Path | None:
    """The published record of a reference run: in the study's folders first, else in another published study beside
    it that holds a run of the same config (the study file's own --reuse sources)."""
    found = locate(rc, sources)
    if found is None:
        want = (rc.seed, rc.train.steps, rc.train.lr, rc.model.mixer.name)
        folders = []
        for info in sorted(design.results.parent.glob("*/runs/*/run.json")):
            try:
                c = json.loads(info.read_text(encoding="utf-8"))["config"]
                have = (c["seed"], c["train"]["steps"], c["train"]["lr"], c["model"]["mixer"]["name"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if have == want and info.parent.parent not in folders and info.parent.parent not in sources:
                folders.append(info.parent.parent)
        found = locate(rc, folders)
        if found is not None:
            log(f"[{rc.run_id}] the study's record is published in {found.parent}")
    return found


def _check_references(design: Design, seeds: list[int], sources: list[Path], corpus_key: str, log) -> dict[str, Path | None]:
    """The published record of every reference run at ``seeds`` (run id -> folder, None where there is none), each
    checked against the design and this machine's corpus; a study whose reference has no record at all is refused.
    All before anything trains."""
    names = {design.reference, *design.rate_runs.values()}
    located: dict[str, Path | None] = {}
    for rc in design.exp.resolve([rc for rc in design.exp.run_configs() if rc.name in names and rc.seed in seeds]):
        located[rc.run_id] = _find_reference(design, rc, sources, log)
        check_record(design, rc, located[rc.run_id], corpus_key)
    if not any(located[f"{design.reference}-s{s}"] for s in seeds):
        raise ConfigError(
            f"study {design.name}: no published record of its reference {design.reference!r} matches its design at size {design.size} "
            f"(seeds {', '.join(map(str, seeds))}); compare joins the published runs of a study, it does not train the reference"
        )
    return located


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompareRequest:
    """What ``compare`` is asked for (``basecap compare``'s options). ``mixer``: ``NAME`` or ``NAME:key=value,...``
    (default: the one mixer ``mixer_files`` register); ``study``: the published study's results folder;
    ``mixer_files``: Python files that register mixers (imported first); ``name``: the architecture's run name (default:
    the mixer's); ``experiment`` / ``size`` / ``sets`` / ``claims``: the study's design where the claims file does not
    give it, and overrides of it; ``reuse``: more folders of published runs for the reference's records; ``lrs``: the
    tuning grid instead of the study's; ``until_look``: stop after that look of the study's plan; ``out`` / ``work``:
    the results and training folders; ``mqar_steps`` / ``mqar_seeds``: a shorter MQAR than the principle's (for a quick
    check); ``speed_lengths``: default 2048 and 16384 ([] skips the speed), ``speed_reps`` repeats each; ``compile``:
    the new architecture's runs train with ``train.compile`` (the reference's are the study's records, as they were
    trained: docs/performance.md, "Compile by default?")."""

    mixer: str | None = None
    study: str | Path
    mixer_files: list[str | Path] | None = None
    name: str | None = None
    experiment: str | Path | None = None
    size: str | None = None
    sets: list[str] | None = None
    reuse: list[str | Path] | None = None
    lrs: list[float] | None = None
    until_look: int | None = None
    out: str | Path | None = None
    work: str | Path | None = None
    claims: str | Path | None = None
    root: str | Path = "."
    mqar_steps: int | None = None
    mqar_seeds: list[int] | None = None
    speed_lengths: list[int] | None = None
    speed_reps: int = 3
    compile: bool = False


@dataclasses.dataclass(frozen=True)
class _Setup:
    """A request resolved against its study before anything trains: the mixer's table and run name, the study's
    design, the folders, the seeds look by look, the corpus, and the reference's located records."""

    request: CompareRequest
    root: Path
    table: dict
    label: str
    design: Design
    out: Path
    work: Path
    sources: list[Path]
    groups: list[list[int]]
    ref_configs: list[RunConfig]  # the reference's run at the first seed
    corpus: Any
    located: dict[str, Path | None]

    @property
    def first_seed(self) -> int:
        return self.groups[0][0]

    @property
    def arm_a(self) -> str:
        """The new architecture's run at the reference's rate (rate arm A)."""
        return f"{self.label}_lr{rate_label(self.design.rate)}"

    def arch(self, run: str, lr: float | None) -> dict:
        """A [[runs]] entry of the new architecture (at ``lr``, else the design's rate; compiled where asked)."""
        train = {**({"lr": lr} if lr is not None else {}), **({"compile": True} if self.request.compile else {})}
        return {"name": run, "model": {"mixer": self.table}, **({"train": train} if train else {})}


def _prepare(request: CompareRequest, log) -> _Setup:
    """The request resolved: the mixer files imported, the study's design found, its corpus prepared and every
    reference record it needs located and checked (a study that does not fit is refused here)."""
    from ..experiment import prepare_corpus

    root = Path(request.root)
    table = _mixer(request.mixer, load_mixer_files(request.mixer_files or []))
    label = check_name(request.name or table["name"], "--name", "run names")
    design = find_design(
        Path(request.study),
        experiment=Path(request.experiment) if request.experiment else None,
        size=request.size,
        sets=request.sets,
        claims_path=Path(request.claims) if request.claims else None,
        root=root,
        grid=request.lrs,
    )
    out = Path(request.out) if request.out else design.results.parent / f"compare-{label}-{design.name}"
    size = f"-{design.size}" if design.size else ""
    work = Path(request.work) if request.work else root / "runs" / (f"compare-{label}-{design.name}" + size)
    sources = [design.results / "runs", *(Path(d) for d in request.reuse or [])]
    groups = look_seeds(design, request.until_look)
    seeds = [s for g in groups for s in g]
    ref_configs = design.exp.resolve([rc for rc in design.exp.run_configs() if rc.name == design.reference and rc.seed == seeds[0]])
    corpus = prepare_corpus(ref_configs, log=log)
    located = _check_references(design, seeds, sources, corpus.name, log)
    return _Setup(request, root, table, label, design, out, work, sources, groups, ref_configs, corpus, located)


def _tuned_rate(setup: _Setup, log) -> tuple[float, dict | None]:
    """The new architecture's learning rate, tuned over the design's grid on its tuning seeds (a grid of one: that
    rate, untuned), and the tuning's record (None when untuned)."""
    from ..sweep import TUNING_FILE, tune
    from ..train import train

    design, work, label = setup.design, setup.work, setup.label
    if len(design.grid) <= 1:
        return design.grid[0], None
    tune_exp = with_runs(
        design.exp,
        [setup.arch(label, None)],
        sweep={"train.lr": design.grid},
        tune={"keys": ["train.lr"], "seeds": design.tuning_seeds},
        reference=None,
        more_references=[],
        out_dir=str(work),
        suites=[],
        speed=None,
    )
    tuned = tune(tune_exp, tune_exp.resolve(), work, lambda rc, d: train(rc, d, corpus=setup.corpus, log=log), log=log)
    lr = float(tuned[label]["train.lr"])
    return lr, json.loads((work / TUNING_FILE).read_text(encoding="utf-8"))["runs"][label]


def _comparison(setup: _Setup, lr: float, b_ref: str | None) -> ExperimentConfig:
    """The comparison's experiment: the reference (and its run at the tuned rate, arm B), the new architecture at
    the tuned rate and at the reference's (arm A)."""
    design = setup.design
    entries = [next(e for e in design.exp.runs if e["name"] == design.reference)]
    if b_ref is not None and b_ref != design.reference:
        entries.append(next(e for e in design.exp.runs if e["name"] == b_ref))
    entries += [setup.arch(setup.label, lr), setup.arch(setup.arm_a, design.rate)]
    name = f"compare-{setup.label}-{design.name}"
    return with_runs(design.exp, entries, name=name, out_dir=str(setup.work), suites=[], speed=None, more_references=[])


def _arms(setup: _Setup, st: Study, lr: float, b_ref: str | None) -> list[ArmReading]:
    """The gap in each arm: the tuned comparison, arm A (both at the reference's rate), arm B where the study has it."""
    design, label = setup.design, setup.label
    arms = [
        arm_reading(design, st, "tuned", label, design.reference, lr),
        arm_reading(design, st, "A", setup.arm_a, design.reference, design.rate),
    ]
    if b_ref is not None and b_ref != design.reference:
        arms.append(arm_reading(design, st, "B", label, b_ref, lr))
    for a in arms:
        if a["n"] >= 2:
            a["specs"] = spec_readings(design, st, a)
    return arms


def _reference_mixer(setup: _Setup) -> dict:
    mixer = setup.ref_configs[0].model.mixer
    return {"name": mixer.name, **mixer.model_dump(exclude_defaults=True)}


def _row(setup: _Setup, st: Study, model, *, lr: float, tuning: dict | None, b_ref: str | None, arms: list[ArmReading]) -> CompareRow:
    """The row before its measurements: the design, the tuned rate, the arms and the overall reading, the model's
    size, state and cost, and the code it ran."""
    design, label = setup.design, setup.label
    run_info = json.loads((setup.out / "runs" / f"{label}-s{setup.first_seed}" / "run.json").read_text(encoding="utf-8"))
    in_domain = next((r.get("in_domain_loss") for r in st.summary.get("runs", []) if r.get("name") == label), None)
    commit, dirty = git_state()
    state = measure.state(model)
    over = overall(arms, design.alpha)
    return {
        "architecture": label,
        "mixer": setup.table,
        "mixer_files": _file_info(setup.request.mixer_files or []),
        "study": design.name,
        "size": design.size,
        "experiment": str(design.experiment),
        "reference": design.reference,
        "reference_mixer": _reference_mixer(setup)["name"],
        "lr": lr,
        "grid": design.grid,
        "tuning": tuning,
        "reference_lr": design.rate,
        "compiled": setup.request.compile,
        "arm_b_note": (
            f"the study has no {design.reference} at lr {lr:g}"
            if b_ref is None
            else "the tuned rate is the reference's: arms A and B are the tuned comparison"
            if b_ref == design.reference
            else None
        ),
        "seeds": sorted({s for a in arms for s in a.get("seeds", [])}),
        "looks": [len(g) for g in setup.groups],
        "domains": design.domains,
        "margin": design.margin,
        "alpha": design.alpha,
        "arms": arms,
        "overall": over,
        "robustness": robustness(arms, over["verdict"]),
        "in_domain_loss": in_domain,
        "params": run_info.get("params"),
        "corpus": setup.corpus.name,
        "cost": measure.cost(model),
        "state_bytes": state["state_bytes"],
        "state_at": state["state_at"],
        "state_grows": state["state_grows"],
        "commit": commit,
        "dirty": dirty,
    }


def _measure(row: CompareRow, setup: _Setup, model, log) -> None:
    """The row's MQAR (the principle's protocol, or the request's shorter one) and speed against the reference's."""
    request = setup.request
    proto = measure.mqar_protocol(setup.root / measure.PRINCIPLE_FILE, request.mqar_steps, request.mqar_seeds)
    row["mqar"] = measure.mqar(model, proto, setup.out, log=log)
    row["mqar"]["shortened"] = request.mqar_steps is not None or request.mqar_seeds is not None
    lengths = [2048, 16384] if request.speed_lengths is None else list(request.speed_lengths)
    row["speed"] = measure.speed(setup.table, _reference_mixer(setup), lengths, setup.out, request.speed_reps, log=log) if lengths else {}


def trained_walls(out: Path) -> dict[str, Any]:
    """The runs a comparison trained (its tuning runs and its seeds; not the copies, whose run.json names where they
    came from) and their wall clock summed from their run.json, over every invocation that trained them."""
    runs = [json.loads(p.read_text()) for p in sorted([*(out / "runs").glob("*/run.json"), *(out / "tuning_runs").glob("*/run.json")])]
    own = [r for r in runs if not r.get("reused_from")]
    return {"runs": len(own), "seconds": round(sum((r.get("wall") or {}).get("seconds", 0.0) for r in own), 1)}


def compare(request: CompareRequest, *, log=print) -> CompareRow:
    """Train a new architecture's runs in a published study's design and return its row (also written to
    ``<out>/compare.json``); ``request`` says which architecture, which study and how (``CompareRequest``)."""
    from ..report import report
    from ..scorecard.compute import load_study
    from ..sweep import TUNING_FILE

    t0 = time.perf_counter()
    setup = _prepare(request, log)
    setup.work.mkdir(parents=True, exist_ok=True)
    lr, tuning = _tuned_rate(setup, log)
    design = setup.design
    b_ref = design.rate_runs.get(lr) if lr != design.rate else design.reference
    exp = _comparison(setup, lr, b_ref)
    write_json(setup.work / "experiment.json", json.loads(exp.model_dump_json()))
    dirs = _train_runs(exp, setup, log)
    tuning_json = setup.work / TUNING_FILE if tuning is not None else None
    report(dirs, setup.out, reference=design.reference, tuning_json=tuning_json, archive=True)
    st = load_study(setup.out)
    assert st is not None  # report() wrote summary.json
    arms = _arms(setup, st, lr, b_ref)
    model = next(rc for rc in exp.resolve([rc for rc in exp.run_configs() if rc.name == setup.label and rc.seed == setup.first_seed])).model
    row = _row(setup, st, model, lr=lr, tuning=tuning, b_ref=b_ref, arms=arms)
    _measure(row, setup, model, log)
    row["wall_seconds"] = round(time.perf_counter() - t0, 1)
    row["trained"] = trained_walls(setup.out)
    write_json(setup.out / "compare.json", row)
    log("\n" + row_text(row))
    log(f"\nwritten: {setup.out / 'compare.json'} (the row), {setup.out / 'report.md'} (the report), {setup.out / 'runs'} (the records)")
    return row
