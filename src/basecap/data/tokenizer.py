"""Byte-level BPE tokenizer (HF ``tokenizers``), trained on a corpus sample or loaded from a file.

Byte-level BPE with no normaliser decodes back to exactly the input text. The special token
``<|endoftext|>`` separates documents in the token shards; corpus text that happens to contain
that string is encoded as ordinary text (``encode_special_tokens``), never as the separator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..config_base import ConfigError

EOT = "<|endoftext|>"


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2, length: int | None = None) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    return tok


def load_tokenizer(path: str | Path, eot_token: str = EOT) -> tuple[Tokenizer, int]:
    """A tokenizer.json and the id of its document separator (which must be in the vocabulary)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"tokenizer file not found: {path}")
    tok = Tokenizer.from_file(str(path))
    eot_id = tok.token_to_id(eot_token)
    if eot_id is None:
        raise ConfigError(f"tokenizer {path} has no token {eot_token!r} (tokenizer.eot_token)")
    tok.encode_special_tokens = True
    return tok, eot_id
