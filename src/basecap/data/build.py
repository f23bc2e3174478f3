"""Build a corpus from a recipe: select, de-duplicate, split, tokenise, shard; cache by content.

The corpus folder is ``<home>/corpora/<recipe>-<key>`` where the key hashes the validated recipe,
every source's content fingerprint and the pipeline version, so equal inputs give the same folder
and a second build is a no-op. A build writes into ``.tmp-<recipe>-<key>`` (one build at a time,
under a lock) renamed into place at the end: an interrupted build never leaves a folder that looks
complete, and its committed work (the trained tokenizer, tokenised units) is picked up by the next
build of the same corpus. Tokenisation runs in worker processes (``tokenize.py``).

Reading the sources into a selection is ``collect.py``: selected documents' text is spooled to disk
in ``work/spool`` as it is read, and memory holds only a small record per document, so a corpus may
be far larger than RAM. Workers read their units' texts from the spool.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..atomic import write_json
from .collect import COLLECTED, Spool, collect, load_collected, save_collected
from .corpus import MANIFEST_FORMAT, Corpus
from .recipe import SPLITS, BPETokenizerConfig, RecipeConfig, load_recipe
from .source_base import DataError, PreparedSource
from .sources import prepare_source
from .text import split_key
from .tokenize import (
    FileTexts,
    Unit,
    load_unit,
    load_unit_lengths,
    plan_units,
    read_spans,
    run_units,
    usable_cpus,
)
from .tokenizer import EOT, load_tokenizer, train_bpe

PIPELINE_VERSION = 1


def data_home(home: str | os.PathLike | None = None) -> Path:
    """``home`` if given, else ``$BASECAP_HOME``, else the user cache folder for basecap."""
    if home is None:
        home = os.environ.get("BASECAP_HOME")
    if home is None:
        import platformdirs

        home = platformdirs.user_cache_dir("basecap")
    return Path(home).expanduser()


def _cache_key(recipe: RecipeConfig, prepared: list[PreparedSource], tok_fp: str) -> str:
    dumped = recipe.model_dump(mode="json", exclude={"build"})
    if isinstance(dumped.get("tokenizer"), dict) and dumped["tokenizer"].get("train_domains") is None:
        dumped["tokenizer"].pop("train_domains", None)  # absent = every domain: corpora built before the option keep their key
    blob = {
        "pipeline": PIPELINE_VERSION,
        "recipe": dumped,
        "sources": [[p.id, p.status, p.fingerprint] for p in prepared],
        "tokenizer_file": tok_fp,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


@contextmanager
def _locked(path: Path, log):
    """An exclusive lock on ``path`` (POSIX); waits while another build of the same corpus runs."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here: builds of one corpus must not overlap
        yield
        return
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another build of {path.name.removeprefix('.lock-')} to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove_stale(corpora: Path) -> None:
    """Work folders of builds killed more than a week ago (and not being resumed now)."""
    for stale in corpora.glob(".tmp-*"):
        if time.time() - stale.stat().st_mtime < 7 * 86400:
            continue
        lock = corpora / f".lock-{stale.name.removeprefix('.tmp-')}"
        try:
            import fcntl

            with open(lock, "a+") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(stale, ignore_errors=True)
        except ImportError:
            shutil.rmtree(stale, ignore_errors=True)
        except BlockingIOError:
            continue


