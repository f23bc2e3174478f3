"""``experiments/paper/claims.toml``: the paper's claims as data, read and validated like every config.

Unknown keys, an unknown study, a run that is not in the study's experiment file, a claim whose design lacks a
field (a trend without its x values, an interaction without its control) are errors naming the claim.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import ValidationError, field_validator, model_validator

from ..config_base import ConfigError, Strict, format_validation_error, valid_name

CLAIMS_FILE = Path("experiments/paper/claims.toml")
EXPECT = ("worse", "better", "no_effect", "small", "trend", "interaction")
# What a claim's statistic is (docs/metrics.md, "Scores that are not losses"): the OOD loss gap at matched in-domain
# loss (lower is better), a speed ratio tested on the log scale, or an accuracy / retrieval score in points (higher
# is better for both)
METRICS = ("ood_gap", "speed_ratio", "accuracy")
HIGHER_IS_BETTER = ("speed_ratio", "accuracy")
DIRECTIONS = {"trend": ("falls", "rises"), "interaction": ("larger", "smaller")}
# "primary": the study's primary gap (its design's, when it has one); a design's other measures by name (docs/metrics.md)
MEASURES = ("primary", "legacy", "evals_all", "evals_seen", "annealed_all", "annealed_seen")


class Study(Strict):
    experiment: str  # a file of experiments/paper/
    size: str
    results: str | None = None  # folder under results/ (default: the study's name)
    label: str | None = None
    superseded_by: str | None = None  # a study that answers the same claims with the comparison design: once it is
    # published (with the claim's runs), the claim is computed from it, this one beside
    superseding_runs: dict[str, str] = {}  # run names in the superseding study; when given, only claims whose every
    # run it maps move there (a control whose other runs have no counterpart stays)
    looks: list[int] = []  # seeds planned in advance: the seed counts at which the study is read, declared before
    # its first look (a group-sequential plan; docs/metrics.md, "Seeds planned in advance")
    spending: Literal["obrien_fleming", "pocock"] = "obrien_fleming"  # the plan's alpha-spending function
    looks_taken: list[int] = []  # looks that were taken without a plan (seed counts before the final one), recorded
    # after the fact: the study's claims are read by Bonferroni over its looks
    looks_reason: str | None = None  # where the undeclared looks are recorded

    @model_validator(mode="after")
    def _looks(self) -> Study:
        for key in ("looks", "looks_taken"):
            v = getattr(self, key)
            if any(n < 2 for n in v) or v != sorted(set(v)):
                raise ValueError(f"{key}: increasing seed counts of at least 2, got {v}")
        if self.looks and self.looks_taken:
            raise ValueError("a study has a declared plan (looks) or undeclared looks (looks_taken), not both")
        if self.looks_taken and not self.looks_reason:
            raise ValueError("looks_taken: say where the looks are recorded (looks_reason)")
        return self

    @field_validator("results")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return v if v is None else valid_name(v, "results folders")


class Arm(Strict):
    """Another specification of a claim's comparison that its verdict must survive (an intersection-union test):
    the same statistic from other runs, e.g. the two at one shared learning rate."""

    label: str  # e.g. "A: both at 2e-3"
    study: str
    run: str
    reference: str


class ScoreSource(Strict):
    """Where an accuracy claim reads a run's score: a key of one of its suite results (``eval_<suite>.json`` in the
    run's archived records, ``suite_<name>/`` for a named suite entry), a fraction in [0, 1]."""

    suite: str  # e.g. "niah", "lm-eval"
    name: str | None = None  # a named suite entry (two entries of one suite)
    key: str  # a dotted path into the result, e.g. "accuracy_by_length.8192" or "summary.arc_easy.acc"


