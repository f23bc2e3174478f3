"""Reading every source into a selection: exact de-duplication, per-source and per-domain byte caps.

The selection keeps only a small record per document (digest, byte count, spool offset, source,
origin); the selected texts are appended to a spool on disk as they are read, so a corpus may be far
larger than memory. A finished collection is committed next to its spool (``save_collected``), so a
build interrupted later does not read every source again.
"""

from __future__ import annotations

import heapq
import json
import shutil
import sys
import time
from collections import Counter, defaultdict
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ..atomic import atomic_open
from .recipe import RecipeConfig
from .source_base import PreparedSource
from .sources import read_source
from .text import doc_digest


class BottomK:
    """The smallest-digest documents whose UTF-8 size first reaches ``cap`` (all when cap is None).

    Streaming and exact: the kept set always equals sorting everything seen by digest and taking
    the shortest prefix that reaches the cap, so selection does not depend on reading order.
    ``item`` is the caller's record of a document (in a build a ``Spooled``, never the text).
    """

    def __init__(self, cap: int | None):
        self.cap, self.total = cap, 0
        self.heap: list[tuple[int, int, bytes, Any]] = []  # (-key, bytes, digest, item): max-heap

    def admits(self, digest: bytes) -> bool:
        """Whether ``add`` keeps this document now: a caller writes out only texts that are kept."""
        return self.cap is None or self.total < self.cap or int.from_bytes(digest[:16], "big") <= -self.heap[0][0]

    def add(self, digest: bytes, nbytes: int, item) -> None:
        if not self.admits(digest):
            return
        heapq.heappush(self.heap, (-int.from_bytes(digest[:16], "big"), nbytes, digest, item))
        self.total += nbytes
        while self.cap is not None and self.total - self.heap[0][1] >= self.cap:
            self.total -= heapq.heappop(self.heap)[1]

    def items(self) -> list[tuple[bytes, int, Any]]:
        return [(d, n, item) for _, n, d, item in sorted(self.heap, key=lambda x: x[2])]


class Spooled(NamedTuple):
    """A selected document in memory: where its text lies in its domain's spool file, where it came from."""

    offset: int
    source: str
    origin: str


class Spool:
    """Selected documents' UTF-8 text on disk, one append-only file per domain.

    A document is written when it enters a selection, so memory holds records, not text. One that a
    domain cap evicts later stays in the file unused: disk, at most the text read, instead of memory.
    """

    def __init__(self, folder: Path, reuse: bool = False):
        """``reuse``: open a finished collection's spool as it is (a resumed build); otherwise start empty
        (an interrupted collection's partial spool is discarded: its sources are read again)."""
        if not reuse:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        self.folder = folder
        self.files: dict[str, BinaryIO] = {}
        self.size: Counter = Counter()

    def path(self, domain: str) -> Path:
        return self.folder / f"{domain}.txt"

    def write(self, domain: str, raw: bytes) -> int:
        """Append ``raw`` to the domain's file; returns its offset there."""
        if domain not in self.files:
            self.files[domain] = open(self.path(domain), "ab")  # noqa: SIM115 - open until close()
        self.files[domain].write(raw)
        self.size[domain] += len(raw)
        return self.size[domain] - len(raw)

    def close(self) -> None:
        """Flush and close the files (before anything reads them)."""
        for f in self.files.values():
            f.close()
        self.files.clear()


