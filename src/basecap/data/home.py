"""The data home's built corpora, opened by key and verified; reading them never builds anything.

A run directory records the corpus it was trained on (``run.json``: ``corpus.dir``, ``<recipe>-<key>``).
Evaluation, export and the lm-eval model open that folder in the data home as it stands: when it is
absent they fail with the ``basecap data build`` command that makes it, instead of fetching the
sources a recipe names (docs/security.md). ``verify_corpus`` checks every token shard against the
sizes and SHA-256 hashes the manifest recorded (``basecap data verify``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from pathlib import Path

from .build import data_home
from .corpus import Corpus
from .recipe import SPLITS

# <recipe name>-<the first 16 hex digits of the cache key>: a plain folder name, never a path
CORPUS_DIR = re.compile(r"[a-z0-9][a-z0-9_\-]*-[0-9a-f]{16}")


class CorpusMissing(FileNotFoundError):
    """The corpus a run was trained on is not in the data home."""


def open_built_corpus(name: str | None, recipe: str, home: str | os.PathLike | None = None) -> Corpus:
    """The built corpus folder ``name`` (as ``run.json`` records it) in the data home; never builds.
    ``recipe`` only goes into the message that says how to build it."""
    build = f"basecap data build {shlex.quote(str(recipe))}"
    if not isinstance(name, str) or not CORPUS_DIR.fullmatch(name):
        raise CorpusMissing(
            f"the run names no valid corpus folder ({name!r}); build its corpus with: {build}, "
            "then evaluate with the corpus passed explicitly (Python API)"
        )
    corpora = data_home(home) / "corpora"
    folder = corpora / name
    if not (folder / "manifest.json").is_file():
        raise CorpusMissing(
            f"corpus {name} is not in the data home ({corpora}); reading a run directory never builds one. "
            f"Build it with: {build} (from the recipe the run was trained on: its key starts {name.rsplit('-', 1)[1]}), "
            "or set BASECAP_HOME to the data home that holds it"
        )
    corpus = Corpus(folder)
    if not str(corpus.manifest.get("key", "")).startswith(name.rsplit("-", 1)[1]):
        raise CorpusMissing(f"{folder}: its manifest's key does not match the folder name; rebuild it with: {build}")
    return corpus


def run_corpus(info: dict, home: str | os.PathLike | None = None) -> Corpus:
    """The corpus recorded in a run directory's ``run.json`` (``info``), opened from the data home."""
    recipe = ((info.get("config") or {}).get("data") or {}).get("recipe", "<recipe>")
    return open_built_corpus((info.get("corpus") or {}).get("dir"), recipe, home)


def verify_corpus(corpus: Corpus, log=print) -> list[str]:
    """Check every token shard's size and SHA-256 against the manifest; returns the problems (empty: good)."""
    problems = []
    for d in corpus.domains:
        for split in SPLITS:
            info = corpus.split_info(d, split)
            path = corpus.dir / info["file"]
            want = info["tokens"] * corpus.dtype.itemsize
            if not path.is_file():
                problems.append(f"{path}: missing")
                continue
            if path.stat().st_size != want:
                problems.append(f"{path}: {path.stat().st_size} bytes, the manifest records {want} ({info['tokens']} tokens)")
                continue
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            if digest != info["sha256"]:
                problems.append(f"{path}: SHA-256 {digest} differs from the manifest's {info['sha256']}")
            else:
                log(f"  ok  {d}/{split}: {info['tokens']:,} tokens")
    tok = corpus.tokenizer_path
    want_tok = corpus.manifest["tokenizer"].get("sha256")
    if want_tok and (not tok.is_file() or hashlib.sha256(tok.read_bytes()).hexdigest() != want_tok):
        problems.append(f"{tok}: missing or its SHA-256 differs from the manifest's")
    return problems


def corpus_for_verify(target: str, home: str | os.PathLike | None = None) -> Corpus:
    """``basecap data verify`` takes a corpus folder, or a recipe whose corpus is then looked up (never built):
    the newest built corpus of that recipe's name in the data home."""
    p = Path(target).expanduser()
    if (p / "manifest.json").is_file():
        return Corpus(p, check_sizes=False)  # verify reports every damaged shard itself
    from .recipe import load_recipe

    name = load_recipe(target).name
    corpora = data_home(home) / "corpora"
    built = sorted(
        (c for c in corpora.glob(f"{name}-*") if CORPUS_DIR.fullmatch(c.name) and (c / "manifest.json").is_file()),
        key=lambda c: (c / "manifest.json").stat().st_mtime,
    )
    if not built:
        raise CorpusMissing(f"no built corpus of recipe {name!r} in {corpora}; build it with: basecap data build {shlex.quote(target)}")
    return Corpus(built[-1], check_sizes=False)
