"""Attribute-value records embedded in real text, asked back: a download-free structured-extraction
recall task in the spirit of SWDE (Lockard et al. 2019; as used by the Based recall suite, Arora et
al. 2024), where a document is followed by ``<entity> <attribute>:`` and the model must copy the value.
"""

from __future__ import annotations

import random

from .words import ADJECTIVES, CITIES, COLORS, FIRST_NAMES, NOUNS

ATTRIBUTES = ("city", "founded", "founder", "color", "code", "employees")


def _value(rng: random.Random, attr: str) -> str:
    if attr == "city":
        return rng.choice(CITIES)
    if attr == "founded":
        return str(rng.randint(1800, 2020))
    if attr == "founder":
        return f"{rng.choice(FIRST_NAMES)} {rng.choice(NOUNS).capitalize()}"
    if attr == "color":
        return rng.choice(COLORS)
    if attr == "code":
        return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(3)) + str(rng.randint(100, 999))
    return str(rng.randint(10, 99999))


def record(rng: random.Random, n_attrs: int = 4) -> tuple[str, dict[str, str]]:
    """(entity name, {attribute: value}) with ``n_attrs`` distinct attributes."""
    entity = f"{rng.choice(ADJECTIVES).capitalize()} {rng.choice(NOUNS).capitalize()} Company"
    attrs = rng.sample(ATTRIBUTES, n_attrs)
    return entity, {a: _value(rng, a) for a in attrs}


def record_text(entity: str, attrs: dict[str, str]) -> str:
    return f"{entity}\n" + "".join(f"{entity} {a}: {v}\n" for a, v in attrs.items())


def extraction_example(rng: random.Random, paragraphs: list[str], n_records: int = 2, n_attrs: int = 4) -> dict:
    """A document of ``paragraphs`` with ``n_records`` records placed between them, and one
    (entity, attribute) asked back. Returns ``{"context", "question", "answers", "entity", "attribute"}``."""
    recs: list[tuple[str, dict[str, str]]] = []
    while len(recs) < n_records:
        e, a = record(rng, n_attrs)
        if all(e != r[0] for r in recs):
            recs.append((e, a))
    blocks = list(paragraphs)
    for e, a in recs:
        blocks.insert(rng.randint(0, len(blocks)), record_text(e, a).rstrip("\n"))
    entity, attrs = recs[rng.randrange(n_records)]
    attr = rng.choice(list(attrs))
    return {"context": "\n\n".join(blocks), "question": f"{entity} {attr}:", "answers": [attrs[attr]], "entity": entity, "attribute": attr}
