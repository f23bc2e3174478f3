"""Recall suites.

* MQAR (Zoology, Arora et al. 2023): ``train_mqar`` trains a small model of a given mixer from
  scratch on multi-query associative recall and reports test accuracy per number of key-value
  pairs, with the model's recurrent state size (Zoology's accuracy-vs-state-size study);
  ``eval_mqar`` scores any model on MQAR token sequences.
* Recall-intensive extraction (the Based suite, Arora et al. 2024: SWDE, FDA, SQuAD): a reader for
  their public jsonl layouts and a built-in structured-extraction task (attribute-value records
  embedded in held-out corpus text), scored by "a reference answer is contained in the greedy
  output" after case and whitespace normalisation.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from ..data.synthetic import IGNORE, extraction_example, mqar, mqar_mixture

if TYPE_CHECKING:
    from ..data.corpus import Corpus
    from .suites import Subject

# ---- scoring --------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """Lower case, collapse whitespace, strip surrounding whitespace and quotes."""
    return re.sub(r"\s+", " ", str(text).lower()).strip().strip("\"'")


def answer_contained(output: str, answers: Any) -> bool:
    """True when any non-empty reference answer occurs in the output (after ``normalize_answer``)."""
    if answers is None:
        return False
    if isinstance(answers, dict):  # SQuAD: {"text": [...], "answer_start": [...]}
        answers = answers.get("text", [])
    if isinstance(answers, str):
        answers = [answers]
    out = normalize_answer(output)
    return any(a and a in out for a in (normalize_answer(x) for x in answers))


# ---- MQAR -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MqarTask:
    """The MQAR task's shape: token ids ``0 .. vocab_size - 1`` (half keys, half values), sequences of
    ``seq_len`` tokens, trained on ``train_kv_pairs`` settings mixed and tested on ``num_test`` sequences of
    each of ``test_kv_pairs``; query gaps drawn from the power law of exponent ``power_a``."""

    vocab_size: int = 128
    seq_len: int = 32
    train_kv_pairs: Sequence[int] = (1, 2, 4)
    test_kv_pairs: Sequence[int] = (1, 2, 4, 8)
    num_test: int = 256
    power_a: float = 0.01


@dataclass(frozen=True)
class MqarTraining:
    """The optimiser settings of an MQAR training: ``steps`` batches of ``batch_size`` new sequences; AdamW
    (``optim.make_optimizer``, the main loop's) at peak ``lr`` with ``betas`` and ``weight_decay`` on matrices,
    the main loop's cosine schedule (``optim.lr_at``: linear warmup over ``warmup_frac`` of the steps, then cosine
    decay to ``min_lr_ratio``); gradients clipped at ``grad_clip``."""

    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_frac: float = 0.02
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    min_lr_ratio: float = 0.1
    schedule: Literal["cosine"] = "cosine"

    @property
    def warmup_steps(self) -> int:
        return max(1, int(self.warmup_frac * self.steps))


@torch.no_grad()
def eval_mqar(
    model: torch.nn.Module,
    task: MqarTask,
    *,
    seed: int = 0,
    batch_size: int = 64,
    token_map: torch.Tensor | None = None,
    seq_lens: dict | None = None,
) -> dict:
    """Accuracy at the query positions of the MQAR test split (``task.num_test`` sequences of each of
    ``task.test_kv_pairs``), per number of key-value pairs.

    ``token_map`` [vocab_size] maps MQAR ids to model token ids (to probe a pretrained LM in context);
    ``seq_lens`` maps a pair count to its own sequence length (default ``task.seq_len`` for all).
    """
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    acc = {}
    for k in task.test_kv_pairs:
        T = (seq_lens or {}).get(k, task.seq_len)
        data = mqar(task.num_test, T, k, vocab_size=task.vocab_size, power_a=task.power_a, random_non_queries=True, seed=seed, split="test")
        correct = total = 0
        for s in range(0, task.num_test, batch_size):
            x, y = data.inputs[s : s + batch_size].to(dev), data.targets[s : s + batch_size].to(dev)
            if token_map is not None:
                tm = token_map.to(dev)
                x, y = tm[x], torch.where(y == IGNORE, y, tm[y.clamp(min=0)])
            logits, _ = model(x)
            mask = y != IGNORE
            correct += int((logits.argmax(-1)[mask] == y[mask]).sum())
            total += int(mask.sum())
        acc[int(k)] = correct / max(total, 1)
    model.train(was_training)
    return {
        "acc": acc,
        "mean_acc": sum(acc.values()) / len(acc),
        "num_examples": task.num_test,
        "seq_len": task.seq_len,
        "vocab_size": task.vocab_size,
        "power_a": task.power_a,
        "seed": seed,
    }


def mqar_training_set(task: MqarTask, training: MqarTraining, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs and targets of every training step in order, ``training.steps * training.batch_size``
    sequences: an equal share of each ``task.train_kv_pairs`` setting, shuffled together."""
    total = training.steps * training.batch_size
    per = math.ceil(total / len(task.train_kv_pairs))
    settings = [(task.seq_len, k) for k in task.train_kv_pairs]
    parts = mqar_mixture(settings, per, vocab_size=task.vocab_size, power_a=task.power_a, seed=seed, split="train")
    inputs = torch.cat([p.inputs for p in parts])
    targets = torch.cat([p.targets for p in parts])
    perm = torch.from_numpy(np.random.default_rng([seed, 7]).permutation(len(inputs))[:total])
    return inputs[perm], targets[perm]


