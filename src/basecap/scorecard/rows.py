"""A claim's row of the scorecard, typed: the fields ``_new_row`` (or ``principle_row``) starts it with, the ones the
test, the verdict and the robustness reading add, and the objects it carries for the computation only (stripped
before ``scorecard.json`` is written: ``claim_obj``, ``study_obj``, ``plan``, ``decider``).

Every field is optional to mypy (``total=False``): a row grows along the pipeline, and an untestable claim never gets
a test. What the type checks is that each field is spelled as written here and holds what it says."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypedDict

if TYPE_CHECKING:
    from .claims import Claim
    from .compute import Study
    from .sequential import Plan


class ClaimRow(TypedDict, total=False):
    # as the claims file states the claim (_new_row)
    id: str
    section: str
    paper: str
    study: str | None
    expect: str | None
    direction: str | None
    run: str | None
    reference: str | None
    runs: list[str]
    domains: list[str]
    measure: str
    family: bool  # in the Holm family of the CPU-scale claims
    gpu_family: bool  # the paper's GPU-scale claims: a family of their own
    metric: str  # "ood_gap", a speed ratio, an accuracy, or "spearman" (the principle)
    margin: float | None
    analogue_of: str | None
    kind: str  # "principle" for the principle's row
    before: dict[str, Any] | None  # the superseded study's estimate
    pending: dict[str, Any] | None  # the superseding study still to come
    # what the records give
    results: str | None  # the results folder read
    scale: dict[str, Any] | None
    lacking: list[str]
    seeds: list[int]
    values: list[float]  # the per-seed gaps
    parts: dict[str, Any]
    notes: list[str]
    reused: list[dict[str, Any]]
    seconds: dict[str, Any]  # a speed claim's samples
    unit: str
    band: list[float] | tuple[float, float]  # the band the claim's own comparison is read at, when the study's is out of reach
    band_note: str
    # the test, the arms and the verdict
    test: Any  # the claim's test (a dict: estimate, interval, p values, plan), None until tested
    arms: list[dict[str, Any]]
    controls: list[dict[str, Any]]
    arm_note: str
    verdict: str
    detail: str
    # the robustness reading
    specs: list[dict[str, Any]]
    robust: bool | None
    robust_missing: list[str]
    breaks: list[str]
    gap_along_training: dict[str, Any] | None
    # carried for the computation only
    claim_obj: Claim
    study_obj: Study
    plan: Plan
    decider: Callable[[ClaimRow, float, int], None]
