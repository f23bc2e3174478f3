"""Text normalisation shared by every corpus source.

Every document goes through ``normalize``: UTF-8 decoding with bad bytes replaced by U+FFFD (and
counted), newline normalisation (CRLF and CR become LF), then Unicode NFC. The result is what the
corpus hashes for de-duplication and split assignment, and what the tokenizer sees.
"""

from __future__ import annotations

import codecs
import hashlib
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

_bad_bytes = [0]


def _count_and_replace(err: UnicodeDecodeError) -> tuple[str, int]:
    _bad_bytes[0] += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("basecap_count_replace", _count_and_replace)  # type: ignore[arg-type]  # used for decoding only


def decode_utf8(raw: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing each invalid sequence by U+FFFD. Returns (text, bad byte count)."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        _bad_bytes[0] = 0
        text = raw.decode("utf-8", errors="basecap_count_replace")
        return text, _bad_bytes[0]


def normalize_text(text: str) -> str:
    """Newlines to LF, NFC, drop a leading byte-order mark."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    return text


def strip_email_headers(text: str) -> str:
    """Keep an e-mail's Subject line and its body; routing headers are noise for a language model."""
    head, sep, body = text.partition("\n\n")
    if not sep:
        return text
    subject = ""
    lines = head.split("\n")
    for i, line in enumerate(lines):
        if line.lower().startswith("subject:"):
            parts = [line]
            for cont in lines[i + 1 :]:
                if cont[:1] in (" ", "\t"):
                    parts.append(cont.strip())
                else:
                    break
            subject = " ".join(p.strip() for p in parts) + "\n\n"
            break
    return subject + body


CLEANERS = {"none": lambda t: t, "email": strip_email_headers}


def doc_digest(text: str) -> bytes:
    """32-byte content hash of a normalised document (exact de-duplication and split keys)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=32).digest()


def split_key(digest: bytes) -> float:
    """A uniform number in [0, 1) from bits of the digest that the size cap does not use."""
    return int.from_bytes(digest[16:24], "big") / 2.0**64


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def glob_match(path: str, patterns: list[str]) -> bool:
    """Match a '/'-separated relative path: ``*`` stays inside one folder, ``**/`` spans folders."""
    return any(_glob_regex(p).match(path) for p in patterns)


@dataclass
class Doc:
    """One normalised document on its way into the corpus."""

    domain: str
    text: str
    origin: str  # where it came from: archive member, file path or file:line
    bad_bytes: int = 0
    source: str = ""