def fit_mqar(
    model: torch.nn.Module,
    data: tuple[torch.Tensor, torch.Tensor],
    task: MqarTask,
    training: MqarTraining,
    *,
    seed: int,
    device: str,
    eval_every: int,
) -> tuple[list[tuple[int, float]], list[dict]]:
    """Train ``model`` on ``data`` (``mqar_training_set``'s), one batch a step; returns the loss curve (every 50
    steps and the last) and the test evaluations every ``eval_every`` steps before the last."""
    from ..optim import lr_at, make_optimizer, optimizer_step

    inputs, targets = data
    steps, batch_size = training.steps, training.batch_size
    opt = make_optimizer(model, training)
    curve, evals = [], []
    model.train()
    for step in range(steps):
        x = inputs[step * batch_size : (step + 1) * batch_size].to(device)
        y = targets[step * batch_size : (step + 1) * batch_size].to(device)
        loss, _ = optimizer_step(
            model,
            opt,
            [(x, y)],
            lr=lr_at(step, training),
            loss_fn=lambda a, b: model(a, targets=b, ignore_index=IGNORE)[0],
            grad_clip=training.grad_clip,
        )
        if step % 50 == 0 or step == steps - 1:
            curve.append((step, round(loss, 4)))
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            evals.append({"step": step + 1, **eval_mqar(model, task, seed=seed)})
    return curve, evals


def train_mqar(
    mixer_cfg: dict,
    task: MqarTask,
    training: MqarTraining,
    *,
    d_model: int = 64,
    n_layers: int = 2,
    seed: int = 0,
    mlp: dict | None = None,
    device: str = "cpu",
    eval_every: int = 0,
    log: Callable[..., Any] | None = print,
) -> dict:
    """Train a fresh ``n_layers`` x ``d_model`` model of ``mixer_cfg`` on MQAR and return its test
    accuracy per number of pairs, parameter counts and recurrent state bytes.

    Each step is one batch of new sequences drawn from all ``task.train_kv_pairs`` settings mixed (no
    example is seen twice); AdamW with warmup and cosine decay to 10%, gradient clipping at 1.
    """
    from ..model import LM, ModelConfig

    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=task.vocab_size,
        d_model=d_model,
        n_layers=n_layers,
        max_seq_len=task.seq_len,
        mixer=dict(mixer_cfg),
        **({"mlp": mlp} if mlp else {}),
    )
    model = LM(cfg).to(device)
    data = mqar_training_set(task, training, seed)
    t0 = time.time()
    curve, evals = fit_mqar(model, data, task, training, seed=seed, device=device, eval_every=eval_every)
    train_s = time.time() - t0
    res = eval_mqar(model, task, seed=seed)
    if log:
        log(
            f"mqar {mixer_cfg.get('name')} d={d_model} L={n_layers}: "
            + " ".join(f"{k}:{v:.2f}" for k, v in res["acc"].items())
            + f" ({train_s:.0f}s)"
        )
    return {
        **res,
        "mixer": dict(mixer_cfg),
        "d_model": d_model,
        "n_layers": n_layers,
        "steps": training.steps,
        "batch_size": training.batch_size,
        "lr": training.lr,
        "train_kv_pairs": list(task.train_kv_pairs),
        "params": model.param_counts(),
        "state_bytes": model.state_size(task.seq_len),
        "final_loss": curve[-1][1],
        "loss_curve": curve,
        "evals": evals,
        "train_seconds": round(train_s, 2),
        "tokens_per_s": round(training.steps * training.batch_size * task.seq_len / max(train_s, 1e-9)),
    }