class Claim(Strict):
    id: str
    section: str
    paper: str  # the paper's words
    study: str | None = None
    expect: Literal["worse", "better", "no_effect", "small", "trend", "interaction"] | None = None
    # small: a small harm, 0 < gap < margin (an interval claim: both bounds must be shown)
    direction: str | None = None  # trend: falls | rises; interaction: larger | smaller
    run: str | None = None
    reference: str | None = None
    control_run: str | None = None  # interaction: the control setting's run and reference
    control_reference: str | None = None
    x: dict[str, float] | None = None  # trend: each run's value (slope on log2 x)
    domains: list[str] | None = None
    seeds: list[int] | None = None  # only these seeds (default: every seed both runs have)
    measure: Literal["primary", "legacy", "evals_all", "evals_seen", "annealed_all", "annealed_seen"] = "primary"
    arms: list[Arm] = []  # the rate arms (or other specifications) the verdict must also hold in
    # controls: the same comparison in another study (e.g. another tokenizer), read as specifications of the
    # verdict (its robustness), not as part of its test
    controls: list[Arm] = []
    gpu: str | None = None  # needs the paper's GPU scale: what would have to run
    untestable: str | None = None  # no study can test it: why
    metric: Literal["ood_gap", "speed_ratio", "accuracy"] = "ood_gap"  # what the statistic is (METRICS)
    margin: float | None = None  # a claim whose metric is not the loss gap states its own margin: a speed ratio's
    # as a ratio above 1 (2 = "at least 2x", 1.1 = "within 10%"; tested as its log), an accuracy's in points (0-100)
    at: dict[str, int | float | str] = {}  # speed_ratio: which benchmark record, e.g. { phase = "train", length =
    # 65536, threads = 1 } (docs/metrics.md, "Scores that are not losses": the schema of speed.json)
    records: str | None = None  # speed_ratio: the benchmark's file in the study's results folder (default speed.json)
    bench_names: dict[str, str] = {}  # speed_ratio: the benchmark's name of a run where it differs (its variant)
    looks_taken: list[int] = []  # speed_ratio: earlier benchmark files read before ``records`` (their repeats, both
    # sides together): the claim is read by Bonferroni over them and this one, as a study's undeclared looks are
    looks_reason: str | None = None  # where those looks are recorded
    score: list[ScoreSource] = []  # accuracy: the run's score, the mean of these suite results' values
    analogue_of: str | None = None  # a CPU analogue of a claim at the paper's GPU scale: that claim's id

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        return valid_name(v, "claim ids")

    @model_validator(mode="after")
    def _design(self) -> Claim:
        if self.untestable is not None:
            extra = [k for k in ("study", "expect", "run", "reference", "x", "gpu") if getattr(self, k) is not None]
            if extra:
                raise ValueError(f"an untestable claim names no {', '.join(extra)}")
            return self
        for k in ("study", "expect", "reference"):
            if getattr(self, k) is None:
                raise ValueError(f"{k} is required")
        sign_of = DIRECTIONS.get(self.expect) if self.expect is not None else None
        if sign_of and self.direction not in sign_of:
            raise ValueError(f"direction: a {self.expect} claim needs one of {', '.join(sign_of)}, got {self.direction!r}")
        if not sign_of and self.direction is not None:
            raise ValueError(f"direction: only trend and interaction claims have one (this one expects {self.expect})")
        if self.expect == "trend":
            if not self.x or len(self.x) < 3 or self.run is not None:
                raise ValueError("a trend names its runs in x (at least 3, with x values), not run")
            if any(not (math.isfinite(v) and v > 0) for v in self.x.values()):
                raise ValueError("x: values must be positive (the slope is on log2 x)")
            if self.reference not in self.x:
                raise ValueError("x: the reference is one of the trend's runs (its gap is 0 by definition)")
        elif self.run is None:
            raise ValueError("run is required")
        elif self.x is not None:
            raise ValueError("x: only a trend has x values")
        has_control = self.control_run is not None or self.control_reference is not None
        if (self.expect == "interaction") != has_control or (has_control and None in (self.control_run, self.control_reference)):
            raise ValueError("an interaction, and only an interaction, names control_run and control_reference")
        self._check_metric()
        return self

    def _check_metric(self) -> None:
        """A claim whose statistic is not the loss gap: a run against a reference, its own margin in the metric's
        unit, and where its records are read; a loss claim has none of these (its margin is the file's)."""
        if self.metric == "ood_gap":
            extra = [k for k in ("margin", "at", "score", "records", "bench_names", "looks_taken") if getattr(self, k)]
            if extra:
                raise ValueError(
                    f"{', '.join(extra)}: only a claim whose metric is not the OOD loss gap has its own (this one's margin is the file's)"
                )
            return
        if self.expect not in ("worse", "better", "no_effect"):
            raise ValueError(f"expect: a {self.metric} claim is worse, better or no_effect, got {self.expect!r}")
        if self.arms or self.controls or self.measure != "primary" or self.domains is not None:
            raise ValueError(f"a {self.metric} claim has no arms, measure or domains (those are the loss gap's)")
        if self.margin is None or not math.isfinite(self.margin):
            raise ValueError(f"margin: a {self.metric} claim states its own margin")
        if self.metric == "speed_ratio":
            if not 1 < self.margin <= 100:
                raise ValueError(f"margin: a speed ratio's margin is a ratio above 1 (2 = at least 2x, 1.1 = within 10%), got {self.margin:g}")
            if not self.at or self.score:
                raise ValueError("at: a speed_ratio claim names its benchmark record (e.g. phase, length, threads), and no score")
            if set(self.bench_names) - {self.run, self.reference}:
                raise ValueError(f"bench_names: names the benchmark's variant of the run or the reference, got {sorted(self.bench_names)}")
            if self.records is not None and (Path(self.records).name != self.records or not self.records.endswith(".json")):
                raise ValueError(f"records: a JSON file name in the study's results folder, got {self.records!r}")
            if any(n < 2 for n in self.looks_taken) or (self.looks_taken and not self.looks_reason):
                raise ValueError("looks_taken: the repeats (at least 2) of each earlier look, with looks_reason saying where they are recorded")
        elif self.metric == "accuracy":
            if not 0 < self.margin < 100:
                raise ValueError(f"margin: an accuracy's margin is in points, in (0, 100), got {self.margin:g}")
            if not self.score or self.at or self.records is not None or self.bench_names or self.looks_taken:
                raise ValueError(
                    "score: an accuracy claim names the suite results its score is read from, and no at, records, bench_names or looks_taken"
                )

    @property
    def higher_is_better(self) -> bool:
        return self.metric in HIGHER_IS_BETTER

    @property
    def sign(self) -> int:
        """+1 when the paper expects the statistic to be positive (worse, rises, larger), -1 when negative, 0 for
        no effect; for a metric where higher is better (a speed ratio, an accuracy) 'worse' is negative."""
        s = {"worse": 1, "small": 1, "rises": 1, "larger": 1, "better": -1, "falls": -1, "smaller": -1}.get(self.direction or self.expect or "", 0)
        return -s if self.higher_is_better else s

    @property
    def runs(self) -> list[str]:
        """Every run name the claim needs."""
        names = list(self.x) if self.x else [self.run, self.reference]
        return [n for n in [*names, self.control_run, self.control_reference] if n is not None]


