"""Parallel, resumable tokenisation in committed units of work.

The documents to tokenise are cut into units of about ``unit_bytes`` of text (a domain's documents
in a fixed order). ``workers`` processes, each single-threaded, tokenise the units; a unit's result
(every document's tokens followed by the separator, and the per-document token counts) is written
under a temporary name and renamed to a file named by a hash of the unit's documents and of the
tokenizer. That rename is the commit: a build that was interrupted and runs again finds the
committed units and tokenises only the rest. Units do not depend on the worker count, and callers
assemble results in unit order, so the output does not either. A unit's texts may be a ``FileTexts``
(byte ranges of a file): a job then carries locations, and the worker reads the text itself.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ..atomic import atomic_open
from .tokenizer import load_tokenizer


def usable_cpus() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Unit:
    """``docs`` index the caller's document list; ``key`` hashes the documents' digests and the tokenizer."""

    group: str  # e.g. the domain; part of the file name only
    index: int
    docs: tuple[int, ...]
    nbytes: int
    key: str

    @property
    def file(self) -> str:
        return f"{self.group}-{self.index:05d}-{self.key[:20]}.npz"


@dataclass(frozen=True)
class FileTexts:
    """Texts stored as UTF-8 byte ranges ``(offset, length)`` of one file, read only when iterated.

    Sent to a worker instead of the texts, so neither the parent nor the job queue holds them.
    """

    path: str
    spans: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        return len(self.spans)

    def __iter__(self) -> Iterator[str]:
        return (raw.decode("utf-8") for raw in read_spans(self.path, self.spans))


def read_spans(path: str | os.PathLike, spans: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes at each ``(offset, length)`` of ``path``, read in file order (forward on disk), in the given order."""
    out = [b""] * len(spans)
    with open(path, "rb") as f:
        for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
            f.seek(spans[i][0])
            out[i] = f.read(spans[i][1])
    return out


def plan_units(
    group: str, digests: Sequence[bytes], nbytes: Sequence[int], order: Sequence[int] | np.ndarray, tokenizer_sha: str, unit_bytes: int
) -> list[Unit]:
    """Consecutive documents of ``order`` in units that close once they hold ``unit_bytes`` of text."""
    units: list[Unit] = []
    cur: list[int] = []
    size = 0

    def close():
        h = hashlib.sha256(tokenizer_sha.encode())
        for i in cur:
            h.update(digests[i])
        units.append(Unit(group, len(units), tuple(cur), size, h.hexdigest()))

    for i in order:
        cur.append(int(i))
        size += int(nbytes[i])
        if size >= unit_bytes:
            close()
            cur, size = [], 0
    if cur:
        close()
    return units


def encode_texts(tok, texts: Sequence[str] | FileTexts, eot_id: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(every text's ids followed by ``eot_id``, flat; ids per text without the separator)."""
    sep = np.array([eot_id], dtype=dtype)
    lengths = np.empty(len(texts), dtype=np.int64)
    parts: list[np.ndarray] = []
    for i, t in enumerate(texts):
        ids = np.asarray(tok.encode(t, add_special_tokens=False).ids, dtype=dtype)  # single-threaded
        lengths[i] = ids.size
        parts += (ids, sep)
    return (np.concatenate(parts) if parts else np.zeros(0, dtype)), lengths


def load_unit_lengths(path: Path) -> np.ndarray:
    """Only the per-document token counts of a committed unit (its tokens stay on disk)."""
    with np.load(path) as z:
        return z["lengths"]


def load_unit(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(tokens with separators, per-document token counts) of a committed unit file."""
    with np.load(path) as z:
        return z["tokens"], z["lengths"]


def _commit(path: Path, tokens: np.ndarray, lengths: np.ndarray) -> None:
    with atomic_open(path) as f:
        np.savez(f, tokens=tokens, lengths=lengths)


_worker_tok = None


def _init_worker(tokenizer_path: str, eot_token: str) -> None:
    global _worker_tok
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the pool
    _worker_tok, _ = load_tokenizer(tokenizer_path, eot_token)


def _encode_unit(job: tuple[Sequence[str] | FileTexts, str, int, str]) -> None:
    texts, path, eot_id, dtype = job
    _commit(Path(path), *encode_texts(_worker_tok, texts, eot_id, np.dtype(dtype)))


def _committed(unit: Unit) -> None:
    """Called in the parent after each unit is committed (a hook for tests)."""


@contextmanager
def _pool(workers: int, initargs: tuple):
    # fork: workers inherit the imported modules (no re-import of torch per worker). The tokenizers
    # library warns in a forked child unless TOKENIZERS_PARALLELISM is set; workers encode serially.
    ctx = mp.get_context("fork") if sys.platform == "linux" else mp.get_context()
    was = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        pool = ctx.Pool(workers, initializer=_init_worker, initargs=initargs)
    finally:
        if was is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = was
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()


def run_units(
    units: list[Unit],
    texts: Callable[[Unit], Sequence[str] | FileTexts],
    folder: Path,
    tokenizer_path: Path,
    eot_token: str,
    eot_id: int,
    *,
    dtype,
    workers: int,
    progress: bool | None = None,
    log: Callable[[str], None] = print,
    desc: str = "tokenising",
) -> int:
    """Tokenise every unit not yet committed in ``folder``; returns how many were already there.

    ``texts(unit)``: the unit's texts in order, or a ``FileTexts`` that the worker reads.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.tmp-*"):  # a worker stopped mid-write
        stale.unlink(missing_ok=True)
    todo = [u for u in units if not (folder / u.file).is_file()]
    reused = len(units) - len(todo)
    total = sum(u.nbytes for u in units)
    workers = max(1, min(workers, len(todo)))
    log(
        f"  {desc}: {len(units)} units, {total / 1e6:.1f} MB of text"
        + (f", {reused} already committed (resumed)" if reused else "")
        + (f", {workers} worker{'s' if workers > 1 else ''}" if todo else "")
    )
    if not todo:
        return reused
    from tqdm.auto import tqdm

    bar = tqdm(
        total=total,
        initial=total - sum(u.nbytes for u in todo),
        unit="B",
        unit_scale=True,
        desc=desc,
        file=sys.stderr,
        disable=None if progress is None else not progress,
        leave=False,
    )
    dtype = np.dtype(dtype)
    try:
        if workers == 1:
            tok, _ = load_tokenizer(tokenizer_path, eot_token)
            for u in todo:
                _commit(folder / u.file, *encode_texts(tok, texts(u), eot_id, dtype))
                bar.update(u.nbytes)
                _committed(u)
        else:

            def jobs() -> Iterator:
                for u in todo:
                    yield texts(u), str(folder / u.file), eot_id, dtype.name

            with _pool(workers, (str(tokenizer_path), eot_token)) as pool:
                for u, _ in zip(todo, pool.imap(_encode_unit, jobs())):  # results in unit order
                    bar.update(u.nbytes)
                    _committed(u)
    finally:
        bar.close()
    return reused
