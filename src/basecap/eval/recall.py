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
from pathlib import Path

import numpy as np
import torch

from ..data.synthetic import IGNORE, extraction_example, mqar, mqar_mixture

# ---- scoring --------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """Lower case, collapse whitespace, strip surrounding whitespace and quotes."""
    return re.sub(r"\s+", " ", str(text).lower()).strip().strip("\"'")


def answer_contained(output: str, answers) -> bool:
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


@torch.no_grad()
def eval_mqar(
    model,
    num_kv_pairs=(1, 2, 4, 8),
    seq_len: int = 32,
    vocab_size: int = 128,
    num_examples: int = 256,
    power_a: float = 0.01,
    seed: int = 0,
    batch_size: int = 64,
    token_map: torch.Tensor | None = None,
    seq_lens: dict | None = None,
) -> dict:
    """Accuracy at the query positions of the MQAR test split, per number of key-value pairs.

    ``token_map`` [vocab_size] maps MQAR ids to model token ids (to probe a pretrained LM in context);
    ``seq_lens`` maps a pair count to its own sequence length (default ``seq_len`` for all).
    """
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    acc = {}
    for k in num_kv_pairs:
        T = (seq_lens or {}).get(k, seq_len)
        data = mqar(num_examples, T, k, vocab_size, power_a, True, seed, "test")
        correct = total = 0
        for s in range(0, num_examples, batch_size):
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
        "num_examples": num_examples,
        "seq_len": seq_len,
        "vocab_size": vocab_size,
        "power_a": power_a,
        "seed": seed,
    }


def train_mqar(
    mixer_cfg: dict,
    d_model: int = 64,
    n_layers: int = 2,
    steps: int = 1000,
    batch_size: int = 32,
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    warmup_frac: float = 0.02,
    vocab_size: int = 128,
    seq_len: int = 32,
    train_kv_pairs=(1, 2, 4),
    test_kv_pairs=(1, 2, 4, 8),
    num_test: int = 256,
    power_a: float = 0.01,
    seed: int = 0,
    mlp: dict | None = None,
    device: str = "cpu",
    eval_every: int = 0,
    log=print,
) -> dict:
    """Train a fresh ``n_layers`` x ``d_model`` model of ``mixer_cfg`` on MQAR and return its test
    accuracy per number of pairs, parameter counts and recurrent state bytes.

    Each step is one batch of new sequences drawn from all ``train_kv_pairs`` settings mixed (no
    example is seen twice); AdamW with warmup and cosine decay to 10%, gradient clipping at 1.
    """
    from ..model import LM, ModelConfig

    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, max_seq_len=seq_len, mixer=dict(mixer_cfg), **({"mlp": mlp} if mlp else {})
    )
    model = LM(cfg).to(device)
    total = steps * batch_size
    per = math.ceil(total / len(train_kv_pairs))
    parts = mqar_mixture([(seq_len, k) for k in train_kv_pairs], per, vocab_size, power_a, seed, "train")
    inputs = torch.cat([p.inputs for p in parts])
    targets = torch.cat([p.targets for p in parts])
    perm = torch.from_numpy(np.random.default_rng([seed, 7]).permutation(len(inputs))[:total])
    inputs, targets = inputs[perm], targets[perm]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))
    warm = max(1, int(warmup_frac * steps))
    curve, evals = [], []
    t0 = time.time()
    model.train()
    for step in range(steps):
        f = (step + 1) / warm if step < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
        for g in opt.param_groups:
            g["lr"] = lr * f
        x = inputs[step * batch_size : (step + 1) * batch_size].to(device)
        y = targets[step * batch_size : (step + 1) * batch_size].to(device)
        loss, _ = model(x, targets=y, ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            curve.append((step, round(loss.item(), 4)))
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            evals.append({"step": step + 1, **eval_mqar(model, test_kv_pairs, seq_len, vocab_size, num_test, power_a, seed)})
    train_s = time.time() - t0
    res = eval_mqar(model, test_kv_pairs, seq_len, vocab_size, num_test, power_a, seed)
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
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "train_kv_pairs": list(train_kv_pairs),
        "params": model.param_counts(),
        "state_bytes": model.state_size(seq_len),
        "final_loss": curve[-1][1],
        "loss_curve": curve,
        "evals": evals,
        "train_seconds": round(train_s, 2),
        "tokens_per_s": round(steps * batch_size * seq_len / max(train_s, 1e-9)),
    }


