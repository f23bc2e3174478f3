"""One entry point for the task suites: ``run_suite(run_dir, suite, out_dir=None, **options)``.

Suites: ``lm-eval`` (lm-evaluation-harness tasks through the ``basecap`` model class), ``mqar``
(Zoology multi-query associative recall), ``passkey`` and ``niah`` (long-context retrieval),
``recall`` (SWDE/FDA/SQuAD-style and built-in structured extraction), ``extrapolation`` (loss
per position beyond the training length) and ``decay`` (how fast a trained model forgets, per layer and head). Each writes ``eval_<suite>.json`` (and its PNGs) into
``out_dir`` (default: the run directory) and returns the same dict. Every suite is deterministic
given its ``seed`` option.

``run_dir`` may also be a ``Subject`` (a model with its tokenizer and corpus already in memory),
which is how the tests and notebooks evaluate a model that has no run directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from ..config_base import ConfigError
from ..atomic import write_json
from ..rundir import suite_file

if TYPE_CHECKING:
    from ..model import LM

# the registry: suite name -> "module:function" in this package, imported only when the suite runs
_RUNNERS = {
    "lm-eval": "harness:lm_eval_suite",
    "mqar": "recall:mqar_suite",
    "passkey": "longctx:passkey_suite",
    "niah": "longctx:niah_suite",
    "recall": "recall:recall_suite",
    "extrapolation": "longctx:extrapolation_suite",
    "decay": "decay:decay_suite",
}
# every suite but lm-eval runs as function(subject, out_dir, options), its options a frozen dataclass of its module
_OPTIONS = {
    "mqar": "MqarOptions",
    "passkey": "PasskeyOptions",
    "niah": "NiahOptions",
    "recall": "RecallOptions",
    "extrapolation": "ExtrapolationOptions",
    "decay": "DecayOptions",
}


def suite_names() -> list[str]:
    """Every registered suite, in registry order (the CLI's choices)."""
    return list(_RUNNERS)


@dataclass
class Subject:
    """What a suite evaluates: a model, its tokenizer and (optionally) its corpus and run."""

    model: LM
    tokenizer: Any = None  # tokenizers.Tokenizer
    eot_id: int | None = None
    corpus: Any = None
    seq_len: int | None = None  # the training context length (default: model max_seq_len)
    run_dir: Path | None = None
    config: Any = None  # RunConfig when loaded from a run
    name: str = "model"
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.seq_len is None:
            self.seq_len = self.model.cfg.max_seq_len
        if self.eot_id is None and self.corpus is not None:
            self.eot_id = self.corpus.eot_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def max_positions(self) -> int | None:
        """Longest input the model accepts: max_seq_len with learned absolute positions, else None."""
        return self.model.cfg.max_seq_len if getattr(self.model, "abs_pos", None) is not None else None


def config_subject(run_dir: str | Path) -> Subject:
    """A run's architecture at initialisation, from run.json alone (no checkpoint, no corpus): enough for a
    suite that reads only the run's config, as MQAR ``mode="train"`` does (it trains the run's mixer from
    scratch). Runs kept without checkpoints (``report --archive`` records, runs copied by ``--reuse``) still
    get such suites."""
    from ..model import build_model
    from .final import read_run

    info, cfg = read_run(run_dir)
    return Subject(
        model=build_model(cfg.model, info["vocab_size"]),
        seq_len=cfg.data.seq_len,
        run_dir=Path(run_dir),
        config=cfg,
        name=cfg.run_id,
        info={"weights": "none: trained from the run's config"},
    )


def _config_only(suite: str, options: dict) -> bool:
    """Whether a suite reads only the run's config, not its weights."""
    return suite == "mqar" and options.get("mode", "train") == "train"


def load_subject(run_dir: str | Path, corpus: Any = None, log: Callable[..., Any] = print) -> Subject:
    """A run directory's newest good checkpoint with its corpus and tokenizer."""
    from .final import load_trained

    model, cfg, corpus, ckpt = load_trained(run_dir, corpus, log)
    return Subject(
        model=model,
        tokenizer=corpus.tokenizer,
        eot_id=corpus.eot_id,
        corpus=corpus,
        seq_len=cfg.data.seq_len,
        run_dir=Path(run_dir),
        config=cfg,
        name=cfg.run_id,
        info={"checkpoint": Path(ckpt).name},
    )


@torch.no_grad()
def greedy_generate(
    subject: Subject, prompts: list[list[int]], max_new_tokens: int, stop: tuple[str, ...] = (), stop_at_eot: bool = True, batch_size: int = 8
) -> list[str]:
    """Greedy continuations of token-id prompts, decoded and cut at the first stop string.

    Stateful decoding: prompts of equal length are prefilled together, then advanced one token
    at a time with the mixer states (no padding ever enters a recurrent state).
    """
    model = subject.model
    was_training = model.training
    model.eval()
    dev = subject.device
    out: list[str | None] = [None] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError("greedy_generate: empty prompt (prepend the end-of-text id)")
        by_len.setdefault(len(p), []).append(i)
    batches = [v[s : s + batch_size] for v in by_len.values() for s in range(0, len(v), batch_size)]
    for idxs in batches:
        x = torch.tensor([prompts[i] for i in idxs], dtype=torch.long, device=dev)
        state = model.init_state(len(idxs), dev)
        logits, state = model(x, state)
        gen: list[list[int]] = [[] for _ in idxs]
        done = [False] * len(idxs)
        for _ in range(max_new_tokens):
            nxt = logits[:, -1].float().argmax(-1)  # [B]
            for r, t in enumerate(nxt.tolist()):
                if done[r]:
                    continue
                if stop_at_eot and subject.eot_id is not None and t == subject.eot_id:
                    done[r] = True
                    continue
                gen[r].append(t)
                if stop and any(s in subject.decode(gen[r]) for s in stop):
                    done[r] = True
            if all(done):
                break
            logits, state = model(nxt[:, None], state)
        for r, i in enumerate(idxs):
            out[i] = cut_at_stop(subject.decode(gen[r]), stop)
    model.train(was_training)
    return out  # type: ignore[return-value]


def cut_at_stop(text: str, stop: tuple[str, ...] | list[str]) -> str:
    cut = len(text)
    for s in stop:
        j = text.find(s)
        if j != -1:
            cut = min(cut, j)
    return text[:cut]


# lm-eval's options, listed here so experiment files validate without importing lm-eval
LM_EVAL_OPTIONS = ("tasks", "num_fewshot", "limit", "batch_size", "include_path", "seed", "max_length")


def _module(suite: str) -> ModuleType:
    import importlib

    return importlib.import_module(f"{__package__}.{_RUNNERS[suite].split(':')[0]}")


def _runner(suite: str) -> Callable[..., dict]:
    return getattr(_module(suite), _RUNNERS[suite].split(":")[1])


def _options_class(suite: str) -> Any:
    """The frozen dataclass of a suite's options (None for lm-eval, whose options go to lm-eval as they are)."""
    return getattr(_module(suite), _OPTIONS[suite]) if suite in _OPTIONS else None


def suite_options(suite: str) -> list[str]:
    """The option names a suite accepts."""
    if suite not in _RUNNERS:
        raise ConfigError(f"unknown suite {suite!r}; allowed: {', '.join(sorted(_RUNNERS))}")
    if suite == "lm-eval":
        return list(LM_EVAL_OPTIONS)
    return [f.name for f in fields(_options_class(suite))]


def check_suite_options(suite: str, options: dict) -> None:
    """Fail (naming the key) on an unknown suite or option, before any compute."""
    allowed = suite_options(suite)
    bad = sorted(set(options) - set(allowed))
    if bad:
        raise ConfigError(f"suite {suite!r}: unknown option(s) {bad}; allowed: {', '.join(allowed)}")


def run_suite(run_dir: Any, suite: str, out_dir: str | Path | None = None, **options: Any) -> dict:
    """Run one suite on a run directory (or a ``Subject``); write and return ``eval_<suite>.json``."""
    check_suite_options(suite, options)
    fn = _runner(suite)
    subject = run_dir if isinstance(run_dir, Subject) else None
    if out_dir is None:
        base = subject.run_dir if subject is not None else run_dir
        if base is None:
            raise ValueError("out_dir is required when evaluating a Subject without a run directory")
        out_dir = base
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    subject = subject or (config_subject(run_dir) if _config_only(suite, options) else load_subject(run_dir))
    opts_cls = _options_class(suite)
    res = fn(subject, out_dir, opts_cls(**options)) if opts_cls is not None else fn(subject, out_dir=out_dir, **options)
    res = {"suite": suite, "model": subject.name, **subject.info, "seconds": round(time.time() - t0, 2), "options": dict(options), **res}
    write_json(out_dir / suite_file(suite), res, default=str)
    return res
