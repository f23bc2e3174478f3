"""lm-evaluation-harness (EleutherAI, Gao et al.) adapter: the ``basecap`` model class.

``BasecapLM`` implements lm-eval's model contract over a basecap run: ``loglikelihood`` (batched:
requests sorted by length, right-padded, each scored only on its own positions, which is exact for
causal models), ``loglikelihood_rolling`` (disjoint windows of the model's context, every token
scored once) and ``generate_until`` (greedy, stateful: prefill, then one token at a time with the
mixer states; equal-length prompts decode as one batch).

lm-eval 0.4.x finds models only in its own registry (no entry-point plugins), so the class is
registered when this module is imported, and ``python -m basecap.eval.harness ARGS`` is lm-eval's
own command line with the registration and basecap's task folder added::

    python -m basecap.eval.harness --model basecap --model_args path=RUN_DIR --tasks basecap_smoke

Everything runs offline: ``HF_HUB_OFFLINE`` and ``HF_DATASETS_OFFLINE`` are set before lm-eval
and datasets are imported; a task whose dataset is not in the local cache fails with a message
that names the dataset.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
import re
import shutil
import string
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

try:
    import lm_eval.models  # noqa: F401 - registers lm-eval's own models (hf, ...) before ours; lm-eval only

    # auto-loads them while its registry is empty
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("the lm-eval suite needs lm-evaluation-harness: pip install 'lm-eval==0.4.13'") from e

from ..config_base import ConfigError
from .recall import answer_contained
from .suites import Subject, greedy_generate, load_subject


class LMEvalDataError(RuntimeError):
    """A task's dataset is not available offline."""


