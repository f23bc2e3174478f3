"""Deterministic synthetic task generators: MQAR (Zoology), passkey and single-needle (RULER)
prompts, and attribute-value records for structured-extraction recall."""

from .mqar import IGNORE, MQARBatch, gap_distribution, mqar, mqar_mixture
from .needle import fill_prompt, niah_parts, noise_sentences, passkey_parts
from .records import extraction_example, record, record_text

__all__ = [
    "IGNORE",
    "MQARBatch",
    "extraction_example",
    "fill_prompt",
    "gap_distribution",
    "mqar",
    "mqar_mixture",
    "niah_parts",
    "noise_sentences",
    "passkey_parts",
    "record",
    "record_text",
]
