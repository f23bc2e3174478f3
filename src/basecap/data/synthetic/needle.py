"""Long-context retrieval prompts: passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention")
and single needle-in-a-haystack from RULER (Hsieh et al. 2024), with word, number or UUID values and
a haystack of repeated noise sentences or real text.

A prompt is ``prefix + haystack (with the needle at a relative depth) + question``, filled to a
target length in tokens of the model's tokenizer. Everything is drawn from a ``random.Random(seed)``.
"""

from __future__ import annotations

import random
import uuid
from typing import Callable, Iterator

from .words import ADJECTIVES, NOUNS

NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")

PASSKEY_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there."
)
NIAH_PREFIX = "Some special magic {kind} are hidden within the following text. Make sure to memorize it. I will quiz you about the {kind} afterwards."
VALUE_KINDS = {"number": "numbers", "word": "words", "uuid": "uuids"}


def noise_sentences() -> Iterator[str]:
    while True:
        yield from NOISE


def passkey_parts(rng: random.Random, digits: int = 5) -> tuple[str, str, str, str]:
    """(prefix, needle, question, answer) for one passkey prompt."""
    key = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    return PASSKEY_PREFIX, needle, "What is the pass key? The pass key is", key


def niah_parts(rng: random.Random, value_kind: str = "number") -> tuple[str, str, str, str]:
    """(prefix, needle, question, answer) for one RULER-style single-needle prompt."""
    if value_kind not in VALUE_KINDS:
        raise ValueError(f"value_kind must be one of {sorted(VALUE_KINDS)}, got {value_kind!r}")
    key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if value_kind == "number":
        value = str(rng.randint(1_000_000, 9_999_999))
    elif value_kind == "word":
        value = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
        while value == key:
            value = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    else:
        value = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    kind = VALUE_KINDS[value_kind]
    needle = f"One of the special magic {kind} for {key} is: {value}."
    question = (
        f"What is the special magic {kind[:-1]} for {key} mentioned in the provided text? "
        f"The special magic {kind[:-1]} for {key} mentioned in the provided text is"
    )
    return NIAH_PREFIX.format(kind=kind), needle, question, value


def fill_prompt(
    encode: Callable[[str], list[int]], prefix: str, needle: str, question: str, sentences: Iterator[str], length: int, *, depth: float
) -> tuple[str, int, float]:
    """Fill a haystack so the whole prompt has about ``length`` tokens (never more), with the needle
    after ``depth`` (0..1) of the haystack sentences. Returns (prompt, tokens, actual depth)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    fixed = len(encode(f"{prefix}\n{needle}\n{question}"))
    if fixed > length:
        raise ValueError(f"a prompt without haystack already has {fixed} tokens, more than length={length}")
    budget = length - fixed
    hay: list[str] = []
    used = 0
    while used < budget:
        s = next(sentences)
        used += len(encode(" " + s))
        hay.append(s)

    def build(h: list[str]) -> tuple[str, float]:
        k = round(depth * len(h))
        body = " ".join(h[:k] + [needle] + h[k:])
        return f"{prefix}\n{body}\n{question}", (k / len(h) if h else 0.0)

    text, actual = build(hay)
    n = len(encode(text))
    while n > length and hay:
        hay.pop()
        text, actual = build(hay)
        n = len(encode(text))
    return text, n, actual