@register_model("basecap")
class BasecapLM(TemplateLM):
    """A basecap model for lm-eval. ``model_args``: ``path`` (run directory), ``batch_size``,
    ``max_length`` (default: the run's training context), ``max_gen_toks`` (default 256),
    ``device`` (default: where the model is)."""

    def __init__(
        self,
        path: str | None = None,
        subject: Subject | None = None,
        batch_size: int | str = 8,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        device: str | None = None,
        **_ignored: Any,
    ) -> None:
        super().__init__()
        if subject is None:
            if path is None:
                raise ConfigError("model_args needs path=RUN_DIR (a basecap run directory)")
            subject = load_subject(path)
        if device and (not str(device).startswith("cuda") or torch.cuda.is_available()):
            subject.model.to(device)  # lm-eval's CLI passes its default device (cuda) even on CPU machines
        self.subject = subject
        self.model = subject.model.eval()
        self.tokenizer = subject.tokenizer
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        self.max_length = int(max_length or subject.seq_len or subject.model.cfg.max_seq_len)
        max_positions = subject.max_positions()
        if max_positions is not None:
            self.max_length = min(self.max_length, max_positions)
        self.max_gen_toks = int(max_gen_toks)
        self._device = subject.device

    # ---- tokenisation ------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        if self.subject.eot_id is None:
            raise ConfigError(f"{self.subject.name}: no end-of-text id (a subject without a corpus needs eot_id)")
        return self.subject.eot_id

    @property
    def tokenizer_name(self) -> str:
        return f"basecap-{self.subject.name}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.subject.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.subject.decode(tokens)

    # ---- scoring ------------------------------------------------------------------------
    @torch.no_grad()
    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), continuation is the greedy output) per pair."""
        items = []
        for ctx, cont in pairs:
            whole = (ctx + cont)[-(self.max_length + 1) :]
            n_cont = min(len(cont), len(whole) - 1)
            items.append((whole[:-1], whole[-n_cont:] if n_cont else []))
        order = sorted(range(len(items)), key=lambda i: -len(items[i][0]))
        out: list[tuple[float, bool] | None] = [None] * len(items)
        dev = self._device
        for s in range(0, len(order), self.batch_size):
            chunk = order[s : s + self.batch_size]
            T = len(items[chunk[0]][0])
            x = torch.full((len(chunk), T), self.eot_token_id, dtype=torch.long, device=dev)
            for r, i in enumerate(chunk):
                inp = items[i][0]
                x[r, : len(inp)] = torch.tensor(inp, dtype=torch.long)
            logits, _ = self.model(x)
            logp = F.log_softmax(logits.float(), dim=-1)  # [B, T, V]
            for r, i in enumerate(chunk):
                inp, cont = items[i]
                if not cont:
                    out[i] = (0.0, True)
                    continue
                pos = torch.arange(len(inp) - len(cont), len(inp), device=dev)
                tgt = torch.tensor(cont, dtype=torch.long, device=dev)
                lp = logp[r, pos]  # [n, V]
                out[i] = (float(lp.gather(-1, tgt[:, None]).sum()), bool((lp.argmax(-1) == tgt).all()))
        return out  # type: ignore[return-value]

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        res = self._score([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), r in zip(requests, res):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, r)
        return res

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        pairs, owner = [], []
        for k, req in enumerate(requests):
            (text,) = req.args
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1
            )
            for ctx, cont in map(make_disjoint_window, windows):
                pairs.append((list(ctx), list(cont)))
                owner.append(k)
        totals = [0.0] * len(requests)
        for k, (lp, _) in zip(owner, self._score(pairs)):
            totals[k] += lp
        for req, t in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, t)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        groups: dict[tuple, list[int]] = {}
        prompts = []
        for k, req in enumerate(requests):
            context, kw = req.args
            kw = dict(kw or {})
            until = kw.get("until") or []
            until = tuple([until] if isinstance(until, str) else until)
            max_new = int(kw.get("max_gen_toks", self.max_gen_toks))
            ids = self.tok_encode(context) or [self.eot_token_id]
            room = max(1, self.max_length - max_new) if self.subject.max_positions() else self.max_length
            prompts.append(ids[-room:])
            groups.setdefault((until, max_new), []).append(k)
        out: list[str | None] = [None] * len(requests)
        for (until, max_new), idxs in groups.items():
            texts = greedy_generate(self.subject, [prompts[k] for k in idxs], max_new, stop=until, batch_size=self.batch_size)
            for k, t in zip(idxs, texts):
                out[k] = t
                self.cache_hook.add_partial("generate_until", requests[k].args, t)
        return out  # type: ignore[return-value]


def contains_results(doc: dict, results: list[str]) -> dict:
    """lm-eval ``process_results`` for generation tasks: 1 if any reference answer is contained in
    the output (case and surrounding whitespace ignored), as in the Based recall suite."""
    answers = doc.get("answers", doc.get("answer", doc.get("value")))
    return {"contains": float(answer_contained(results[0], answers))}


# ---- tasks ---------------------------------------------------------------------------------
def shipped_task_dir() -> Path:
    return Path(__file__).with_name("tasks")


def prepare_task_dir(dest: str | Path | None = None) -> Path:
    """Copy basecap's task YAMLs and their jsonl into ``dest`` (default: ``$BASECAP_HOME/lm_eval_tasks``)
    with ``data_files`` made absolute, because lm-eval resolves them against the working directory."""
    if dest is None:
        from ..data import data_home

        dest = data_home() / "lm_eval_tasks"
    dest = Path(dest)
    src = shipped_task_dir()
    (dest / "data").mkdir(parents=True, exist_ok=True)
    for f in (src / "data").glob("*.jsonl"):
        target = dest / "data" / f.name
        if not target.exists() or target.read_bytes() != f.read_bytes():
            shutil.copyfile(f, target)
    for y in src.glob("*.yaml"):
        text = re.sub(r"(\n\s+\w+: )data/", lambda m: f"{m.group(1)}{(dest / 'data').resolve()}/", y.read_text())
        target = dest / y.name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    return dest


def _task_template(name: str) -> string.Template:
    """A generated task's YAML from ``tasks/templates/`` (``$domain`` and ``$path`` filled in by the caller)."""
    return string.Template((shipped_task_dir() / "templates" / f"{name}.yaml").read_text(encoding="utf-8"))


