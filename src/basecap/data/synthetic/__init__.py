"""Deterministic synthetic task generators: MQAR (Zoology), passkey and single-needle (RULER)
prompts, and attribute-value records for structured-extraction recall."""

from .mqar import IGNORE, MQARBatch, gap_distribution, mqar, mqar_mixture

__all__ = ["IGNORE", "MQARBatch", "gap_distribution", "mqar", "mqar_mixture"]
