"""Columnar sources: Parquet files, Arrow IPC files and streams, ``datasets`` save_to_disk folders.

Files are read one record batch at a time with pyarrow (Parquet by row group, sliced to
``batch_rows``; Arrow from a memory map, batch by batch), and only the columns that hold the text
and the domain label, so no file is ever loaded whole. A row whose text is null or not a string
is skipped, counted as malformed and named by file and row index, like a malformed jsonl line.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Iterator

from .recipe import HFDiskSource
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
)
from .text import Doc, decode_utf8

SUFFIXES = {"parquet": (".parquet",), "arrow": (".arrow", ".feather", ".ipc")}


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError:
        raise SourceUnavailable("pyarrow is not installed (pip install pyarrow)") from None
    return pyarrow


def _hf_disk_files(folder: Path, src: HFDiskSource) -> list[Path]:
    """The arrow files of a save_to_disk folder, in the order its state.json lists them."""
    if (folder / "dataset_dict.json").is_file():
        names = json.loads((folder / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        missing = [s for s in src.splits if s not in names]
        if missing:
            raise DataError(f"{folder}: no split(s) {missing}; this DatasetDict has {names}")
        return [f for s in (src.splits or names) for f in _dataset_files(folder / s)]
    if src.splits and folder.is_dir():
        raise DataError(f"{folder}: `splits` given, but this is a Dataset folder, not a DatasetDict")
    return _dataset_files(folder)


def _dataset_files(folder: Path) -> list[Path]:
    state = folder / "state.json"
    if not state.is_file():
        if folder.exists():
            raise SourceUnavailable(f"{folder} is not a save_to_disk folder (no state.json or dataset_dict.json)")
        return []
    files = [folder / f["filename"] for f in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise SourceUnavailable(f"{folder}: data files listed in state.json are missing: {missing}")
    return files


def table_files(src) -> list[Path]:
    """Every file of a table source, in a fixed order (a folder's files sorted by relative path)."""
    _pyarrow()
    files: list[Path] = []
    for pattern in src.paths:
        for p in expand_root(pattern):
            if isinstance(src, HFDiskSource):
                found = _hf_disk_files(p, src)
            elif p.is_dir():
                found = sorted(
                    (q for q in p.rglob("*") if q.is_file() and q.name.endswith(SUFFIXES[src.kind])), key=lambda q: q.relative_to(p).as_posix()
                )
            else:
                found = [p] if p.is_file() else []
            files += [q for q in found if q not in files]
    return files


def _batches(path: Path, columns: list[str], batch_rows: int):
    """Record batches of at most ``batch_rows`` rows holding only ``columns`` (those the file has)."""
    pa = _pyarrow()
    if path.name.endswith(".parquet"):
        pf = pa.parquet.ParquetFile(path)
        cols = [c for c in columns if c in pf.schema_arrow.names]
        yield from pf.iter_batches(batch_size=batch_rows, columns=cols)
        return
    with pa.memory_map(str(path)) as f:
        is_file_format = f.read(6) == b"ARROW1"
        f.seek(0)
        if is_file_format:
            reader = pa.ipc.open_file(f)
            stream = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            stream = pa.ipc.open_stream(f)
        for batch in stream:
            batch = batch.select([c for c in columns if c in batch.schema.names])
            for off in range(0, batch.num_rows, batch_rows):  # zero-copy slices of the mapped batch
                yield batch.slice(off, batch_rows)


def _values(batch, dotted: str) -> list:
    """Per-row values of a column or a dotted path into struct columns (or a JSON-encoded string)."""
    pa = _pyarrow()
    n, names = batch.num_rows, batch.schema.names
    if dotted in names:
        return batch.column(dotted).to_pylist()
    parts = dotted.split(".")
    if parts[0] not in names:
        return [None] * n
    col = batch.column(parts[0])
    for k, part in enumerate(parts[1:], 1):
        if pa.types.is_struct(col.type):
            idx = col.type.get_field_index(part)
            if idx < 0:
                return [None] * n
            col = pa.compute.struct_field(col, [idx])  # null where the parent struct is null
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            rest = ".".join(parts[k:])
            return [None if v is None else get_field(_json(v), rest) for v in col.to_pylist()]
        else:
            return [None] * n
    return col.to_pylist()


def _json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def read_table(prep: PreparedSource) -> Iterator[Doc]:
    """Documents of a parquet / arrow / hf_disk source, file by file, batch by batch."""
    pa = _pyarrow()
    src = prep.config
    fields = [src.text_field] + ([src.domain_field] if src.domain_field else [])
    columns = list(dict.fromkeys(c for f in fields for c in (f, f.split(".")[0])))
    for path in prep.files:
        prep.stats["files"] += 1
        row = 0
        try:
            for batch in _batches(path, columns, src.batch_rows):
                texts = _values(batch, src.text_field)
                labels = _values(batch, src.domain_field) if src.domain_field else None
                for i, value in enumerate(texts):
                    where = f"{path} row {row + i}"
                    bad = 0
                    if isinstance(value, bytes):
                        value, bad = decode_utf8(value)
                    if not isinstance(value, str):
                        malformed(prep, where, f"no string field {src.text_field!r}")
                        continue
                    domain = src.domain if labels is None else mapped_domain(prep, labels[i])
                    if domain is None:
                        continue
                    doc = make_doc(prep, domain, None, f"{path.name} row {row + i}", value, bad)
                    if doc is not None:
                        yield doc
                row += batch.num_rows
        except (OSError, pa.ArrowException) as e:
            prep.stats["unreadable_files"] += 1
            warnings.warn(f"{path} row {row}: file unreadable from here on, rest of the file skipped ({e})", MalformedRecordWarning, stacklevel=2)