@dataclass(frozen=True)
class MqarOptions:
    """The ``mqar`` suite's options. ``mode="train"``: train the run's mixer from scratch at each width in
    ``d_models`` (``n_layers`` deep) on the task below; ``mode="pretrained"``: probe the run's own model."""

    mode: str = "train"
    d_models: Sequence[int] = (64,)
    n_layers: int = 2
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    vocab_size: int = 128
    seq_len: int = 32
    train_kv_pairs: Sequence[int] = (1, 2, 4)
    test_kv_pairs: Sequence[int] = (1, 2, 4, 8)
    num_test: int = 256
    seed: int = 0

    def task(self) -> MqarTask:
        return MqarTask(
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            train_kv_pairs=self.train_kv_pairs,
            test_kv_pairs=self.test_kv_pairs,
            num_test=self.num_test,
        )

    def training(self) -> MqarTraining:
        return MqarTraining(steps=self.steps, batch_size=self.batch_size, lr=self.lr)


def mqar_suite(subject: Subject, out_dir: Path, opts: MqarOptions) -> dict:
    """``mode="train"``: train the run's mixer from scratch on MQAR at each width in ``d_models``
    (the architecture's recall capacity, Zoology's protocol). ``mode="pretrained"``: probe the run's
    own model in context, with MQAR ids mapped onto a fixed random set of its vocabulary."""
    from ..config_base import ConfigError

    if opts.mode == "pretrained":
        V = subject.model.cfg.vocab_size
        ids = [i for i in range(V) if i != subject.eot_id]
        if len(ids) < opts.vocab_size:
            raise ConfigError(f"mqar: vocab_size={opts.vocab_size} exceeds the model's usable vocabulary {len(ids)}")
        pick = np.random.default_rng([opts.seed, 11]).choice(ids, size=opts.vocab_size, replace=False)
        res = eval_mqar(subject.model, opts.task(), seed=opts.seed, token_map=torch.as_tensor(pick, dtype=torch.long))
        return {"mode": opts.mode, **res}
    if opts.mode != "train":
        raise ConfigError(f"mqar: mode must be 'train' or 'pretrained', got {opts.mode!r}")
    mcfg = subject.model.cfg
    if mcfg.layer_mixers:
        raise ConfigError("mqar mode='train' trains one mixer type; this run is a hybrid (layer_mixers)")
    mixer, mlp = mcfg.mixer.model_dump(), mcfg.mlp.model_dump()
    runs = [train_mqar(mixer, opts.task(), opts.training(), d_model=d, n_layers=opts.n_layers, seed=opts.seed, mlp=mlp) for d in opts.d_models]
    return {"mode": opts.mode, "runs": runs, "acc_by_d_model": {r["d_model"]: r["acc"] for r in runs}}


# ---- extraction recall (SWDE / FDA / SQuAD style) ---------------------------------------------

CONTEXT_KEYS = ("context", "text", "document", "passage")
QUESTION_KEYS = ("question", "key", "query", "attribute")
ANSWER_KEYS = ("answers", "answer", "value", "values", "label")