def mqar_suite(
    subject,
    out_dir: Path,
    mode: str = "train",
    d_models=(64,),
    n_layers: int = 2,
    steps: int = 1000,
    batch_size: int = 32,
    lr: float = 1e-3,
    vocab_size: int = 128,
    seq_len: int = 32,
    train_kv_pairs=(1, 2, 4),
    test_kv_pairs=(1, 2, 4, 8),
    num_test: int = 256,
    seed: int = 0,
) -> dict:
    """``mode="train"``: train the run's mixer from scratch on MQAR at each width in ``d_models``
    (the architecture's recall capacity, Zoology's protocol). ``mode="pretrained"``: probe the run's
    own model in context, with MQAR ids mapped onto a fixed random set of its vocabulary."""
    from ..config_base import ConfigError

    if mode == "pretrained":
        V = subject.model.cfg.vocab_size
        ids = [i for i in range(V) if i != subject.eot_id]
        if len(ids) < vocab_size:
            raise ConfigError(f"mqar: vocab_size={vocab_size} exceeds the model's usable vocabulary {len(ids)}")
        pick = np.random.default_rng([seed, 11]).choice(ids, size=vocab_size, replace=False)
        res = eval_mqar(subject.model, test_kv_pairs, seq_len, vocab_size, num_test, seed=seed, token_map=torch.as_tensor(pick, dtype=torch.long))
        return {"mode": mode, **res}
    if mode != "train":
        raise ConfigError(f"mqar: mode must be 'train' or 'pretrained', got {mode!r}")
    mcfg = subject.model.cfg
    if mcfg.layer_mixers:
        raise ConfigError("mqar mode='train' trains one mixer type; this run is a hybrid (layer_mixers)")
    mixer = mcfg.mixer.model_dump()
    runs = [
        train_mqar(
            mixer,
            d,
            n_layers,
            steps,
            batch_size,
            lr,
            vocab_size=vocab_size,
            seq_len=seq_len,
            train_kv_pairs=train_kv_pairs,
            test_kv_pairs=test_kv_pairs,
            num_test=num_test,
            seed=seed,
            mlp=mcfg.mlp.model_dump(),
        )
        for d in d_models
    ]
    return {"mode": mode, "runs": runs, "acc_by_d_model": {r["d_model"]: r["acc"] for r in runs}}


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


def corpus_paragraphs(corpus, domain: str, split: str, rng: random.Random, n_tokens: int) -> list[str]:
    """Consecutive paragraphs (~``n_tokens`` tokens) of held-out text decoded from a random offset."""
    toks = corpus.tokens(domain, split)
    if len(toks) < 2:
        raise ValueError(f"corpus {domain}/{split} has no text")
    start = rng.randrange(max(1, len(toks) - n_tokens))
    ids = [int(t) for t in toks[start : start + n_tokens] if int(t) != corpus.eot_id]
    text = corpus.tokenizer.decode(ids)
    paras = [p.strip() for p in re.split(r"\n\s*\n|(?<=[.!?])\s+(?=[A-Z])", text) if p.strip()]
    return paras[1:-1] if len(paras) > 2 else paras  # drop the cut-off ends


def builtin_extraction(subject, n: int, seed: int, context_tokens: int, domain: str | None, split: str, n_records: int, n_attrs: int) -> list[dict]:
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


def score_recall(subject, records: list[dict], max_new_tokens: int = 16, batch_size: int = 8) -> dict:
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


def recall_suite(
    subject,
    out_dir: Path,
    files: dict | None = None,
    n: int = 32,
    seed: int = 0,
    context_tokens: int | None = None,
    domain: str | None = None,
    split: str = "test",
    n_records: int = 2,
    n_attrs: int = 4,
    max_new_tokens: int = 16,
    limit: int | None = None,
    batch_size: int = 8,
) -> dict:
    """The built-in structured-extraction task (``n`` examples of about ``context_tokens`` tokens of
    corpus text, default half the training context) plus any ``files`` {name: jsonl path} in the
    SWDE/FDA/SQuAD layouts (first ``limit`` records each)."""
    ctx = context_tokens or max(32, subject.seq_len // 2)
    tasks = {
        "extraction": score_recall(subject, builtin_extraction(subject, n, seed, ctx, domain, split, n_records, n_attrs), max_new_tokens, batch_size)
    }
    tasks["extraction"].update(context_tokens=ctx, n_records=n_records, n_attrs=n_attrs)
    for name, path in (files or {}).items():
        recs = read_recall_jsonl(path)[:limit] if limit else read_recall_jsonl(path)
        tasks[name] = {**score_recall(subject, recs, max_new_tokens, batch_size), "file": str(path)}
    acc = {k: v["accuracy"] for k, v in tasks.items()}
    return {
        "seed": seed,
        "mean_accuracy": sum(acc.values()) / len(acc),
        **{f"{k}_accuracy": v for k, v in acc.items()},
        "tasks": tasks,
        "accuracy": acc,
    }
