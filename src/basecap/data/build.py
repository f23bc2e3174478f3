"""Build a corpus from a recipe: select, de-duplicate, split, tokenise, shard; cache by content.

The corpus folder is ``<home>/corpora/<recipe>-<key>`` where the key hashes the validated recipe,
every source's content fingerprint and the pipeline version, so equal inputs give the same folder
and a second build is a no-op. A build writes into a temporary folder renamed into place at the
end: an interrupted build never leaves a folder that looks complete.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable

import numpy as np

from .corpus import MANIFEST_FORMAT, Corpus
from .recipe import SPLITS, BPETokenizerConfig, RecipeConfig, load_recipe
from .sources import DataError, PreparedSource, prepare_source, read_source
from .text import Doc, doc_digest, split_key
from .tokenizer import EOT, encode_documents, load_tokenizer, train_bpe

PIPELINE_VERSION = 1


def data_home(home: str | os.PathLike | None = None) -> Path:
    """``home`` if given, else ``$BASECAP_HOME``, else the user cache folder for basecap."""
    if home is None:
        home = os.environ.get("BASECAP_HOME")
    if home is None:
        import platformdirs

        home = platformdirs.user_cache_dir("basecap")
    return Path(home).expanduser()


class BottomK:
    """The smallest-digest documents whose UTF-8 size first reaches ``cap`` (all when cap is None).

    Streaming and exact: the kept set always equals sorting everything seen by digest and taking
    the shortest prefix that reaches the cap, so selection does not depend on reading order.
    """

    def __init__(self, cap: int | None):
        self.cap, self.total = cap, 0
        self.heap: list[tuple[int, int, bytes, Doc]] = []  # (-key, bytes, digest, doc): max-heap

    def add(self, digest: bytes, nbytes: int, doc: Doc) -> None:
        key = int.from_bytes(digest[:16], "big")
        if self.cap is not None and self.total >= self.cap and key > -self.heap[0][0]:
            return
        heapq.heappush(self.heap, (-key, nbytes, digest, doc))
        self.total += nbytes
        while self.cap is not None and self.total - self.heap[0][1] >= self.cap:
            self.total -= heapq.heappop(self.heap)[1]

    def items(self) -> list[tuple[bytes, int, Doc]]:
        return [(d, n, doc) for _, n, d, doc in sorted(self.heap, key=lambda x: x[2])]


def _cache_key(recipe: RecipeConfig, prepared: list[PreparedSource], tok_fp: str) -> str:
    blob = {
        "pipeline": PIPELINE_VERSION,
        "recipe": recipe.model_dump(mode="json"),
        "sources": [[p.id, p.status, p.fingerprint] for p in prepared],
        "tokenizer_file": tok_fp,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def build_corpus(recipe: RecipeConfig | str, home: str | os.PathLike | None = None,
                 log: Callable[[str], None] = print) -> Corpus:
    """Build the corpus of ``recipe`` in the data home, or reuse it when it is already built."""
    if not isinstance(recipe, RecipeConfig):
        recipe = load_recipe(recipe)
    home = data_home(home)
    corpora = home / "corpora"
    corpora.mkdir(parents=True, exist_ok=True)
    for stale in corpora.glob(".tmp-*"):  # left by a build killed more than a day ago
        if time.time() - stale.stat().st_mtime > 86400:
            shutil.rmtree(stale, ignore_errors=True)
    log(f"corpus recipe {recipe.name!r}: checking {len(recipe.sources)} sources")
    prepared = [prepare_source(s, i, home, log) for i, s in enumerate(recipe.sources)]
    tok_fp = ""
    if not isinstance(recipe.tokenizer, BPETokenizerConfig):
        load_tokenizer(recipe.tokenizer.path, recipe.tokenizer.eot_token)
        tok_fp = hashlib.sha256(Path(recipe.tokenizer.path).read_bytes()).hexdigest()
    key = _cache_key(recipe, prepared, tok_fp)
    target = corpora / f"{recipe.name}-{key[:16]}"
    if (target / "manifest.json").is_file():
        log(f"corpus {target.name}: up to date, nothing to build ({target})")
        return Corpus(target)
    if target.exists():  # a folder without a manifest was never completed by us
        shutil.rmtree(target)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=corpora))
    try:
        _build_into(tmp, recipe, prepared, key, log)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "manifest.json").is_file():
                raise
            log(f"corpus {target.name}: another build finished first; using it")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"corpus {target.name}: built in {time.perf_counter() - t0:.1f} s ({target})")
    return Corpus(target)


def _collect(recipe: RecipeConfig, prepared: list[PreparedSource], log) -> tuple[dict, dict]:
    """Read every source; exact de-duplication across the corpus; per-source then per-domain caps."""
    seen: set[bytes] = set()
    dup = Counter()
    domain_sel = {d: BottomK(cfg.max_bytes) for d, cfg in recipe.domains.items()}
    for prep in prepared:
        if prep.status != "ok":
            continue
        t0 = time.perf_counter()
        per_domain: dict[str, BottomK] = defaultdict(lambda: BottomK(prep.config.max_bytes))
        for doc in read_source(prep):
            digest = doc_digest(doc.text)
            if digest in seen:
                prep.stats["duplicates"] += 1
                dup[doc.domain] += 1
                continue
            seen.add(digest)
            per_domain[doc.domain].add(digest, len(doc.text.encode("utf-8")), doc)
        for domain, sel in per_domain.items():
            for digest, n, doc in sel.items():
                domain_sel[domain].add(digest, n, doc)
        s = prep.stats
        log(f"  source {prep.id}: {s['records']} documents, {s['bytes_read'] / 1e6:.1f} MB, "
            f"{s['duplicates']} duplicates, {s['bad_bytes']} bad bytes, {s['malformed']} malformed "
            f"({time.perf_counter() - t0:.1f} s)")
    return {d: sel.items() for d, sel in domain_sel.items()}, dup


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
    for code, hi, need in ((1, sp.validation, sp.min_validation_tokens),
                           (2, sp.validation + sp.test, sp.min_test_tokens)):
        need, got = min(need, total // 3), 0
        while i < len(order) and (u[order[i]] < hi or got < need):
            out[order[i]] = code
            got += int(ntok[order[i]])
            i += 1
    return out


def _build_into(out: Path, recipe: RecipeConfig, prepared: list[PreparedSource], key: str, log) -> None:
    selected, dup = _collect(recipe, prepared, log)
    skipped_domains = {}
    for d, items in list(selected.items()):
        if not items:
            srcs = [p.id for p in prepared if d in _targets(p)]
            if not recipe.domains[d].optional:
                raise DataError(f"domain {d!r} has no documents (sources: {srcs}); "
                                "install its sources or mark the domain optional")
            skipped_domains[d] = f"no documents (sources: {', '.join(srcs)})"
            log(f"  domain {d}: skipped, no documents from {srcs}")
            del selected[d]

    cut = recipe.splits.validation + recipe.splits.test
    keys = {d: np.array([split_key(dg) for dg, _, _ in items]) for d, items in selected.items()}
    tcfg = recipe.tokenizer
    t0 = time.perf_counter()
    if isinstance(tcfg, BPETokenizerConfig):
        sample, sample_bytes = [], {}
        for d, items in selected.items():
            pool = [doc for (dg, n, doc), k in zip(items, keys[d]) if k >= cut] or [x[2] for x in items]
            room = tcfg.sample_bytes_per_domain
            for doc in pool:
                if room <= 0:
                    break
                raw = doc.text.encode("utf-8")[:room]
                sample.append(raw.decode("utf-8", errors="ignore"))
                room -= len(raw)
            sample_bytes[d] = tcfg.sample_bytes_per_domain - max(room, 0)
        tok = train_bpe(sample, tcfg.vocab_size, tcfg.min_frequency, length=len(sample))
        tok.save(str(out / "tokenizer.json"))
        tok, eot_id = load_tokenizer(out / "tokenizer.json")
        tok_info = {"kind": "bpe", "trained_on_bytes": sample_bytes}
        log(f"  tokenizer: byte-level BPE, vocab {tok.get_vocab_size()}, trained on "
            f"{sum(sample_bytes.values()) / 1e6:.1f} MB ({time.perf_counter() - t0:.1f} s)")
    else:
        shutil.copyfile(tcfg.path, out / "tokenizer.json")
        tok, eot_id = load_tokenizer(out / "tokenizer.json", tcfg.eot_token)
        tok_info = {"kind": "file", "source_path": str(tcfg.path)}
    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 65535 else np.uint32
    eot_token = EOT if isinstance(tcfg, BPETokenizerConfig) else tcfg.eot_token
    tok_info.update(vocab_size=vocab, eot_token=eot_token, eot_id=eot_id,
                    sha256=hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest())

    (out / "tokens").mkdir()
    domains_info, doc_rows = {}, []
    t0 = time.perf_counter()
    for d, items in selected.items():
        ids = encode_documents(tok, [doc.text for _, _, doc in items], dtype)
        ntok = np.array([len(a) for a in ids], dtype=np.int64)
        split = _assign_splits(keys[d], ntok, recipe)
        order = np.argsort(keys[d], kind="stable")
        info = {"role": recipe.domains[d].role, "description": recipe.domains[d].description,
                "duplicates_removed": dup[d], "splits": {}}
        for code, name in enumerate(SPLITS):
            idx = [i for i in order if split[i] == code]
            sep = np.array([eot_id], dtype=dtype)
            arr = np.concatenate([x for i in idx for x in (ids[i], sep)]) if idx else np.zeros(0, dtype)
            path = out / "tokens" / f"{d}.{name}.bin"
            arr.tofile(path)
            nbytes = sum(items[i][1] for i in idx)
            info["splits"][name] = {
                "documents": len(idx), "bytes": nbytes, "tokens": int(arr.size),
                "file": f"tokens/{d}.{name}.bin", "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
            }
            if not idx:
                log(f"  warning: domain {d} has an empty {name} split")
            for i in idx:
                dg, n, doc = items[i]
                origin = doc.origin.replace("\t", " ").replace("\n", " ")
                doc_rows.append(f"{d}\t{name}\t{dg.hex()}\t{n}\t{int(ntok[i])}\t{doc.source}\t{origin}")
        info["documents"] = len(items)
        info["bytes"] = sum(n for _, n, _ in items)
        info["tokens"] = sum(s["tokens"] for s in info["splits"].values())
        domains_info[d] = info
    log(f"  tokenised {sum(i['tokens'] for i in domains_info.values()) / 1e6:.2f} M tokens "
        f"({time.perf_counter() - t0:.1f} s)")

    selected_by_source = Counter(doc.source for items in selected.values() for _, _, doc in items)
    selected_bytes = Counter()
    for items in selected.values():
        for _, n, doc in items:
            selected_bytes[doc.source] += n
    sources = []
    for p in prepared:
        c = p.config
        entry = {"id": p.id, "kind": c.kind, "domains": sorted(_targets(p)), "license": c.license,
                 "status": p.status}
        if p.status == "ok":
            entry.update(origin=p.origin, sha256=p.fingerprint, files=p.stats["files"],
                         documents_read=p.stats["records"], empty=p.stats["empty"],
                         duplicates=p.stats["duplicates"], bytes_read=p.stats["bytes_read"],
                         bad_bytes=p.stats["bad_bytes"], docs_with_bad_bytes=p.stats["docs_with_bad_bytes"],
                         malformed=p.stats["malformed"], unreadable_files=p.stats["unreadable_files"],
                         documents_selected=selected_by_source[p.id],
                         bytes_selected=selected_bytes[p.id])
            if p.unmapped:
                entry["unmapped"] = dict(sorted(p.unmapped.items()))
        else:
            entry["reason"] = p.reason
        sources.append(entry)

    (out / "documents.tsv").write_text(
        "domain\tsplit\tdigest\tbytes\ttokens\tsource\torigin\n" + "\n".join(doc_rows) + "\n", encoding="utf-8")
    manifest = {
        "format": MANIFEST_FORMAT, "pipeline_version": PIPELINE_VERSION, "key": key,
        "recipe_name": recipe.name, "recipe": recipe.model_dump(mode="json"),
        "dtype": np.dtype(dtype).name, "tokenizer": tok_info, "splits": list(SPLITS),
        "domains": domains_info, "skipped_domains": skipped_domains, "sources": sources,
    }
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp, out / "manifest.json")


def _targets(p: PreparedSource) -> set[str]:
    c = p.config
    t = {c.domain} if c.domain else set()
    return t | set(getattr(c, "domain_map", {}).values())
