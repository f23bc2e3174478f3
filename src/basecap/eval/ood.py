"""Loss and bits per byte on every domain's held-out text: the paper's main metric.

Bits per byte = loss (nats/token) / ln 2 x tokens/byte of that split, so numbers do not depend on
the tokenizer. The in-domain loss is the train-weighted mean over the training domains; every other
domain is out-of-distribution for the run.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F


class DomainEvaluator:
    """Holds fixed evaluation windows per domain so every evaluation of a run sees the same tokens."""

    def __init__(self, corpus, domains: list[str], split: str, seq_len: int, batch_size: int, max_tokens: int):
        from ..data.loader import check_domains, eval_batches

        check_domains({"evaluation domains": domains}, corpus.domains)
        self.split = split
        self.batches = {d: list(eval_batches(corpus, d, split=split, seq_len=seq_len, batch_size=batch_size, max_tokens=max_tokens)) for d in domains}
        empty = [d for d, b in self.batches.items() if not b]
        if empty:
            raise ValueError(f"no {split} tokens to evaluate for domain(s) {empty}: the corpus split is too small for seq_len={seq_len}")
        self.bytes_per_token = {d: corpus.bytes_per_token(d, split) for d in domains}

    @torch.no_grad()
    def evaluate(self, model, device="cpu", autocast=None) -> dict[str, dict[str, float]]:
        was_training = model.training
        model.eval()
        out = {}
        for d, batches in self.batches.items():
            total, n = 0.0, 0
            for x, y in batches:
                x, y = x.to(device), y.to(device)
                with autocast() if autocast else nullcontext():
                    logits, _ = model(x)
                total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
                n += y.numel()
            loss = total / n
            out[d] = {"loss": loss, "bpb": loss / math.log(2) / self.bytes_per_token[d], "tokens": n}
        model.train(was_training)
        return out


def in_domain_loss(results: dict[str, dict[str, float]], weights: dict[str, float]) -> float:
    w = {d: v for d, v in weights.items() if v > 0 and d in results}
    return sum(results[d]["loss"] * v for d, v in w.items()) / sum(w.values())
