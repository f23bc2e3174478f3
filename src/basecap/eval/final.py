"""``basecap eval RUN_DIR``: evaluate a trained run's final checkpoint on the test split of every domain."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..checkpoint import latest_good_checkpoint, load_weights
from ..config import RunConfig
from .ood import DomainEvaluator, in_domain_loss


def load_trained(run_dir: str | Path, corpus=None, log=print):
    """(model, RunConfig, corpus) from a run directory's newest good checkpoint."""
    from ..data import build_corpus, load_recipe
    from ..train import build_model

    run_dir = Path(run_dir)
    info_path = run_dir / "run.json"
    if not info_path.exists():
        raise FileNotFoundError(f"{run_dir} is not a basecap run directory (no run.json)")
    cfg = RunConfig.model_validate(json.loads(info_path.read_text())["config"])
    ckpt = latest_good_checkpoint(run_dir / "checkpoints", log=log)
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir}: no usable checkpoint")
    corpus = corpus or build_corpus(load_recipe(cfg.data.recipe), log=log)
    model = build_model(cfg, corpus.vocab_size)
    load_weights(ckpt, model)
    model.eval()
    return model, cfg, corpus, ckpt


def evaluate_run(run_dir: str | Path, corpus=None, split: str = "test", max_tokens: int | None = None, log=print) -> dict:
    model, cfg, corpus, ckpt = load_trained(run_dir, corpus, log)
    domains = cfg.data.eval_domains or corpus.domains
    ev = DomainEvaluator(corpus, domains, split, cfg.data.seq_len, cfg.eval.batch_size, max_tokens or cfg.eval.max_tokens)
    res = ev.evaluate(model)
    out = {"run_id": cfg.run_id, "checkpoint": ckpt.name, "split": split, "in_domain": cfg.data.in_domains(),
           "in_domain_loss": in_domain_loss(res, cfg.data.train_weights), "domains": res}
    path = Path(run_dir) / "eval.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, path)
    return out
