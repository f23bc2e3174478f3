"""What every source reader shares: the errors, a prepared source, path patterns, dotted fields,
and turning one record into a ``Doc`` with its statistics counted.

``sources.py`` (archives, files, jsonl, pydoc topics) and ``tables.py`` (parquet, arrow,
save_to_disk folders) both import from here and not from each other's internals.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .text import CLEANERS, Doc, decode_utf8, normalize_text

MAX_WARNINGS_PER_SOURCE = 10


class DataError(RuntimeError):
    """A corpus cannot be built (a required source is missing, a checksum differs, ...)."""


class SourceUnavailable(Exception):
    """A source's client or files are missing; fatal unless the source is optional."""


class MalformedRecordWarning(UserWarning):
    """A record was skipped (and counted in the manifest) because it could not be parsed."""


@dataclass
class PreparedSource:
    id: str
    config: Any  # the recipe's source model (data.recipe.Source); its fields depend on the kind
    status: str  # "ok" or "skipped"
    reason: str = ""
    fingerprint: str = ""
    origin: str = ""  # archive name or root folder, for the manifest
    archive: Path | None = None
    files: list[Path] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)
    unmapped: Counter = field(default_factory=Counter)
    warned: int = 0


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def expand_root(root: str) -> list[Path]:
    """A path pattern (``~``, ``$VARS``, ``{stdlib}``, globs with ``**``) as the paths it names, sorted."""
    root = root.replace("{stdlib}", sysconfig.get_paths()["stdlib"])
    root = os.path.expandvars(os.path.expanduser(root))
    if "$" in root:
        raise SourceUnavailable(f"unset environment variable in {root!r}")
    return [Path(p) for p in sorted(glob.glob(root, recursive=True))] if glob.has_magic(root) else [Path(root)]


def get_field(obj, dotted: str):
    """``obj["a"]["b"]`` for ``"a.b"``, or None where a level is missing or not a dict."""
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def malformed(prep: PreparedSource, where: str, why: str) -> None:
    """Count a skipped record; the first ``MAX_WARNINGS_PER_SOURCE`` of a source also warn."""
    prep.stats["malformed"] += 1
    if prep.warned < MAX_WARNINGS_PER_SOURCE:
        prep.warned += 1
        warnings.warn(f"{where}: malformed record skipped ({why})", MalformedRecordWarning, stacklevel=3)


def mapped_domain(prep: PreparedSource, label) -> str | None:
    """The domain a record's label (e.g. ``meta.redpajama_set_name``) maps to, or None (counted as unmapped)."""
    label = "<missing>" if label is None else str(label)
    if label not in prep.config.domain_map:
        prep.unmapped[label] += 1
        return None
    return prep.config.domain_map[label]


def make_doc(prep: PreparedSource, domain: str, raw: bytes | None, origin: str, text: str | None = None, bad: int = 0) -> Doc | None:
    """The normalised, cleaned document of ``raw`` bytes (or of ``text`` with ``bad`` replaced bytes);
    None when nothing but whitespace is left."""
    if raw is not None:
        text, bad = decode_utf8(raw)
    assert text is not None, "make_doc needs raw bytes or a text"
    text = CLEANERS[prep.config.clean](normalize_text(text))
    prep.stats["records"] += 1
    if bad:
        prep.stats["bad_bytes"] += bad
        prep.stats["docs_with_bad_bytes"] += 1
    if not text.strip():
        prep.stats["empty"] += 1
        return None
    prep.stats["bytes_read"] += len(text.encode("utf-8"))
    return Doc(domain, text, origin, bad, prep.id)
