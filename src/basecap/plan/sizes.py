"""What every plan reads of a run: its vocabulary, and its model built on the meta device (no memory, no
compute) for parameter counts, FLOPs per token and the tokens it trains on."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..config import RunConfig
from ..config_base import ConfigError
from ..cooldown import total_branch_steps


def run_vocab(rc: RunConfig) -> tuple[int, str]:
    """The vocabulary the run will train with: an explicit model.vocab_size, else the recipe's tokenizer."""
    if "vocab_size" in rc.model.model_fields_set:
        return rc.model.vocab_size, "model.vocab_size"
    from ..data import load_recipe

    try:
        tok = load_recipe(rc.data.recipe).tokenizer
    except ConfigError:
        return rc.model.vocab_size, "default (recipe not found)"
    if tok.kind == "bpe":
        return tok.vocab_size, f"recipe {rc.data.recipe}"
    if Path(tok.path).is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(tok.path).get_vocab_size(), f"tokenizer {Path(tok.path).name}"
    return rc.model.vocab_size, "default (tokenizer file not found)"


def run_sizes(rc: RunConfig) -> tuple[nn.Module, dict]:
    """The run's model on the meta device and what every plan reads of it: parameters, FLOPs and tokens."""
    from ..model import LM

    vocab, vocab_source = run_vocab(rc)
    with torch.device("meta"):
        model = LM(rc.model.model_copy(update={"vocab_size": vocab}))
    T, tr = rc.data.seq_len, rc.train
    counts = model.param_counts()
    fwd = model.flops_per_token(T)
    tokens_per_step = tr.batch_size * T
    branch_steps = total_branch_steps(tr)  # cooldown branches train on top of the run's own steps
    total_tokens = tokens_per_step * (tr.steps + branch_steps)
    return model, {
        "run": rc.name,
        "mixer": rc.model.mixer.name,
        "mlp": rc.model.mlp.name,
        "n_layers": rc.model.n_layers,
        "d_model": rc.model.d_model,
        "vocab_size": vocab,
        "vocab_source": vocab_source,
        "seq_len": T,
        "params_total": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "fwd_flops_per_token": fwd,
        "train_flops_per_token": 3.0 * fwd,
        "six_n": 6.0 * counts["non_embedding"],
        "batch_size": tr.batch_size,
        "grad_accum": tr.grad_accum,
        "tokens_per_step": tokens_per_step,
        "steps": tr.steps,
        "branch_steps": branch_steps,
        "level_forks": len(tr.cooldown_levels),  # placed while the run trains: counted at their longest
        "total_tokens": total_tokens,
        "total_train_flops": 3.0 * fwd * total_tokens,
    }
