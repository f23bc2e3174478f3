"""Corpus sources: fingerprint, and stream normalised documents.

Columnar sources (parquet, arrow, hf_disk) are read in ``tables.py``; archives are fetched by ``fetch.py``.

``prepare_source`` makes a source ready (downloading archives into the data home once) and
fingerprints its content for the corpus cache key; an optional source whose client or files are
missing comes back skipped with a reason. ``read_source`` then streams its documents.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
import warnings
import zipfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

from .fetch import check_sha256, fetch_archive
from .recipe import (
    FilesSource,
    JsonlSource,
    NpmPackSource,
    PipSdistSource,
    PythonTopicsSource,
    TableSource,
    source_id,
)
from .source_base import (
    DataError,
    MalformedRecordWarning,
    PreparedSource,
    SourceUnavailable,
    expand_root,
    get_field,
    make_doc,
    malformed,
    mapped_domain,
    sha256_file,
)
from .tables import read_table, table_files
from .text import Doc, decode_utf8, glob_match


@dataclass(frozen=True)
class Limits:
    """Caps on decompressed bytes: a document past one is skipped (warned, counted as ``oversized``) and
    the build goes on; a zstd frame past its cap ends the file's reading. They bound what a small
    crafted file can expand to (a 64 KiB zstd piece can hold 2 GiB of zeros)."""

    member_bytes: int = 256 << 20  # one archive member or file, and a nested .gz after decompression
    line_bytes: int = 256 << 20  # one jsonl line
    frame_bytes: int = 8 << 30  # one zstd frame
    zstd_piece: int = 1024  # compressed bytes per decompress call: at most ~32 MiB out (a 128 KiB block fits in 4 bytes)


LIMITS = Limits()


class TooLarge(ValueError):
    pass


def _read_capped(f, cap: int, what: str) -> bytes:
    data = f.read(cap + 1)
    if len(data) > cap:
        raise TooLarge(f"{what} decompresses to more than {cap:,} bytes")
    return data


def _gunzip(raw: bytes, what: str) -> bytes:
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
        return _read_capped(g, LIMITS.member_bytes, what)


def _oversized(prep: PreparedSource, where: str, err: TooLarge) -> None:
    prep.stats["oversized"] += 1
    warnings.warn(f"{where}: skipped, {err}", MalformedRecordWarning, stacklevel=3)


def _walk(src: FilesSource) -> list[tuple[Path, str]]:
    """(path, path relative to its root) for every matching file, in a fixed order."""
    out = []
    for root in expand_root(src.root):
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in src.exclude_dirs)
            for fn in sorted(filenames):
                p = Path(dirpath) / fn
                rel = p.relative_to(root).as_posix()
                if glob_match(rel, src.include) and not glob_match(rel, src.exclude) and p.is_file():
                    out.append((p, rel))
    return out


def _record_files(src) -> list[Path]:
    files: list[Path] = []
    for pattern in src.paths:
        for p in expand_root(pattern):
            if p.is_file() and p not in files:
                files.append(p)
    return files


def prepare_source(src, index: int, home: Path, log: Callable = print) -> PreparedSource:
    sid = source_id(src, index)
    prep = PreparedSource(sid, src, "ok")
    try:
        if isinstance(src, (PipSdistSource, NpmPackSource)):
            kind = "pip" if isinstance(src, PipSdistSource) else "npm"
            prep.archive = fetch_archive(kind, src.package, src.version, src.sha256, home, log)
            # checked again on every use, before anything is unpacked (the cache is a plain folder)
            prep.fingerprint = check_sha256(prep.archive, src.sha256, f"source {sid}")
            prep.origin = f"{kind}: {src.package} {src.version} ({prep.archive.name})"
        elif isinstance(src, FilesSource):
            found = _walk(src)
            if not found:
                raise SourceUnavailable(f"no files match under {src.root}")
            prep.files = [p for p, _ in found]
            h = hashlib.sha256()
            for p, rel in found:
                h.update(f"{rel}\0{sha256_file(p)}\n".encode())
            prep.fingerprint = h.hexdigest()
            prep.origin = f"files: {src.root} ({len(found)} files)"
        elif isinstance(src, (JsonlSource, TableSource)):
            if isinstance(src, JsonlSource):
                prep.files = _record_files(src)
            else:
                prep.files = table_files(src)
            if not prep.files:
                raise SourceUnavailable(f"no files match {src.paths}")
            h = hashlib.sha256()
            for p in prep.files:
                if src.fingerprint == "stat":
                    st = p.stat()
                    h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
                else:
                    h.update(f"{p}\0{sha256_file(p)}\n".encode())
            prep.fingerprint = h.hexdigest()
            prep.origin = f"{src.kind}: {len(prep.files)} files"
        elif isinstance(src, PythonTopicsSource):
            import pydoc_data.topics as topics

            prep.files = [Path(topics.__file__)]
            prep.fingerprint = sha256_file(prep.files[0])
            prep.origin = f"python {sys.version.split()[0]}: pydoc_data/topics.py"
        else:  # pragma: no cover - the recipe union makes this unreachable
            raise DataError(f"unknown source kind {src.kind}")
    except SourceUnavailable as e:
        if not src.optional:
            raise DataError(f"source {sid} ({src.kind}) is required but unavailable: {e}") from None
        prep.status, prep.reason = "skipped", str(e)
        log(f"  source {sid}: skipped ({e})")
    return prep


def _from_member(prep: PreparedSource, raw: bytes, origin: str) -> Doc | None:
    src = prep.config
    if src.format == "text":
        return make_doc(prep, src.domain, raw, origin)
    text, bad = decode_utf8(raw)
    try:
        value = get_field(json.loads(text), src.text_field)
    except json.JSONDecodeError as e:
        value, err = None, f"invalid JSON: {e.msg}"
    else:
        err = f"no string field {src.text_field!r}"
    if not isinstance(value, str):
        malformed(prep, origin, err)
        return None
    return make_doc(prep, src.domain, None, origin, value, bad)


def _archive_members(path: Path) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """(path inside the archive without its top folder, reader) in archive order.

    Archive order is fixed for a given archive, and reading forward keeps a compressed tar
    stream from being decompressed again for every backward seek.
    """
    cap = LIMITS.member_bytes

    def read_zip(zf, name) -> bytes:
        with zf.open(name) as f:
            return _read_capped(f, cap, f"{path.name}:{name}")

    def read_tar(tf, m) -> bytes:
        return _read_capped(tf.extractfile(m), cap, f"{path.name}:{m.name}")

    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path) as zf:
            for name in (n for n in zf.namelist() if not n.endswith("/")):
                yield name.split("/", 1)[-1], partial(read_zip, zf, name)
        return
    with tarfile.open(path, "r|*") as tf:
        for m in tf:
            if m.isfile():
                yield m.name.split("/", 1)[-1], partial(read_tar, tf, m)


def _chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    """Decompressed bytes of a plain, .gz or .zst file, read as a stream.

    A .zst file may hold several frames; one that ends early raises EOFError (the zstandard
    stream reader would end quietly and lose the tail without a trace). Compressed input is fed
    in pieces of ``size / 16`` so a piece's output stays near ``size`` at ordinary text ratios.
    """
    if path.name.endswith(".zst"):
        yield from _zstd_chunks(path, size)
        return
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        yield from iter(lambda: f.read(size), b"")


def _zstd_chunks(path: Path, size: int) -> Iterator[bytes]:
    """Decompressed pieces of about ``size / 16`` bytes of a .zst file, frame after frame. Compressed input is
    fed ``LIMITS.zstd_piece`` bytes at a time, so one call's output stays bounded whatever the input; a
    frame past ``LIMITS.frame_bytes`` raises TooLarge."""
    import zstandard

    dctx, piece, cap = zstandard.ZstdDecompressor(), LIMITS.zstd_piece, LIMITS.frame_bytes
    out, held = [], 0
    with open(path, "rb") as f:
        dobj, fed, frame = dctx.decompressobj(), False, 0
        for block in iter(lambda: f.read(max(size // 16, piece)), b""):
            for i in range(0, len(block), piece):
                chunk = block[i : i + piece]
                while chunk:
                    fed = True
                    got = dobj.decompress(chunk)
                    frame += len(got)
                    if frame > cap:
                        raise TooLarge(f"a zstd frame decompresses to more than {cap:,} bytes")
                    if got:
                        out.append(got)
                        held += len(got)
                    if dobj.eof:  # a frame's text goes out before the next frame is read
                        chunk, dobj, fed, frame = dobj.unused_data, dctx.decompressobj(), False, 0
                        if out:
                            yield b"".join(out)
                            out, held = [], 0
                    else:
                        chunk = b""
                if held >= size // 16:  # small pieces out: a join of `size` bytes would double the memory held
                    yield b"".join(out)
                    out, held = [], 0
        if out:
            yield b"".join(out)
        if fed and not dobj.eof:
            raise EOFError("compressed data ends in the middle of a frame")


def _lines(prep: PreparedSource, path: Path) -> Iterator[tuple[int, bytes]]:
    """Numbered non-blank lines; a corrupt or truncated stream ends its file with a warning."""
    import zlib

    import zstandard

    cap = LIMITS.line_bytes
    lineno, pending, held, skipping = 0, [], 0, False  # skipping: the rest of a line past the cap
    try:
        for chunk in _chunks(path):
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                pending.append(chunk[start:end])
                line, pending, held, start = b"".join(pending), [], 0, end + 1
                lineno += 1
                if len(line) > cap and not skipping:
                    _oversized(prep, f"{path}:{lineno}", TooLarge(f"a line longer than {cap:,} bytes"))
                elif line.strip() and not skipping:
                    yield lineno, line
                skipping = False
            if start < len(chunk) and not skipping:
                pending.append(chunk[start:])
                held += len(chunk) - start
                if held > cap:
                    _oversized(prep, f"{path}:{lineno + 1}", TooLarge(f"a line longer than {cap:,} bytes"))
                    pending, held, skipping = [], 0, True
        line = b"".join(pending)
        if line.strip() and not skipping:
            yield lineno + 1, line
    except TooLarge as e:
        _oversized(prep, f"{path}:{lineno + 1}", e)
        prep.stats["unreadable_files"] += 1
    except (OSError, EOFError, zlib.error, zstandard.ZstdError) as e:
        _unreadable(prep, path, lineno + 1, e)


def _unreadable(prep: PreparedSource, path: Path, lineno: int, err: Exception) -> None:
    prep.stats["unreadable_files"] += 1
    warnings.warn(f"{path}:{lineno}: stream unreadable from here on, rest of the file skipped ({err})", MalformedRecordWarning, stacklevel=4)


def _read_jsonl(prep: PreparedSource) -> Iterator[Doc]:
    src: JsonlSource = prep.config
    for path in prep.files:
        prep.stats["files"] += 1
        for lineno, line in _lines(prep, path):
            text, bad = decode_utf8(line)
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                malformed(prep, f"{path}:{lineno}", f"invalid JSON: {e.msg}")
                continue
            value = get_field(obj, src.text_field)
            if not isinstance(value, str):
                malformed(prep, f"{path}:{lineno}", f"no string field {src.text_field!r}")
                continue
            domain = src.domain if src.domain_field is None else mapped_domain(prep, get_field(obj, src.domain_field))
            if domain is None:
                continue
            doc = make_doc(prep, domain, None, f"{path.name}:{lineno}", value, bad)
            if doc is not None:
                yield doc


def read_source(prep: PreparedSource) -> Iterator[Doc]:
    """Stream the normalised, cleaned, non-empty documents of a prepared source."""
    src = prep.config
    if isinstance(src, JsonlSource):
        yield from _read_jsonl(prep)
    elif isinstance(src, TableSource):
        yield from read_table(prep)
    elif isinstance(src, PythonTopicsSource):
        from pydoc_data.topics import topics

        prep.stats["files"] += 1
        assert src.domain is not None  # the recipe requires one for every source without a domain_map
        for name in sorted(topics):
            doc = make_doc(prep, src.domain, None, f"topics:{name}", topics[name], 0)
            if doc is not None:
                yield doc
    elif isinstance(src, FilesSource):
        roots = expand_root(src.root)
        for path in prep.files:
            prep.stats["files"] += 1
            origin = next((path.relative_to(r).as_posix() for r in roots if path.is_relative_to(r)), str(path))
            try:
                with open(path, "rb") as f:
                    raw = _read_capped(f, LIMITS.member_bytes, str(path))
                if path.name.endswith(".gz"):
                    raw = _gunzip(raw, str(path))
            except TooLarge as e:
                _oversized(prep, str(path), e)
                continue
            doc = _from_member(prep, raw, origin)
            if doc is not None:
                yield doc
    else:
        assert prep.archive is not None  # a package source's members come from its fetched archive
        for name, read in _archive_members(prep.archive):
            if not glob_match(name, src.include) or glob_match(name, src.exclude):
                continue
            prep.stats["files"] += 1
            try:
                raw = read()
                if name.endswith(".gz"):
                    raw = _gunzip(raw, f"{prep.archive.name}:{name}")
            except TooLarge as e:
                _oversized(prep, f"{prep.archive.name}:{name}", e)
                continue
            doc = _from_member(prep, raw, name)
            if doc is not None:
                yield doc
    if prep.stats["malformed"] > prep.warned:
        warnings.warn(
            f"source {prep.id}: {prep.stats['malformed']} malformed records skipped in all ({prep.stats['malformed'] - prep.warned} not shown)",
            MalformedRecordWarning,
            stacklevel=2,
        )