def build_corpus(
    recipe: RecipeConfig | str,
    home: str | os.PathLike | None = None,
    log: Callable[[str], None] = print,
    workers: int | None = None,
    progress: bool | None = None,
) -> Corpus:
    """Build the corpus of ``recipe`` in the data home, or reuse it when it is already built.

    ``workers``: tokenising processes (default: the recipe's ``build.workers``, else the usable CPU
    count); the corpus does not depend on it. ``progress``: a progress bar on stderr (default: when
    stderr is a terminal). An interrupted build resumes from its committed work when run again.
    """
    if not isinstance(recipe, RecipeConfig):
        recipe = load_recipe(recipe)
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    workers = workers or recipe.build.workers or usable_cpus()
    home = data_home(home)
    corpora = home / "corpora"
    corpora.mkdir(parents=True, exist_ok=True)
    _remove_stale(corpora)
    log(f"corpus recipe {recipe.name!r}: checking {len(recipe.sources)} sources")
    prepared = [prepare_source(s, i, home, log) for i, s in enumerate(recipe.sources)]
    tok_fp = ""
    if not isinstance(recipe.tokenizer, BPETokenizerConfig):
        load_tokenizer(recipe.tokenizer.path, recipe.tokenizer.eot_token)
        tok_fp = hashlib.sha256(Path(recipe.tokenizer.path).read_bytes()).hexdigest()
    key = _cache_key(recipe, prepared, tok_fp)
    target = corpora / f"{recipe.name}-{key[:16]}"
    with _locked(corpora / f".lock-{target.name}", log):
        if (target / "manifest.json").is_file():
            log(f"corpus {target.name}: up to date, nothing to build ({target})")
            return Corpus(target)
        if target.exists():  # a folder without a manifest was never completed by us
            shutil.rmtree(target)
        t0 = time.perf_counter()
        tmp = corpora / f".tmp-{target.name}"
        if (tmp / "work").is_dir():
            log(f"corpus {target.name}: resuming an interrupted build ({tmp})")
        elif tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(exist_ok=True)
        try:
            _build_into(tmp, recipe, prepared, key, log, workers, progress=progress)
        except BaseException:
            work = tmp / "work"
            if not ((work / COLLECTED).is_file() or (work / "tokenizer.json").is_file() or any(work.rglob("*.npz"))):
                shutil.rmtree(tmp, ignore_errors=True)  # nothing worth resuming
            else:
                log(f"corpus {target.name}: build stopped; its finished work is kept in {tmp} and the next build of this corpus resumes from it")
            raise
        os.rename(tmp, target)
    log(f"corpus {target.name}: built in {time.perf_counter() - t0:.1f} s ({target})")
    return Corpus(target)


