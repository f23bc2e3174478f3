"""A built corpus on disk: manifest, tokenizer and per-domain, per-split token shards."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..config_base import ConfigError
from .recipe import SPLITS

MANIFEST_FORMAT = "basecap-corpus/1"


class Corpus:
    """Read-only view of a corpus folder written by ``build_corpus``.

    Token shards are flat arrays: each document's tokens followed by the ``<|endoftext|>`` id.
    """

    def __init__(self, path: str | os.PathLike, check_sizes: bool = True):
        self.dir = Path(path)
        mpath = self.dir / "manifest.json"
        if not mpath.is_file():
            raise ConfigError(f"{self.dir} is not a built corpus (no manifest.json)")
        self.manifest: dict = json.loads(mpath.read_text(encoding="utf-8"))
        if self.manifest.get("format") != MANIFEST_FORMAT:
            raise ConfigError(f"{self.dir}: unsupported corpus format {self.manifest.get('format')!r}")
        self.domains: list[str] = list(self.manifest["domains"])
        self.tokenizer_path = self.dir / "tokenizer.json"
        self.vocab_size: int = self.manifest["tokenizer"]["vocab_size"]
        self.eot_id: int = self.manifest["tokenizer"]["eot_id"]
        self.dtype = np.dtype(self.manifest["dtype"])
        self._tokenizer: Any = None  # a tokenizers.Tokenizer, loaded on first use
        self._shards: dict[tuple[str, str], np.ndarray] = {}
        self._token_bytes: np.ndarray | None = None
        if check_sizes:
            self._check_shard_sizes()

    def _check_shard_sizes(self):
        """Every token shard exists with the size its manifest entry records (hashes: ``basecap data verify``)."""
        for domain, dinfo in self.manifest["domains"].items():
            for split, info in dinfo["splits"].items():
                if not info["tokens"]:
                    continue
                path, want = self.dir / info["file"], info["tokens"] * self.dtype.itemsize
                have = path.stat().st_size if path.is_file() else None
                if have != want:
                    raise ConfigError(
                        f"{path}: token shard of {domain}/{split} is {'missing' if have is None else f'{have} bytes'}, "
                        f"the manifest records {want} bytes; the corpus is damaged: run `basecap data verify {self.dir}` "
                        f"and rebuild it (remove the folder, then `basecap data build`)"
                    )

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def tokenizer(self):
        """The corpus tokenizer (``tokenizers.Tokenizer``); special-token strings encode as text."""
        if self._tokenizer is None:
            from .tokenizer import load_tokenizer

            self._tokenizer, _ = load_tokenizer(self.tokenizer_path, self.manifest["tokenizer"]["eot_token"])
        return self._tokenizer

    def split_info(self, domain: str, split: str) -> dict:
        if domain not in self.manifest["domains"]:
            raise ConfigError(f"unknown domain {domain!r}; this corpus has {self.domains}")
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
        return self.manifest["domains"][domain]["splits"][split]

    def tokens(self, domain: str, split: str) -> np.ndarray:
        """The token shard of ``domain``/``split`` as a read-only memmap (documents + separators)."""
        key = (domain, split)
        if key not in self._shards:
            info = self.split_info(domain, split)
            if info["tokens"] == 0:
                self._shards[key] = np.zeros(0, dtype=self.dtype)
            else:
                self._shards[key] = np.memmap(self.dir / info["file"], dtype=self.dtype, mode="r", shape=(info["tokens"],))
        return self._shards[key]

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes of each token id's text, [vocab_size] int64: what bits per byte divides by.

        The document separator and other special tokens count 0 bytes: the separator stands for no text
        (the manifest's byte counts are the documents' bytes alone), so the bytes of a split's tokens sum
        to its documents' bytes. In a byte-level BPE vocabulary each character of a token stands for one
        byte; for other tokenizers a token's bytes are those of its text decoded alone."""
        if self._token_bytes is None:
            self._token_bytes = _token_byte_lengths(self.tokenizer, self.vocab_size)
        return self._token_bytes

    def __repr__(self) -> str:
        return f"Corpus({str(self.dir)!r}, domains={self.domains}, vocab_size={self.vocab_size})"


def _token_byte_lengths(tok, vocab_size: int) -> np.ndarray:
    from tokenizers import pre_tokenizers

    byte_level = (json.loads(tok.to_str()).get("decoder") or {}).get("type") == "ByteLevel"
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    special = set(tok.get_added_tokens_decoder())
    out = np.zeros(vocab_size, dtype=np.int64)
    for text, i in tok.get_vocab(with_added_tokens=True).items():
        if i >= vocab_size or i in special:
            continue
        if byte_level and set(text) <= alphabet:
            out[i] = len(text)
        else:
            out[i] = len(tok.decode([i], skip_special_tokens=False).encode("utf-8"))
    return out


def load_corpus(path: str | os.PathLike) -> Corpus:
    """Open a corpus folder built earlier (the ``dir`` of a ``Corpus``)."""
    return Corpus(path)


def summarize(corpus: Corpus) -> str:
    """A table of domain, role, split, MB, documents, tokens and bytes per token."""
    rows = [("domain", "role", "split", "MB", "docs", "tokens", "bytes/tok")]
    for d in corpus.domains:
        info = corpus.manifest["domains"][d]
        for s in SPLITS:
            si = info["splits"][s]
            bpt = f"{si['bytes'] / si['tokens']:.2f}" if si["tokens"] else "-"
            rows.append((d, info["role"], s, f"{si['bytes'] / 1e6:.2f}", str(si["documents"]), f"{si['tokens']:,}", bpt))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    head = f"corpus {corpus.name}: vocab {corpus.vocab_size}, {sum(corpus.manifest['domains'][d]['tokens'] for d in corpus.domains):,} tokens"
    skipped = corpus.manifest.get("skipped_domains") or {}
    tail = [f"skipped domain {d}: {why}" for d, why in skipped.items()]
    return "\n".join([head, *lines, *tail])
