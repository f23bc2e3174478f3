"""``basecap eval RUN_DIR``: evaluate a trained run's final checkpoint on the test split of every domain."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint import latest_good_checkpoint, load_weights
from ..config import RunConfig
from ..model import build_model
from ..rundir import RunDir
from .ood import DomainEvaluator, in_domain_loss

if TYPE_CHECKING:
    from ..data.corpus import Corpus
    from ..model import LM


def read_run(run_dir: str | Path) -> tuple[dict, RunConfig]:
    """(run.json, its resolved RunConfig) of a run directory."""
    info = RunDir(run_dir).read_info()
    return info, RunConfig.model_validate(info["config"])


def load_trained(run_dir: str | Path, corpus: Corpus | None = None, log: Callable[..., Any] = print) -> tuple[LM, RunConfig, Corpus, Path]:
    """(model, RunConfig, corpus, checkpoint) from a run directory's newest good checkpoint. The config
    in run.json is the resolved one, so the model is built from it as it stands. Without ``corpus``, the
    one run.json records is opened from the data home; nothing is built or fetched (docs/security.md)."""
    from ..data.home import run_corpus

    rd = RunDir(run_dir)
    info, cfg = read_run(run_dir)
    ckpt = latest_good_checkpoint(rd.checkpoints, log=log)
    if ckpt is None:
        raise FileNotFoundError(f"{rd.path}: no usable checkpoint")
    corpus = corpus or run_corpus(info)
    model = build_model(cfg.model, corpus.vocab_size)
    load_weights(ckpt, model)
    model.eval()
    return model, cfg, corpus, ckpt


def evaluate_run(
    run_dir: str | Path, corpus: Corpus | None = None, split: str = "test", max_tokens: int | None = None, log: Callable[..., Any] = print
) -> dict:
    model, cfg, corpus, ckpt = load_trained(run_dir, corpus, log)
    domains = cfg.data.eval_domains or corpus.domains
    ev = DomainEvaluator(
        corpus,
        domains,
        split,
        cfg.data.seq_len,
        cfg.eval.batch_size,
        max_tokens or cfg.eval.max_tokens,
        train_weights=cfg.data.train_weights,
        seen_min_count=cfg.eval.seen_min_count,
    )
    res = ev.evaluate(model)
    out: dict[str, Any] = {
        "run_id": cfg.run_id,
        "checkpoint": ckpt.name,
        "split": split,
        "in_domain": cfg.data.in_domains(),
        "in_domain_loss": in_domain_loss(res, cfg.data.train_weights),
        "domains": res,
    }
    if all(d in res for d in cfg.data.in_domains()):
        out["unigram_in_domain_loss"] = in_domain_loss(res, cfg.data.train_weights, key="unigram_loss")
        out["context_gain"] = out["unigram_in_domain_loss"] - out["in_domain_loss"]
    RunDir(run_dir).write_eval(out)
    return out
