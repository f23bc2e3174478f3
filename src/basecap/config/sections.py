"""The sections of a run's config: ``[data]``, ``[train]``, ``[eval]`` (``[model]`` is ``model.ModelConfig``), and
the study-level ``[compare]`` table that fixes how a study compares its runs (docs/metrics.md).

Kept apart from ``config`` (experiments, sweeps, tuning) so each file stays one idea.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from ..config_base import Strict
from ..tracking import normalize_loggers

# upper bounds that catch a typo (an extra digit, a value in the wrong key) before any compute
MAX_SEQ_LEN = 2**20
MAX_BATCH = 2**16
MAX_STEPS = 10**8
MAX_D_MODEL = 2**16
MAX_LAYERS = 1024
Beta = Annotated[float, Field(ge=0, lt=1)]
Logger = Literal["jsonl", "tensorboard", "wandb"]


RetrievalTask = Literal["passkey", "niah"]


def _every_retrieval_task() -> list[RetrievalTask]:
    return ["passkey", "niah"]


class RetrievalMix(Strict):
    """``data.retrieval``: a share of the training sequences replaced by the long-context retrieval prompts the
    ``passkey`` and ``niah`` suites test, each with its answer, one filling the window or several packed into it
    (``min_prompt_len``; ``data/retrieval.py``)."""

    fraction: float = Field(gt=0, le=1, description="share of each step's sequences that are retrieval prompts (rounded half up, at least one)")
    tasks: list[RetrievalTask] = Field(default_factory=_every_retrieval_task, min_length=1, description="prompt kinds, drawn uniformly per sequence")
    haystack_domain: str | None = Field(
        None, description="domain whose training split fills the niah haystack (default: the first domain with a training weight)"
    )
    min_prompt_len: int | None = Field(
        None,
        gt=0,
        description="pack several prompts into each retrieval window, each (with its answer) filled to a length drawn "
        "log-uniformly between this and what is left of the window: short haystacks beside long ones; "
        "unset: one prompt fills the window",
    )

    @field_validator("tasks")
    @classmethod
    def _unique(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"repeated tasks: {v}")
        return v


class DataConfig(Strict):
    recipe: str = Field("default", description="built-in recipe name or path to a recipe TOML")
    train_weights: dict[str, float] = Field(
        default_factory=lambda: {"prose": 1.0}, description="domain -> sampling weight; limited-domain vs mixed-domain setting"
    )
    eval_domains: list[str] | None = Field(None, description="domains evaluated; default: every domain of the corpus")
    seq_len: int = Field(256, gt=1, le=MAX_SEQ_LEN)
    retrieval: RetrievalMix | None = Field(
        None, description="mix retrieval prompts (passkey, single needle) with their answers into training: { fraction, tasks, haystack_domain }"
    )

    @field_validator("train_weights")
    @classmethod
    def _weights(cls, v):
        if not v or sum(v.values()) <= 0:
            raise ValueError("needs at least one domain with a positive weight")
        bad = {k: w for k, w in v.items() if w < 0}
        if bad:
            raise ValueError(f"weights must be >= 0, got {bad}")
        return v

    def in_domains(self) -> list[str]:
        return [d for d, w in self.train_weights.items() if w > 0]


class TrainConfig(Strict):
    steps: int = Field(300, gt=0, le=MAX_STEPS)
    batch_size: int = Field(8, gt=0, le=MAX_BATCH, description="sequences per optimizer step (all micro-batches together)")
    grad_accum: int = Field(1, gt=0, description="micro-batches per step; batch_size must divide evenly")
    lr: float = Field(3e-3, gt=0, le=1)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(30, ge=0)
    schedule: Literal["cosine", "wsd"] = Field(
        "cosine",
        description="cosine: warmup then cosine decay to lr x min_lr_ratio; "
        "wsd: warmup, constant lr, then a decay over the last decay_fraction of the steps",
    )
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: the share of the steps spent decaying (Haegele et al. 2024: 0.2)")
    decay_shape: Literal["linear", "cosine", "1-sqrt"] = Field("1-sqrt", description="shape of a wsd decay and of every cooldown branch")
    cooldowns: list[int] = Field(
        default_factory=list,
        description="steps at which the run forks a cooldown branch that decays the "
        "lr to the floor and is evaluated at its end (an annealed point); the main run is unchanged",
    )
    cooldown_fraction: float = Field(0.2, gt=0, le=1, description="a branch forked at step s decays over round(fraction x s) steps")
    cooldown_levels: list[float] = Field(
        default_factory=list,
        description="in-domain loss levels to place annealed points at: after an evaluation whose in-domain loss, less "
        "the drop the run's latest branch gained, reaches a level no branch has served yet, the run forks a branch "
        "there (basecap.cooldown.level_forks; needs a step of cooldowns on the evaluation grid to measure the drop)",
    )
    cooldown_level_domains: list[str] = Field(
        default_factory=list,
        description="domains whose (token-weighted) loss cooldown_levels are levels of; default: the in-domain loss "
        "(a mixed-domain run matched on prose names prose, as its study's compare.match_domains)",
    )
    keep_cooldown_weights: bool = Field(False, description="keep each branch's final weights (annealed/step_<s>/model.safetensors)")
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[Beta, Beta] = Field((0.9, 0.95), description="AdamW's (beta1, beta2), each in [0, 1)")
    grad_clip: float = Field(1.0, ge=0, description="0 disables clipping")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto: fp32 on CPU, bf16 autocast on CUDA")
    threads: int | None = Field(None, gt=0, description="torch intra-op threads on CPU (default: all cores)")
    peak_flops: float | None = Field(
        None, gt=0, description="peak FLOP/s of one device, the denominator of the logged MFU (default: a matmul measured at the start of training)"
    )
    compile: bool = False
    parallel: Literal["ddp", "fsdp"] = Field("ddp", description="data parallelism under torchrun (DDP, or FSDP2 sharding)")
    dist_timeout_s: float = Field(600.0, gt=0, le=86400, description="seconds a collective may wait for the other ranks under torchrun")
    checkpoint_every: int = Field(100, gt=0)
    keep_checkpoints: int = Field(2, gt=0)
    log_every: int = Field(10, gt=0)
    progress: bool = True
    loggers: list[Logger] = Field(
        default_factory=lambda: list[Logger](["jsonl"]), description="jsonl (always on, the source of truth), tensorboard, wandb (docs/tracking.md)"
    )

    @field_validator("loggers")
    @classmethod
    def _loggers(cls, v):
        return list(normalize_loggers(v))

    @model_validator(mode="after")
    def _check(self):
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size={self.batch_size} is not divisible by grad_accum={self.grad_accum}")
        if self.warmup_steps >= self.steps and self.steps > 1:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be < steps={self.steps}")
        bad = [s for s in self.cooldowns if not 0 < s < self.steps]
        if bad or len(set(self.cooldowns)) != len(self.cooldowns):
            raise ValueError(f"cooldowns={self.cooldowns}: each fork step must be unique and inside (0, steps={self.steps})")
        if any(not math.isfinite(v) or v <= 0 for v in self.cooldown_levels) or len(set(self.cooldown_levels)) != len(self.cooldown_levels):
            raise ValueError(f"cooldown_levels={self.cooldown_levels}: each level must be a unique positive loss")
        if self.cooldown_level_domains and not self.cooldown_levels:
            raise ValueError(f"cooldown_level_domains={self.cooldown_level_domains} without cooldown_levels places nothing")
        if len(set(self.cooldown_level_domains)) != len(self.cooldown_level_domains):
            raise ValueError(f"cooldown_level_domains={self.cooldown_level_domains}: a domain named twice")
        if self.cooldown_levels and not self.cooldowns:
            raise ValueError("cooldown_levels needs at least one step in cooldowns: its branch measures the drop a cooldown gains")
        short = [s for s in self.cooldowns if round(self.cooldown_fraction * s) < 1]
        if short:
            raise ValueError(f"cooldowns {short}: cooldown_fraction={self.cooldown_fraction} gives these forks no step of decay")
        return self

    def cooldown_steps(self, fork: int) -> int:
        """Length of the cooldown branch forked after ``fork`` steps: a fixed fraction of the tokens seen so far."""
        return max(1, round(self.cooldown_fraction * fork))

    def wsd_decay_start(self) -> int:
        """First step (0-based) of a wsd run's decay."""
        return self.steps - max(1, round(self.decay_fraction * self.steps))