def _quoted_path(path: Path) -> str:
    return json.dumps(str(path.resolve()))  # a YAML double-quoted scalar


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def write_corpus_tasks(
    subject: Subject, dest: str | Path | None = None, n_docs: int = 64, n_extraction: int = 64, split: str = "test", seed: int = 0
) -> Path:
    """lm-eval tasks generated from the run's corpus (deterministic by seed): ``basecap_ppl_<domain>``
    (rolling perplexity of ``n_docs`` held-out documents per domain) and ``basecap_extraction`` (the
    recall suite's structured-extraction task); tag ``basecap_corpus`` selects them all."""
    import random

    import numpy as np

    from .recall import builtin_extraction

    corpus = subject.corpus
    if corpus is None:
        raise ConfigError("basecap_ppl_* / basecap_extraction tasks need the run's corpus")
    if dest is None:
        from ..data import data_home

        dest = data_home() / "lm_eval_tasks" / f"corpus-{getattr(corpus, 'name', 'corpus')}-s{seed}"
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for d in corpus.domains:
        toks = np.asarray(corpus.tokens(d, split))
        cuts = np.flatnonzero(toks == corpus.eot_id)
        docs = [toks[a + 1 : b] for a, b in zip(np.r_[-1, cuts[:-1]], cuts) if b > a + 1]
        pick = sorted(random.Random(f"{seed}-{d}").sample(range(len(docs)), min(n_docs, len(docs))))
        lines = "".join(json.dumps({"text": corpus.tokenizer.decode(docs[i].tolist())}) + "\n" for i in pick)
        _write_if_changed(dest / f"ppl_{d}.jsonl", lines)
        task = _task_template("basecap_ppl").substitute(domain=d, path=_quoted_path(dest / f"ppl_{d}.jsonl"))
        _write_if_changed(dest / f"basecap_ppl_{d}.yaml", task)
    ctx = max(32, (subject.seq_len or subject.model.cfg.max_seq_len) // 2)
    recs = builtin_extraction(subject, n_extraction, seed, ctx, domain=None, split=split, n_records=2, n_attrs=4)
    lines = "".join(json.dumps({k: r[k] for k in ("context", "question", "answers")}) + "\n" for r in recs)
    _write_if_changed(dest / "extraction.jsonl", lines)
    task = _task_template("basecap_extraction").substitute(path=_quoted_path(dest / "extraction.jsonl"))
    _write_if_changed(dest / "basecap_extraction.yaml", task)
    return dest


def _dataset_of(manager: Any, name: str, seen: set[str] | None = None) -> list[tuple[str, str | None, object]]:
    """(dataset path, config name, data_files) of every dataset a task, group or tag reads."""
    seen = seen if seen is not None else set()
    if name in seen:
        return []
    seen.add(name)
    entry = manager.task_index.get(name)
    cfg = (entry.cfg if entry is not None else None) or {}
    if "dataset_path" in cfg:
        return [(cfg["dataset_path"], cfg.get("dataset_name"), (cfg.get("dataset_kwargs") or {}).get("data_files"))]
    task = cfg.get("task")
    subs: list = task if isinstance(task, list) else []
    if entry is not None and not subs:
        subs = [n for n, e in manager.task_index.items() if name in getattr(e, "tags", set())]
    out = []
    for s in subs:
        out += _dataset_of(manager, s if isinstance(s, str) else s.get("task", ""), seen)
    return out


def task_manager(tasks: list[str], include_path: str | list[str] | None = None) -> Any:
    """A TaskManager over basecap's tasks and ``include_path``; lm-eval's own ~15k task configs are
    indexed (seconds) only when a requested task is not found in those folders."""
    from lm_eval.tasks import TaskManager

    paths = [str(prepare_task_dir())] + (
        [str(p) for p in include_path] if isinstance(include_path, (list, tuple)) else [str(include_path)] if include_path else []
    )
    tm = TaskManager(include_path=paths, include_defaults=False)
    if any(t not in tm.all_tasks for t in tasks):
        tm = TaskManager(include_path=paths)
    unknown = [t for t in tasks if t not in tm.all_tasks and not Path(t).exists()]
    if unknown:
        raise ConfigError(
            f"unknown lm-eval task(s) {unknown}; see `lm-eval ls tasks` or basecap's tasks: "
            + ", ".join(n for n in tm.all_tasks if n.startswith("basecap"))
        )
    return tm


def check_datasets(tm: Any, tasks: list[str]) -> None:
    """Load each task once so a missing offline dataset fails here, naming it and where it goes."""
    for t in tasks:
        try:
            tm.load([t])
        except Exception as e:  # datasets raises many types (offline, not found, connection)
            needs = _dataset_of(tm, t)
            names = "; ".join(f"{p}" + (f" / {n}" if n else "") + (f" (data_files {f})" if f else "") for p, n, f in needs)
            fetch = "; ".join(f"datasets.load_dataset({p!r}" + (f", {n!r}" if n else "") + ")" for p, n, f in needs[:3] if not f)
            hub = os.environ.get("HF_HUB_CACHE", "~/.cache/huggingface/hub")
            cache = os.environ.get("HF_DATASETS_CACHE", "~/.cache/huggingface/datasets")
            raise LMEvalDataError(
                f"lm-eval task {t!r} could not load its data offline ({type(e).__name__}: {str(e)[:300]}).\n"
                f"It reads: {names or '(unknown dataset)'}.\n"
                + (
                    f"On a machine with internet run `python -c \"import datasets; {fetch}\"`, then copy its Hugging Face "
                    f"caches (datasets: {cache}; hub: {hub}) to the same places here. "
                    if fetch
                    else "Check that the data_files exist (lm-eval reads relative paths from the working directory). "
                )
                + "See docs/evaluation.md."
            ) from e


def run_lm_eval(
    run_dir: str | Path | Subject,
    tasks: list[str] | str,
    *,
    num_fewshot: int | None = None,
    limit: int | float | None = None,
    batch_size: int = 8,
    include_path: str | list[str] | None = None,
    seed: int = 1234,
    bootstrap_iters: int = 1000,
    max_length: int | None = None,
    log_samples: bool = False,
) -> dict:
    """Evaluate a run (directory or ``Subject``) on lm-eval tasks; returns ``{"results", "n_samples",
    "config", ...}`` from lm-eval (JSON-serialisable)."""
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable

    tasks = [t for item in ([tasks] if isinstance(tasks, str) else tasks) for t in item.split(",") if t]
    if not tasks:
        raise ConfigError("lm-eval: no tasks given")
    subject = run_dir if isinstance(run_dir, Subject) else load_subject(run_dir)
    if any(t.startswith(("basecap_ppl_", "basecap_extraction", "basecap_corpus")) for t in tasks):
        extra = [str(write_corpus_tasks(subject, seed=0))]
        include_path = extra + (
            [str(p) for p in include_path] if isinstance(include_path, (list, tuple)) else [str(include_path)] if include_path else []
        )
    tm = task_manager(tasks, include_path)
    check_datasets(tm, tasks)
    lm = BasecapLM(subject=subject, batch_size=batch_size, max_length=max_length)
    res = simple_evaluate(
        model=lm,
        tasks=tasks,
        num_fewshot=num_fewshot,
        limit=limit,
        task_manager=tm,
        batch_size=batch_size,
        log_samples=log_samples,
        bootstrap_iters=bootstrap_iters,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    keep = {
        k: res[k]
        for k in ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "samples")
        if k in res
    }
    return json.loads(json.dumps(keep, default=handle_non_serializable))


def lm_eval_suite(
    subject: Subject,
    out_dir: Path,
    *,
    tasks: list[str] | str = "basecap_smoke",
    num_fewshot: int | None = None,
    limit: int | float | None = None,
    batch_size: int = 8,
    include_path: str | list[str] | None = None,
    seed: int = 1234,
    max_length: int | None = None,
) -> dict:
    res = run_lm_eval(
        subject, tasks, num_fewshot=num_fewshot, limit=limit, batch_size=batch_size, include_path=include_path, seed=seed, max_length=max_length
    )
    summary = {t: {k.split(",")[0]: v for k, v in m.items() if k not in ("alias", "name") and "stderr" not in k} for t, m in res["results"].items()}
    return {"tasks": tasks, "num_fewshot": num_fewshot, "limit": limit, "summary": summary, **res}


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line with the ``basecap`` model registered and basecap's tasks included."""
    from lm_eval.__main__ import cli_evaluate

    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"run", "ls", "validate"}
    if argv and argv[0] not in commands and not argv[0].startswith("-h"):
        argv.insert(0, "run")
    if argv and argv[0] in ("run", "ls", "validate") and "--include_path" not in argv:
        argv += ["--include_path", str(prepare_task_dir())]
    old = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        cli_evaluate()
    except Exception:
        tasks = [t for v in _flag_values(argv, "--tasks", "-t") for t in v.split(",") if t]
        if argv[0] == "run" and tasks:  # name the dataset if that is what failed
            check_datasets(task_manager(tasks, _flag_values(argv, "--include_path")), tasks)
        raise
    finally:
        sys.argv = old


def _flag_values(argv: list[str], *flags: str) -> list[str]:
    out = []
    for i, a in enumerate(argv):
        if a in flags:
            out += _until_flag(argv[i + 1 :])
        elif any(a.startswith(f + "=") for f in flags):
            out.append(a.split("=", 1)[1])
    return out


def _until_flag(rest: list[str]) -> list[str]:
    vals = []
    for v in rest:
        if v.startswith("-"):
            break
        vals.append(v)
    return vals


if __name__ == "__main__":
    main()
