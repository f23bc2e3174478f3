"""The one atomic write: a reader sees the old file or the whole new one, never a part.

A temporary file in the same folder (unique to the writing process), flushed and fsynced, then renamed
over the target. Everything that writes a result, a manifest or a state file goes through here; the run
directory's layout (``basecap.rundir``) and the corpus build use it alike.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def fsync(path: str | Path):
    """Flush a file (or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file object whose contents replace ``path`` atomically when the block ends without an
    error; on an error the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically and durably."""
    with atomic_open(path) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def write_json(path: str | Path, obj, **dumps_kw) -> Path:
    """``obj`` as indented JSON, written atomically (``dumps_kw`` go to ``json.dumps``, e.g. ``default=str``)."""
    return atomic_write(path, json.dumps(obj, indent=1, **dumps_kw))