def read_recall_jsonl(path: str | Path) -> list[dict]:
    """Records ``{"context", "question", "answers"}`` from jsonl in the public layouts: context/text/
    document/passage; question/key/query/attribute (optional); answers (list, or SQuAD's
    ``{"text": [...]}``)/answer/value/values/label. A missing field is an error naming the line."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        ctx = next((rec[k] for k in CONTEXT_KEYS if k in rec), None)
        ans = next((rec[k] for k in ANSWER_KEYS if k in rec), None)
        if ctx is None or ans is None:
            raise ValueError(
                f"{path}:{n}: needs a context field ({'/'.join(CONTEXT_KEYS)}) and an answer field ({'/'.join(ANSWER_KEYS)}); got keys {sorted(rec)}"
            )
        if isinstance(ans, dict):
            ans = ans.get("text", [])
        qkey = next((k for k in QUESTION_KEYS if k in rec), None)
        out.append(
            {
                "context": ctx,
                "question": rec[qkey] if qkey else "",
                "question_field": qkey,
                "answers": [ans] if isinstance(ans, str) else [str(a) for a in ans],
            }
        )
    return out


def recall_prompt(rec: dict) -> str:
    """Completion-style prompt: SWDE/FDA keys as ``<context>\\n<key>:``, questions as Question/Answer."""
    q = rec.get("question") or ""
    if not q:
        return rec["context"]
    if rec.get("question_field") in ("key", "attribute") and not q.rstrip().endswith(":"):
        q = q.rstrip() + ":"
    elif rec.get("question_field") == "question" and not q.rstrip().endswith(":"):
        q = f"Question: {q.strip()}\nAnswer:"
    return f"{rec['context']}\n{q}"


def corpus_paragraphs(corpus: Corpus, domain: str, split: str, rng: random.Random, n_tokens: int) -> list[str]:
    """Consecutive paragraphs (~``n_tokens`` tokens) of held-out text decoded from a random offset."""
    toks = corpus.tokens(domain, split)
    if len(toks) < 2:
        raise ValueError(f"corpus {domain}/{split} has no text")
    start = rng.randrange(max(1, len(toks) - n_tokens))
    ids = [int(t) for t in toks[start : start + n_tokens] if int(t) != corpus.eot_id]
    text = corpus.tokenizer.decode(ids)
    paras = [p.strip() for p in re.split(r"\n\s*\n|(?<=[.!?])\s+(?=[A-Z])", text) if p.strip()]
    return paras[1:-1] if len(paras) > 2 else paras  # drop the cut-off ends


def builtin_extraction(
    subject: Subject, n: int, seed: int, context_tokens: int, *, domain: str | None = None, split: str = "test", n_records: int = 2, n_attrs: int = 4
) -> list[dict]:
    """``n`` structured-extraction examples: ``n_records`` records of ``n_attrs`` attributes each, embedded in about
    ``context_tokens`` tokens of held-out text of ``domain`` (default the corpus's first; none without a corpus)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        paras = []
        if subject.corpus is not None:
            d = domain or subject.corpus.domains[0]
            paras = corpus_paragraphs(subject.corpus, d, split, rng, context_tokens)
        ex = extraction_example(rng, paras, n_records, n_attrs)
        out.append({**ex, "question_field": "key"})
    return out


def score_recall(subject: Subject, records: list[dict], max_new_tokens: int = 16, batch_size: int = 8) -> dict:
    """Greedy-generate after each record's prompt (first line kept) and score containment."""
    from .suites import greedy_generate

    limit = subject.max_positions()
    prompts, truncated = [], 0
    for r in records:
        ids = subject.encode(recall_prompt(r))
        if limit is not None and len(ids) > limit - max_new_tokens:
            ids, truncated = ids[-(limit - max_new_tokens) :], truncated + 1
        prompts.append(ids)
    outs = greedy_generate(subject, prompts, max_new_tokens, stop=("\n",), batch_size=batch_size)
    hits = [answer_contained(o, r["answers"]) for o, r in zip(outs, records)]
    return {
        "accuracy": sum(hits) / max(len(hits), 1),
        "n": len(hits),
        "truncated_prompts": truncated,
        "mean_prompt_tokens": float(np.mean([len(p) for p in prompts])) if prompts else 0.0,
        "examples": [
            {"prompt_tail": recall_prompt(r)[-120:], "answers": r["answers"], "output": o, "hit": h} for r, o, h in list(zip(records, outs, hits))[:5]
        ],
    }


@dataclass(frozen=True)
class RecallOptions:
    """The ``recall`` suite's options: ``n`` built-in extraction examples (``n_records`` records of ``n_attrs``
    attributes in about ``context_tokens`` tokens of ``domain``'s ``split`` text, default half the training context),
    plus any ``files`` {name: jsonl path} (first ``limit`` records each); greedy outputs of up to ``max_new_tokens``
    tokens, ``batch_size`` prompts at a time."""

    files: dict | None = None
    n: int = 32
    seed: int = 0
    context_tokens: int | None = None
    domain: str | None = None
    split: str = "test"
    n_records: int = 2
    n_attrs: int = 4
    max_new_tokens: int = 16
    limit: int | None = None
    batch_size: int = 8


def recall_suite(subject: Any, out_dir: Path, opts: RecallOptions) -> dict:
    """The built-in structured-extraction task (``n`` examples of about ``context_tokens`` tokens of
    corpus text, default half the training context) plus any ``files`` {name: jsonl path} in the
    SWDE/FDA/SQuAD layouts (first ``limit`` records each)."""
    ctx = opts.context_tokens or max(32, subject.seq_len // 2)
    records = builtin_extraction(
        subject, opts.n, opts.seed, ctx, domain=opts.domain, split=opts.split, n_records=opts.n_records, n_attrs=opts.n_attrs
    )
    tasks = {"extraction": score_recall(subject, records, opts.max_new_tokens, opts.batch_size)}
    tasks["extraction"].update(context_tokens=ctx, n_records=opts.n_records, n_attrs=opts.n_attrs)
    for name, path in (opts.files or {}).items():
        recs = read_recall_jsonl(path)[: opts.limit] if opts.limit else read_recall_jsonl(path)
        tasks[name] = {**score_recall(subject, recs, opts.max_new_tokens, opts.batch_size), "file": str(path)}
    acc = {k: v["accuracy"] for k, v in tasks.items()}
    return {
        "seed": opts.seed,
        "mean_accuracy": sum(acc.values()) / len(acc),
        **{f"{k}_accuracy": v for k, v in acc.items()},
        "tasks": tasks,
        "accuracy": acc,
    }
