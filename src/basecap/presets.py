"""Model size presets: the one table of preset names and the shapes they fill in.

A preset fills ``d_model``, ``n_layers`` and ``max_seq_len`` (explicit values win) and turns on
``match_params``; the matching itself is an explicit resolve step (``basecap.matching.resolve``).
"""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    # CPU quickstart scale: a few M parameters
    "tiny": {"d_model": 192, "n_layers": 4, "max_seq_len": 512},
    # the paper's scales (GPU); 110M / 1.3B with a 32k vocabulary and untied head
    "110m": {"d_model": 768, "n_layers": 12, "max_seq_len": 2048},
    "1.3b": {"d_model": 2048, "n_layers": 24, "max_seq_len": 2048},
}


def preset_names() -> list[str]:
    return list(PRESETS)
