"""Loss and bits per byte on every domain's held-out text: the paper's main metric.

Each domain is scored on fixed windows spread over its whole split (``data.loader.eval_windows``), the
same for every run and every evaluation. Bits per byte = summed loss (nats) / ln 2 / UTF-8 bytes of the
tokens scored, so numbers do not depend on the tokenizer. The in-domain loss is the train-weighted mean
over the training domains; every other domain is out-of-distribution for the run. See docs/metrics.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import numpy as np

    from ..data.corpus import Corpus


STRATA = ("seen", "rare", "unseen")


def target_strata(counts: "np.ndarray", seen_min_count: int) -> torch.Tensor:
    """Stratum index [V] of every token id by its count in the training split of the training domains: 0 =
    "seen" (>= ``seen_min_count``), 1 = "rare" (1 to seen_min_count - 1), 2 = "unseen" (never)."""
    c = torch.as_tensor(counts, dtype=torch.int64)
    out = torch.zeros(len(c), dtype=torch.int64)
    out[c < seen_min_count] = 1
    out[c == 0] = 2
    return out


def strata_losses(losses: torch.Tensor, targets: torch.Tensor, strata: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed loss, token count) per stratum [len(STRATA)] of per-token ``losses`` at ``targets``."""
    idx = strata[targets.reshape(-1).cpu()]
    sums = torch.bincount(idx, weights=losses.reshape(-1).double().cpu(), minlength=len(STRATA))
    return sums, torch.bincount(idx, minlength=len(STRATA))


class DomainEvaluator:
    """Holds fixed evaluation windows per domain so every evaluation of a run sees the same tokens.

    With ``train_weights``, each domain's result also carries ``unigram_loss``: the training mixture's
    unigram baseline on the same windows (``data.baselines``), and ``strata``: the loss split by how often
    the target token occurs in the training domains' train split (``target_strata``, docs/metrics.md)."""

    def __init__(
        self,
        corpus: Corpus,
        domains: list[str],
        split: str,
        seq_len: int,
        batch_size: int,
        max_tokens: int,
        *,
        train_weights: dict[str, float] | None = None,
        seen_min_count: int = 10,
    ) -> None:
        from ..data.loader import eval_batches

        self.split = split
        self.batches = {d: list(eval_batches(corpus, d, split=split, seq_len=seq_len, batch_size=batch_size, max_tokens=max_tokens)) for d in domains}
        empty = [d for d, b in self.batches.items() if not b]
        if empty:
            raise ValueError(f"no {split} tokens to evaluate for domain(s) {empty}: the corpus split is too small for seq_len={seq_len}")
        token_bytes = torch.from_numpy(corpus.token_bytes())
        self.bytes = {d: int(sum(int(token_bytes[y].sum()) for _, y in b)) for d, b in self.batches.items()}
        self.unigram: dict[str, float] = {}
        if train_weights is not None:
            from ..data.baselines import unigram_losses

            self.unigram = unigram_losses(corpus, train_weights, domains, split, seq_len, max_tokens)
        self.strata: torch.Tensor | None = None
        self.seen_min_count = seen_min_count
        if train_weights is not None:
            from ..data.baselines import train_token_counts

            counts = train_token_counts(corpus, [d for d, w in train_weights.items() if w > 0])
            self.strata = target_strata(sum(counts.values(), torch.zeros(corpus.vocab_size, dtype=torch.int64).numpy()), seen_min_count)

    @torch.no_grad()
    def evaluate(
        self, model: torch.nn.Module, device: str | torch.device = "cpu", autocast: Callable[[], AbstractContextManager[Any]] | None = None
    ) -> dict[str, dict]:
        """Per domain: ``loss`` (nats/token), ``bpb``, ``tokens`` and ``bytes`` scored, ``window_losses``
        (the mean loss of each window, for the bootstrap over windows), and ``unigram_loss`` when known."""
        was_training = model.training
        model.eval()
        out = {}
        for d, batches in self.batches.items():
            sums = []
            by_stratum = [torch.zeros(len(STRATA), dtype=torch.float64), torch.zeros(len(STRATA), dtype=torch.int64)]
            for x, y in batches:
                x, y = x.to(device), y.to(device)
                with autocast() if autocast else nullcontext():
                    losses = token_losses(model, x, y)  # [B, T]
                sums.append(losses.double().sum(1).cpu())
                if self.strata is not None:
                    s, c = strata_losses(losses, y, self.strata)
                    by_stratum[0] += s
                    by_stratum[1] += c
            window_sums = torch.cat(sums)
            n = sum(y.numel() for _, y in batches)
            total = float(window_sums.sum())
            loss = total / n
            out[d] = {
                "loss": loss,
                "bpb": total / math.log(2) / self.bytes[d],
                "tokens": n,
                "bytes": self.bytes[d],
                "window_losses": [round(v, 6) for v in (window_sums / (n // len(window_sums))).tolist()],
            }
            if d in self.unigram:
                out[d]["unigram_loss"] = self.unigram[d]
            if self.strata is not None:
                out[d]["strata"] = {
                    name: {"loss": float(by_stratum[0][i]) / int(by_stratum[1][i]) if by_stratum[1][i] else None, "tokens": int(by_stratum[1][i])}
                    for i, name in enumerate(STRATA)
                }
                out[d]["seen_min_count"] = self.seen_min_count
        model.train(was_training)
        return out


def token_losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy [B, T] in fp32 through the (possibly wrapped) model's LM-head loss, which
    by default never materialises the [B, T, V] logits."""
    losses, _ = model(x, targets=y, reduction="none")
    return losses.float()


def in_domain_loss(results: dict[str, dict], weights: dict[str, float], key: str = "loss") -> float:
    """Training-weight-weighted mean of ``results[d][key]`` over the training domains (weight > 0) that
    were evaluated: sum_d w_d L_d / sum_d w_d."""
    w = {d: v for d, v in weights.items() if v > 0 and d in results}
    return sum(results[d][key] * v for d, v in w.items()) / sum(w.values())