class ScaleStep(Strict):
    """A claim measured again at another size, outside the family: its gap with an uncorrected interval beside the
    claim's own, and the difference of the two (Welch: the sizes' runs are independent)."""

    claim: str  # a claim's id; the step compares the runs that answer it (their names after any superseding study)
    study: str  # a [studies.*] entry at the other size, whose experiment file has those runs
    why: str  # what the step tests, in one line
    run: str | None = None  # the runs compared at both sizes, where they are not the claim's (a ladder at one shared
    reference: str | None = None  # rate: run and reference named for that rate)
    family: str | None = None  # the family the step speaks for, in results/SCALING.md (e.g. "RWKV (RWKV-7)")
    base: str | None = None  # a [studies.*] entry at the smaller size that gives the gap the step is set against
    # (with run and reference); default: the claim's own row in the family

    @model_validator(mode="after")
    def _runs(self) -> ScaleStep:
        if (self.run is None) != (self.reference is None):
            raise ValueError(f"scale step of {self.claim}: give run and reference together, or neither")
        return self


class ClaimsFile(Strict):
    margin: float
    margin_reason: str
    alpha: float = 0.05
    power: float = 0.8
    domains: list[str]
    studies: dict[str, Study]
    claims: list[Claim]
    scale_steps: list[ScaleStep] = []

    @model_validator(mode="after")
    def _check(self) -> ClaimsFile:
        if not 0 < self.margin < 1 or not 0 < self.alpha < 0.5 or not 0.5 <= self.power < 1:
            raise ValueError("margin in (0, 1) nats, alpha in (0, 0.5), power in [0.5, 1)")
        seen = set()
        for i, c in enumerate(self.claims):
            if c.id in seen:
                raise ValueError(f"claims[{i}]: id {c.id!r} is used twice")
            seen.add(c.id)
            if c.study is not None and c.study not in self.studies:
                raise ValueError(f"claims[{i}] ({c.id}): unknown study {c.study!r}; studies: {', '.join(self.studies)}")
            if c.analogue_of is not None:
                target = next((x for x in self.claims if x.id == c.analogue_of), None)
                if target is None or target.gpu is None or c.gpu is not None:
                    raise ValueError(
                        f"claims[{i}] ({c.id}): analogue_of: a CPU analogue (no gpu) of a claim at the paper's GPU scale, got {c.analogue_of!r}"
                    )
            for kind, a in [*(("arm", a) for a in c.arms), *(("control", a) for a in c.controls)]:
                if a.study not in self.studies:
                    raise ValueError(f"claims[{i}] ({c.id}): {kind} {a.label!r}: unknown study {a.study!r}")
                if c.expect in ("trend", "interaction"):
                    raise ValueError(f"claims[{i}] ({c.id}): {kind}s are for pair claims (a run against a reference)")
        in_family = {c.study for c in self.claims} | {self.studies[c.study].superseded_by for c in self.claims if c.study in self.studies}
        for i, step in enumerate(self.scale_steps):
            claim = next((c for c in self.claims if c.id == step.claim), None)
            if claim is None or claim.untestable is not None:
                raise ValueError(f"scale_steps[{i}]: {'unknown claim' if claim is None else 'a claim no study tests:'} {step.claim!r}")
            if step.study not in self.studies or step.study in in_family:
                what = "unknown study" if step.study not in self.studies else "a study a claim of the family uses (a scale step is outside it)"
                raise ValueError(f"scale_steps[{i}] ({step.claim}): {what} {step.study!r}")
            if step.base is not None and (step.base not in self.studies or step.base == step.study):
                raise ValueError(
                    f"scale_steps[{i}] ({step.claim}): base: {'the step study itself' if step.base == step.study else 'unknown study'} {step.base!r}"
                )
            if step.base is not None and step.run is None:
                raise ValueError(f"scale_steps[{i}] ({step.claim}): base {step.base!r} needs the runs it compares (run, reference)")
        for key, st in self.studies.items():
            if st.superseded_by is not None and (st.superseded_by not in self.studies or st.superseded_by == key):
                raise ValueError(f"studies.{key}.superseded_by: unknown study {st.superseded_by!r}")
        return self

    def results_dir(self, study: str) -> str:
        return self.studies[study].results or study

    def answering(self, claim: Claim) -> Claim:
        """``claim`` with the run names of the study that answers it once every rerun is published (its
        superseding study's, where that study maps every run of it)."""
        study = self.studies[claim.study] if claim.study else None
        if study is None or study.superseded_by is None or (study.superseding_runs and any(r not in study.superseding_runs for r in claim.runs)):
            return claim
        return superseding_claim(claim, study)

    def step_claim(self, step: ScaleStep, study: str | None = None) -> Claim:
        """The claim of a scale step as ``study`` (default: the step's) answers it: the step's run names where it
        gives them, else the claim's answering ones."""
        claim = next(c for c in self.claims if c.id == step.claim)
        update: dict = {"study": study or step.study}
        if step.run is not None:
            update.update(run=step.run, reference=step.reference, arms=[], controls=[])
        return self.answering(claim).model_copy(update=update)


