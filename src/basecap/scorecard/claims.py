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
    def _looks(self):
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
    def _name(cls, v):
        return v if v is None else valid_name(v, "results folders")


class Arm(Strict):
    """Another specification of a claim's comparison that its verdict must survive (an intersection-union test):
    the same statistic from other runs, e.g. the two at one shared learning rate."""

    label: str  # e.g. "A: both at 2e-3"
    study: str
    run: str
    reference: str


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
    gpu: str | None = None  # needs the paper's GPU scale: what would have to run
    untestable: str | None = None  # no study can test it: why

    @field_validator("id")
    @classmethod
    def _id(cls, v):
        return valid_name(v, "claim ids")

    @model_validator(mode="after")
    def _design(self):
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
        return self

    @property
    def sign(self) -> int:
        """+1 when the paper expects the statistic to be positive (worse, rises, larger), -1 when negative, 0 for
        no effect."""
        return {"worse": 1, "small": 1, "rises": 1, "larger": 1, "better": -1, "falls": -1, "smaller": -1}.get(self.direction or self.expect or "", 0)

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
    def _check(self):
        if not 0 < self.margin < 1 or not 0 < self.alpha < 0.5 or not 0.5 <= self.power < 1:
            raise ValueError("margin in (0, 1) nats, alpha in (0, 0.5), power in [0.5, 1)")
        seen = set()
        for i, c in enumerate(self.claims):
            if c.id in seen:
                raise ValueError(f"claims[{i}]: id {c.id!r} is used twice")
            seen.add(c.id)
            if c.study is not None and c.study not in self.studies:
                raise ValueError(f"claims[{i}] ({c.id}): unknown study {c.study!r}; studies: {', '.join(self.studies)}")
            for a in c.arms:
                if a.study not in self.studies:
                    raise ValueError(f"claims[{i}] ({c.id}): arm {a.label!r}: unknown study {a.study!r}")
                if c.expect in ("trend", "interaction"):
                    raise ValueError(f"claims[{i}] ({c.id}): arms are for pair claims (a run against a reference)")
        in_family = {c.study for c in self.claims} | {self.studies[c.study].superseded_by for c in self.claims if c.study in self.studies}
        for i, step in enumerate(self.scale_steps):
            claim = next((c for c in self.claims if c.id == step.claim), None)
            if claim is None or claim.untestable is not None:
                raise ValueError(f"scale_steps[{i}]: {'unknown claim' if claim is None else 'a claim no study tests:'} {step.claim!r}")
            if step.study not in self.studies or step.study in in_family:
                what = "unknown study" if step.study not in self.studies else "a study a claim of the family uses (a scale step is outside it)"
                raise ValueError(f"scale_steps[{i}] ({step.claim}): {what} {step.study!r}")
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

    def step_claim(self, step: ScaleStep) -> Claim:
        """The claim of a scale step as its study answers it (the answering run names, at the step's study)."""
        claim = next(c for c in self.claims if c.id == step.claim)
        return self.answering(claim).model_copy(update={"study": step.study})


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
    arms = [
        (f"claims[{i}] arm {a.label!r}", c.model_copy(update={"study": a.study, "run": a.run, "reference": a.reference, "arms": []}))
        for i, c in enumerate(claims.claims)
        for a in c.arms
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

    def n(name):
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