def collect(
    recipe: RecipeConfig, prepared: list[PreparedSource], log, progress: bool | None = None, *, spool: Spool
) -> tuple[dict[str, list[tuple[bytes, int, Spooled]]], Counter]:
    """Read every source; exact de-duplication across the corpus; per-source then per-domain caps.

    Returns each domain's selection as (digest, UTF-8 bytes, ``Spooled``) in digest order; the texts
    are in ``spool``.
    """
    from tqdm.auto import tqdm

    seen: set[bytes] = set()
    dup: Counter = Counter()
    domain_sel = {d: BottomK(cfg.max_bytes) for d, cfg in recipe.domains.items()}
    try:
        for prep in prepared:
            if prep.status != "ok":
                continue
            t0 = time.perf_counter()
            # without a source cap, documents go straight to their domain's selection (the same result,
            # since a selection does not depend on the order it sees documents in), so the spool holds
            # about what the domain caps keep instead of everything the source has
            cap = prep.config.max_bytes
            per_domain: dict[str, BottomK] = defaultdict(partial(BottomK, cap)) if cap else domain_sel
            bar = tqdm(
                total=len(prep.files),
                unit="file",
                desc=f"reading {prep.id}",
                file=sys.stderr,
                leave=False,
                disable=True if len(prep.files) < 2 else None if progress is None else not progress,
            )
            for doc in read_source(prep):
                bar.update(prep.stats["files"] - bar.n)
                digest = doc_digest(doc.text)
                if digest in seen:
                    prep.stats["duplicates"] += 1
                    dup[doc.domain] += 1
                    continue
                seen.add(digest)
                sel = per_domain[doc.domain]
                if sel.admits(digest):
                    raw = doc.text.encode("utf-8")
                    sel.add(digest, len(raw), Spooled(spool.write(doc.domain, raw), doc.source, doc.origin))
            for domain, sel in per_domain.items() if cap else ():
                for digest, n, rec in sel.items():
                    domain_sel[domain].add(digest, n, rec)
            bar.close()
            s = prep.stats
            log(
                f"  source {prep.id}: {s['records']} documents, {s['bytes_read'] / 1e6:.1f} MB, "
                f"{s['duplicates']} duplicates, {s['bad_bytes']} bad bytes, {s['malformed']} malformed "
                f"({time.perf_counter() - t0:.1f} s)"
            )
    finally:
        spool.close()
    return {d: domain_sel.pop(d).items() for d in list(domain_sel)}, dup  # frees each heap as it goes


COLLECTED = "collected.npz"  # in the build's work folder: arrays and JSON, no pickle (allow_pickle=False)


def save_collected(path: Path, selected: dict, dup: Counter, prepared: list[PreparedSource]) -> None:
    """Commit the finished collection (selection records, duplicate counts, per-source statistics) next to
    its spool, so a build interrupted later does not read every source again (hours at SlimPajama scale).
    Plain arrays: digests [N, 32] uint8, sizes and spool offsets int64, source indices, origins as one
    NUL-separated UTF-8 byte array; the rest as JSON bytes."""
    sources = sorted({rec.source for items in selected.values() for _, _, rec in items} | {p.id for p in prepared})
    index = {sid: i for i, sid in enumerate(sources)}
    meta = {
        "domains": list(selected),
        "sources": sources,
        "dup": dict(dup),
        "stats": {p.id: [dict(p.stats), dict(p.unmapped)] for p in prepared if p.status == "ok"},
    }
    arrays: dict[str, Any] = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
    for i, items in enumerate(selected.values()):
        arrays[f"digest{i}"] = np.frombuffer(b"".join(d for d, _, _ in items), dtype=np.uint8).reshape(len(items), 32)
        arrays[f"bytes{i}"] = np.array([n for _, n, _ in items], dtype=np.int64)
        arrays[f"offset{i}"] = np.array([rec.offset for _, _, rec in items], dtype=np.int64)
        arrays[f"source{i}"] = np.array([index[rec.source] for _, _, rec in items], dtype=np.int32)
        origins = "\0".join(rec.origin for _, _, rec in items).encode("utf-8", "surrogateescape")
        arrays[f"origin{i}"] = np.frombuffer(origins, dtype=np.uint8)
    with atomic_open(path) as f:
        np.savez(f, **arrays)


def load_collected(path: Path, prepared: list[PreparedSource]) -> tuple[dict, Counter]:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(z["meta"].tobytes())
        selected = {}
        for i, domain in enumerate(meta["domains"]):
            digests, sizes, offsets, srcs = z[f"digest{i}"], z[f"bytes{i}"], z[f"offset{i}"], z[f"source{i}"]
            origins = z[f"origin{i}"].tobytes().decode("utf-8", "surrogateescape").split("\0") if len(sizes) else []
            selected[domain] = [
                (digests[k].tobytes(), int(sizes[k]), Spooled(int(offsets[k]), meta["sources"][srcs[k]], origins[k])) for k in range(len(sizes))
            ]
    for p in prepared:
        if p.id in meta["stats"]:
            stats, unmapped = meta["stats"][p.id]
            p.stats, p.unmapped = Counter(stats), Counter(unmapped)
    return selected, Counter(meta["dup"])