class EvalConfig(Strict):
    every: int = Field(50, gt=0, description="evaluate every K steps (and at the last step)")
    split: Literal["validation", "test"] = "validation"
    max_tokens: int = Field(65536, gt=0, description="evaluation tokens per domain (windows spread over the split)")
    curve_max_tokens: int | None = Field(
        None,
        gt=0,
        description="tokens per domain for the main run's evaluations before its last step, which place level forks and draw "
        "the training curves but are not what the comparison design compares (annealed points and the last evaluation "
        "keep max_tokens); unset: max_tokens",
    )
    batch_size: int = Field(8, gt=0, le=MAX_BATCH)
    seen_min_count: int = Field(
        10,
        gt=0,
        description="targets seen at least this often in the training domains' train split are "
        "'seen'; fewer but > 0: 'rare'; 0: 'unseen' (each OOD loss is also recorded per stratum)",
    )


class CompareConfig(Strict):
    """How a study compares its runs, fixed in the study file before any result is seen (docs/metrics.md)."""

    band: tuple[float, float] | None = Field(
        None, description="[low, high] in-domain loss: the primary gap is the mean gap over this band, the same for every comparison of the study"
    )
    match_domains: list[str] | None = Field(
        None, description="domains whose (token-weighted mean) loss is the matching coordinate; default: each run's training domains (in_domain_loss)"
    )
    targets: Literal["all", "seen"] = Field(
        "seen", description="primary OOD loss: every target, or the targets seen at least eval.seen_min_count times in training"
    )
    points: Literal["evals", "annealed"] = Field(
        "annealed", description="primary curve: the run's evaluations, or its annealed points (cooldown branches and a wsd run's end)"
    )

    @field_validator("band")
    @classmethod
    def _band(cls, v):
        if v is not None and not 0 < v[0] < v[1]:
            raise ValueError(f"band {list(v)}: needs 0 < low < high (in-domain loss, nats/token)")
        return v

    @model_validator(mode="after")
    def _needs_band(self):
        # without a band the design has no primary gap and a report would read the legacy measure instead: refuse
        # before anything trains rather than fall back silently (docs/metrics.md, "The comparison design")
        if self.band is None:
            raise ValueError(
                "band is required: a [compare] table asks for the comparison design, whose primary gap is read in one "
                "in-domain band fixed before any run trains (e.g. band = [4.0, 4.2]; docs/metrics.md, 'The comparison "
                "design', says how to choose it); without a [compare] table the study reports the legacy measure"
            )
        return self
