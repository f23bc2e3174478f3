"""One line of a run's ``metrics.jsonl``, typed: the schema every writer and reader of the records goes through.

Three kinds of record, told apart by ``kind``:

- ``"train"``: one optimiser step (``step`` = steps done), its loss, rate, gradient norm, tokens per second and MFU.
- ``"eval"``: an evaluation of the run's weights at ``step``: ``in_domain_loss`` (the training mixture's weighted
  loss) and ``domains``, one :class:`DomainEval` per evaluated domain.
- ``"anneal"``: an *annealed point*: the same evaluation, of a cooldown branch forked at ``step`` and decayed to
  ``end_step`` (docs/metrics.md, "Annealed points"); ``levels`` when ``train.cooldown_levels`` placed it.

Records are plain dicts at run time (JSON in, JSON out); the TypedDicts here are what mypy checks them against.
Reading validates the envelope (a known ``kind``, an integer ``step``) and names the file and line of a record
that is not one (:func:`check_record`); the rest of the schema is static.
"""

# no ``from __future__ import annotations`` here: TypedDict reads NotRequired from evaluated annotations (Python 3.11)
from collections.abc import Iterable
from typing import Any, Final, Literal, NotRequired, TypedDict, TypeGuard

Kind = Literal["train", "eval", "anneal"]
TRAIN: Final = "train"
EVAL: Final = "eval"
ANNEAL: Final = "anneal"
KINDS: Final[tuple[Kind, ...]] = (TRAIN, EVAL, ANNEAL)


class Stratum(TypedDict):
    loss: float | None  # None when no target of the stratum occurs in the domain's windows
    tokens: int


class DomainEval(TypedDict):
    loss: float  # nats per token
    bpb: float  # bits per UTF-8 byte of the scored text
    tokens: int
    bytes: int
    window_losses: list[float]  # mean loss of each evaluation window (the bootstrap over windows)
    unigram_loss: NotRequired[float]  # the training mixture's unigram baseline on the same windows
    strata: NotRequired[dict[str, Stratum]]  # "seen" / "rare" / "unseen" targets (docs/metrics.md)
    seen_min_count: NotRequired[int]


class TrainRecord(TypedDict):
    kind: Literal["train"]
    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float
    mfu: NotRequired[float]
    mfu_above_peak: NotRequired[float]  # in place of mfu when the step measured above the stored peak


class EvalRecord(TypedDict):
    kind: Literal["eval"]
    step: int
    tokens: int
    split: str
    in_domain_loss: float
    domains: dict[str, DomainEval]


class AnnealRecord(TypedDict):
    kind: Literal["anneal"]
    step: int  # the fork: the main run's step the branch left from
    tokens: int  # tokens seen at the branch's end
    split: str
    in_domain_loss: float
    domains: dict[str, DomainEval]
    end_step: int
    cooldown_steps: int
    start_lr: float
    end_lr: float
    levels: NotRequired[list[float]]  # the in-domain levels that placed this fork (train.cooldown_levels)


PointRecord = EvalRecord | AnnealRecord  # a record with an evaluation


class LevelLoss(TypedDict):
    loss: float
    tokens: int


class LevelRecord(TypedDict):
    """What placing forks by level (``cooldown.level_forks``) keeps of a point record: its kind, step, in-domain loss
    and the loss and token count of each domain of ``train.cooldown_level_domains``."""

    kind: Literal["eval", "anneal"]
    step: int
    in_domain_loss: float
    domains: NotRequired[dict[str, LevelLoss]]


MetricsRecord = TrainRecord | EvalRecord | AnnealRecord


def check_record(raw: Any, where: str) -> MetricsRecord:
    """``raw`` if it is a metrics record's envelope (a dict with a known ``kind`` and an integer ``step``), else a
    ValueError naming ``where`` (the file and line) and what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a metrics record is a JSON object, got {type(raw).__name__}")
    if raw.get("kind") not in KINDS:
        raise ValueError(f"{where}: unknown record kind {raw.get('kind')!r} (expected one of {', '.join(KINDS)})")
    if not isinstance(raw.get("step"), int) or isinstance(raw.get("step"), bool):
        raise ValueError(f"{where}: the {raw['kind']} record has no integer 'step' (got {raw.get('step')!r})")
    return raw  # type: ignore[return-value]  # the envelope is checked; the rest of the schema is static


def is_train(r: MetricsRecord) -> TypeGuard[TrainRecord]:
    return r["kind"] == TRAIN


def is_eval(r: MetricsRecord) -> TypeGuard[EvalRecord]:
    return r["kind"] == EVAL


def is_anneal(r: MetricsRecord) -> TypeGuard[AnnealRecord]:
    return r["kind"] == ANNEAL


def is_point(r: MetricsRecord) -> TypeGuard[PointRecord]:
    """An evaluation of the run (``eval``) or of one of its cooldown branches (``anneal``)."""
    return r["kind"] in (EVAL, ANNEAL)


def trains(records: Iterable[MetricsRecord]) -> list[TrainRecord]:
    return [r for r in records if is_train(r)]


def evals(records: Iterable[MetricsRecord]) -> list[EvalRecord]:
    return [r for r in records if is_eval(r)]


def anneals(records: Iterable[MetricsRecord]) -> list[AnnealRecord]:
    return [r for r in records if is_anneal(r)]


def points(records: Iterable[MetricsRecord]) -> list[PointRecord]:
    return [r for r in records if is_point(r)]


def eval_at(records: Iterable[MetricsRecord], step: int) -> EvalRecord | None:
    """The last ``eval`` record of ``step``, or None."""
    return next((r for r in reversed(evals(records)) if r["step"] == step), None)


def annealed_steps(records: Iterable[MetricsRecord]) -> set[int]:
    """The fork steps whose annealed point is recorded."""
    return {r["step"] for r in anneals(records)}