def _assign_splits(u: np.ndarray, ntok: np.ndarray, recipe: RecipeConfig) -> np.ndarray:
    """0 train, 1 validation, 2 test: by hash fraction, topped up to the minimum token counts.

    Documents are taken in split-key order; each held-out split takes every document under its
    fraction, then more until it holds its minimum tokens, but never past a third of the domain.
    """
    sp = recipe.splits
    total = int(ntok.sum())
    out = np.zeros(len(u), dtype=np.int8)
    order = np.argsort(u, kind="stable")
    i = 0
    for code, hi, need in ((1, sp.validation, sp.min_validation_tokens), (2, sp.validation + sp.test, sp.min_test_tokens)):
        need, got = min(need, total // 3), 0
        while i < len(order) and (u[order[i]] < hi or got < need):
            out[order[i]] = code
            got += int(ntok[order[i]])
            i += 1
    return out


def _build_into(
    out: Path, recipe: RecipeConfig, prepared: list[PreparedSource], key: str, log, workers: int = 1, *, progress: bool | None = None
) -> None:
    """Collect, train or copy the tokenizer, tokenise, write the shards, then the manifest (last)."""
    work = out / "work"
    work.mkdir(exist_ok=True)
    selected, dup, spool = _selection(work, recipe, prepared, log, progress)
    skipped_domains = _drop_empty_domains(selected, recipe, prepared, log)

    tok_info, eot_token = _tokenizer(out, work, recipe, selected, spool, log)
    tok, eot_id = load_tokenizer(out / "tokenizer.json", eot_token)
    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 65535 else np.uint32
    tok_sha = tok_info.pop("sha256")
    tok_info.update(vocab_size=vocab, eot_token=eot_token, eot_id=eot_id, sha256=tok_sha)

    keys = {d: np.array([split_key(dg) for dg, _, _ in items]) for d, items in selected.items()}
    units = {}
    for d, items in selected.items():
        order = np.argsort(keys[d], kind="stable")
        units[d] = plan_units(d, [dg for dg, _, _ in items], [n for _, n, _ in items], order, tok_sha + np.dtype(dtype).name, recipe.build.unit_bytes)

    def texts(u: Unit) -> FileTexts:  # locations only: the worker reads the text
        items = selected[u.group]
        return FileTexts(str(spool.path(u.group)), tuple((items[i][2].offset, items[i][1]) for i in u.docs))

    t0 = time.perf_counter()
    run_units(
        [u for us in units.values() for u in us],
        texts,
        work / "units",
        out / "tokenizer.json",
        eot_token,
        eot_id,
        dtype=dtype,
        workers=workers,
        progress=progress,
        log=log,
    )
    log(f"  tokenised in {time.perf_counter() - t0:.1f} s")

    domains_info = _write_domains(out, selected, dup, keys, units, work / "units", recipe=recipe, log=log)
    manifest = {
        "format": MANIFEST_FORMAT,
        "pipeline_version": PIPELINE_VERSION,
        "key": key,
        "recipe_name": recipe.name,
        "recipe": recipe.model_dump(mode="json", exclude={"build"}),
        "dtype": np.dtype(dtype).name,
        "tokenizer": tok_info,
        "splits": list(SPLITS),
        "domains": domains_info,
        "skipped_domains": skipped_domains,
        "sources": _source_entries(prepared, selected),
    }
    shutil.rmtree(work)  # the finished corpus holds no work files (units, spool); the manifest comes last
    write_json(out / "manifest.json", manifest)


def _selection(work: Path, recipe: RecipeConfig, prepared: list[PreparedSource], log, progress: bool | None) -> tuple[dict, Counter, Spool]:
    """Every domain's selected documents, the duplicates removed per domain, and the spool of their texts:
    read from the sources, or reused from an interrupted build that had read them all."""
    done = work / COLLECTED
    if done.is_file():
        spool = Spool(work / "spool", reuse=True)
        selected, dup = load_collected(done, prepared)
        log(f"  sources already read (resumed): {sum(len(v) for v in selected.values())} documents selected")
    else:
        spool = Spool(work / "spool")
        selected, dup = collect(recipe, prepared, log, progress, spool=spool)
        save_collected(done, selected, dup, prepared)
    return selected, dup, spool


def _drop_empty_domains(selected: dict, recipe: RecipeConfig, prepared: list[PreparedSource], log) -> dict[str, str]:
    """Remove the domains without documents from ``selected``; a required one is an error. Returns the reasons."""
    skipped = {}
    for d, items in list(selected.items()):
        if not items:
            srcs = [p.id for p in prepared if d in _targets(p)]
            if not recipe.domains[d].optional:
                raise DataError(f"domain {d!r} has no documents (sources: {srcs}); install its sources or mark the domain optional")
            skipped[d] = f"no documents (sources: {', '.join(srcs)})"
            log(f"  domain {d}: skipped, no documents from {srcs}")
            del selected[d]
    return skipped


def _write_domains(out: Path, selected: dict, dup: Counter, keys: dict, units: dict, folder: Path, *, recipe: RecipeConfig, log) -> dict:
    """Every domain's shards and rows of ``documents.tsv``; returns the manifest's ``domains`` entry."""
    (out / "tokens").mkdir(exist_ok=True)
    domains_info = {}
    with open(out / "documents.tsv", "w", encoding="utf-8") as tsv:
        tsv.write("domain\tsplit\tdigest\tbytes\ttokens\tsource\torigin\n")
        for d, items in selected.items():
            info: dict[str, Any] = {
                "role": recipe.domains[d].role,
                "description": recipe.domains[d].description,
                "duplicates_removed": dup[d],
                "splits": {},
            }
            info["splits"] = _write_shards(out, d, items, keys[d], units[d], folder, recipe=recipe, log=log, tsv=tsv)
            info["documents"] = len(items)
            info["bytes"] = sum(n for _, n, _ in items)
            info["tokens"] = sum(s["tokens"] for s in info["splits"].values())
            domains_info[d] = info
    log(f"  {sum(i['tokens'] for i in domains_info.values()) / 1e6:.2f} M tokens in {sum(len(u) for u in units.values())} units")
    return domains_info


def _source_entries(prepared: list[PreparedSource], selected: dict) -> list[dict]:
    """The manifest's ``sources``: what each source is, what was read from it and how much was selected."""
    selected_by_source = Counter(rec.source for items in selected.values() for _, _, rec in items)
    selected_bytes: Counter = Counter()
    for items in selected.values():
        for _, n, rec in items:
            selected_bytes[rec.source] += n
    sources = []
    for p in prepared:
        c = p.config
        entry = {"id": p.id, "kind": c.kind, "domains": sorted(_targets(p)), "license": c.license, "status": p.status}
        if p.status == "ok":
            entry.update(
                origin=p.origin,
                sha256=p.fingerprint,
                files=p.stats["files"],
                documents_read=p.stats["records"],
                empty=p.stats["empty"],
                duplicates=p.stats["duplicates"],
                bytes_read=p.stats["bytes_read"],
                bad_bytes=p.stats["bad_bytes"],
                docs_with_bad_bytes=p.stats["docs_with_bad_bytes"],
                malformed=p.stats["malformed"],
                unreadable_files=p.stats["unreadable_files"],
                oversized=p.stats["oversized"],
                documents_selected=selected_by_source[p.id],
                bytes_selected=selected_bytes[p.id],
            )
            if p.unmapped:
                entry["unmapped"] = dict(sorted(p.unmapped.items()))
        else:
            entry["reason"] = p.reason
        sources.append(entry)
    return sources


def _tokenizer(out: Path, work: Path, recipe: RecipeConfig, selected: dict, spool: Spool, log) -> tuple[dict, str]:
    """Train (or reuse from ``work``) the BPE, or copy the given tokenizer, to ``out/tokenizer.json``."""
    tcfg = recipe.tokenizer
    if not isinstance(tcfg, BPETokenizerConfig):
        shutil.copyfile(tcfg.path, out / "tokenizer.json")
        info: dict[str, Any] = {"kind": "file", "source_path": str(tcfg.path)}
        eot_token = tcfg.eot_token
    else:
        cut = recipe.splits.validation + recipe.splits.test
        spans: dict[str, list] = {}  # per domain: the first documents' (offset, bytes), the last one cut
        sample_bytes: dict[str, int] = {}
        for d, items in selected.items():
            if tcfg.train_domains is not None and d not in tcfg.train_domains:
                continue  # the control: a BPE that has seen only the training domains
            pool = [x for x in items if split_key(x[0]) >= cut] or items
            spans[d], room = [], tcfg.sample_bytes_per_domain
            for _, n, rec in pool:
                if room <= 0:
                    break
                spans[d].append((rec.offset, min(n, room)))
                room -= min(n, room)
            sample_bytes[d] = tcfg.sample_bytes_per_domain - room
        done = work / "tokenizer.json"
        if done.is_file():
            log("  tokenizer: reusing the one trained by the interrupted build")
        else:
            t0 = time.perf_counter()
            sample = [
                raw.decode("utf-8", errors="ignore")  # a cut may split a character
                for d, sp in spans.items()
                for raw in read_spans(spool.path(d), sp)
            ]
            tok = train_bpe(sample, tcfg.vocab_size, tcfg.min_frequency, length=len(sample))
            tok.save(str(work / "tokenizer.json.tmp"))
            os.replace(work / "tokenizer.json.tmp", done)
            log(
                f"  tokenizer: byte-level BPE, vocab {tok.get_vocab_size()}, trained on "
                f"{sum(sample_bytes.values()) / 1e6:.1f} MB ({time.perf_counter() - t0:.1f} s)"
            )
        shutil.copyfile(done, out / "tokenizer.json")
        info = {"kind": "bpe", "trained_on_bytes": sample_bytes, **({"train_domains": tcfg.train_domains} if tcfg.train_domains else {})}
        eot_token = EOT
    info["sha256"] = hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()
    return info, eot_token


def _write_shards(out: Path, d: str, items: list, keys: np.ndarray, units: list, folder: Path, *, recipe: RecipeConfig, log, tsv) -> dict:
    """The domain's three shards from its units (documents in split-key order within each split).

    Its rows of ``documents.tsv`` go straight to ``tsv``, not into a list as long as the domain.
    """
    ntok = np.zeros(len(items), dtype=np.int64)
    for u in units:
        ntok[list(u.docs)] = load_unit_lengths(folder / u.file)  # the splits need counts only
    split = _assign_splits(keys, ntok, recipe)
    files = {name: open(out / "tokens" / f"{d}.{name}.bin", "wb") for name in SPLITS}  # noqa: SIM115 - closed in the finally below
    hashes = {name: hashlib.sha256() for name in SPLITS}
    rows: dict[str, list] = {name: [] for name in SPLITS}
    try:
        for u in units:
            tokens, lengths = load_unit(folder / u.file)
            docs = np.asarray(u.docs, dtype=np.int64)
            for code, name in enumerate(SPLITS):
                mine = split[docs] == code
                if not mine.any():
                    continue
                part = tokens[np.repeat(mine, lengths + 1)].tobytes()
                files[name].write(part)
                hashes[name].update(part)
                rows[name] += [int(i) for i in docs[mine]]
    finally:
        for f in files.values():
            f.close()
    info = {}
    for name in SPLITS:
        idx = rows[name]
        info[name] = {
            "documents": len(idx),
            "bytes": sum(items[i][1] for i in idx),
            "tokens": int(sum(ntok[idx]) + len(idx)),
            "file": f"tokens/{d}.{name}.bin",
            "sha256": hashes[name].hexdigest(),
        }
        if not idx:
            log(f"  warning: domain {d} has an empty {name} split")
        for i in idx:
            dg, n, rec = items[i]
            origin = rec.origin.replace("\t", " ").replace("\n", " ")
            tsv.write(f"{d}\t{name}\t{dg.hex()}\t{n}\t{int(ntok[i])}\t{rec.source}\t{origin}\n")
    return info


def _targets(p: PreparedSource) -> set[str]:
    c = p.config
    t = {c.domain} if c.domain else set()
    return t | set(getattr(c, "domain_map", {}).values())