def load_claims(path: str | Path = CLAIMS_FILE, root: str | Path = ".") -> ClaimsFile:
    """The claims file, validated: its keys and designs, and every run it names against the study's experiment file
    (``load_experiment`` at the study's size)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        claims = ClaimsFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, f"{path}: ")) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    check_runs(claims, Path(root), path)
    return claims


def experiment_path(root: Path, study: Study) -> Path:
    return root / "experiments" / "paper" / study.experiment


def check_runs(claims: ClaimsFile, root: Path, path: Path) -> None:
    """Every study's experiment file loads at its size, and every run a claim names is one of its runs."""
    from ..config import load_experiment

    names: dict[str, list[str]] = {}
    for key, study in claims.studies.items():
        exp_path = experiment_path(root, study)
        if not exp_path.is_file():
            raise ConfigError(f"{path}: studies.{key}.experiment: no file {exp_path}")
        try:
            exp = load_experiment(exp_path, [f"size={study.size}"])
        except ConfigError as e:
            raise ConfigError(f"{path}: studies.{key}: {e}") from None
        names[key] = [r["name"] for r in exp.runs]
    for key, study in claims.studies.items():
        if study.superseded_by is not None:
            bad = [r for r in study.superseding_runs.values() if r not in names[study.superseded_by]]
            if bad or set(study.superseding_runs) - set(names[key]):
                raise ConfigError(
                    f"{path}: studies.{key}.superseding_runs: {study.superseding_runs} names runs that {key} or {study.superseded_by} do not have"
                )
    steps = [(f"scale_steps[{i}]", claims.step_claim(st)) for i, st in enumerate(claims.scale_steps)]
    steps += [(f"scale_steps[{i}] base", claims.step_claim(st, st.base)) for i, st in enumerate(claims.scale_steps) if st.base]
    arms = [
        (f"claims[{i}] arm {a.label!r}", c.model_copy(update={"study": a.study, "run": a.run, "reference": a.reference, "arms": [], "controls": []}))
        for i, c in enumerate(claims.claims)
        for a in [*c.arms, *c.controls]
    ]
    for where, c in [*((f"claims[{i}]", c) for i, c in enumerate(claims.claims)), *steps, *arms]:
        if c.study is None:
            continue
        bad = [r for r in c.runs if r not in names[c.study]]
        if bad:
            raise ConfigError(
                f"{path}: {where} ({c.id}): {', '.join(map(repr, bad))} is not a run of "
                f"{claims.studies[c.study].experiment} (runs: {', '.join(names[c.study])})"
            )


def superseding_claim(claim: Claim, study: Study) -> Claim:
    """``claim`` as its study's superseding study would answer it: same test, the runs under their names there."""
    rename = study.superseding_runs

    def n(name: str | None) -> str | None:
        return None if name is None else rename.get(name, name)

    return claim.model_copy(
        update={
            "study": study.superseded_by,
            "run": n(claim.run),
            "reference": n(claim.reference),
            "control_run": n(claim.control_run),
            "control_reference": n(claim.control_reference),
            "x": {n(k): v for k, v in claim.x.items()} if claim.x else None,
        }
    )
