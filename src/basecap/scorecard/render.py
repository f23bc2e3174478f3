"""The scorecard's generated files: results/SCORECARD.md, results/scorecard.json, the README's Results section and
each study README's generated block, with their text; and which of them a commit has out of date."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .render_claims import scorecard_markdown
from .render_readme import README_MARKERS, STUDY_MARKERS, readme_results, replace_block, study_block
from .render_scaling import scaling_markdown


def scorecard_json(card: dict) -> str:
    return json.dumps(card, indent=1, allow_nan=False) + "\n"


def _same(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """JSON values equal, floats to ``rel`` (relative, or absolute near 0)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, rel_tol=rel, abs_tol=rel)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, rel) for x, y in zip(a, b))
    return a == b


def stale_files(files: dict[Path, str]) -> list[Path]:
    """The generated files whose committed text differs from ``files``. A JSON file counts as current when its
    numbers agree to 9 significant digits: the last bits of a float may differ between machines and library
    builds, and every number the Markdown shows is rounded far above that."""
    out = []
    for p, text in files.items():
        if not p.is_file():
            out.append(p)
            continue
        old = p.read_text(encoding="utf-8")
        if old != text and not (p.suffix == ".json" and _same(_loads(old), json.loads(text))):
            out.append(p)
    return out


def _loads(text: str) -> Any:
    """Parsed JSON, or None for a file that is not JSON (then stale)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def generated_files(card: dict, root: Path) -> dict[Path, str]:
    """Every file the scorecard writes with --write-readme, and its text."""
    out = {root / "results" / "SCORECARD.md": scorecard_markdown(card), root / "results" / "scorecard.json": scorecard_json(card)}
    out[root / "results" / "SCALING.md"] = scaling_markdown(card)
    readme = root / "README.md"
    out[readme] = replace_block(readme.read_text(encoding="utf-8"), readme_results(card, root), README_MARKERS)
    for s in card["studies"]:
        p = root / "results" / s / "README.md"
        if p.is_file():
            out[p] = replace_block(p.read_text(encoding="utf-8"), study_block(card, s), STUDY_MARKERS, append=True)
    return out
