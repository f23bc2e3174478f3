"""report.html: the report's Markdown drawn as one page through a Jinja2 template with autoescaping. Every text
(run, suite, task, mixer and domain names read back from run directories and JSON files, verdicts, numbers)
reaches the page as text; the only markup is the template's own, and the page runs no script.

The plots are either embedded as data: URIs (one self-contained file: a report in a ``runs/`` folder) or
referenced by their path relative to the page (``src="gap_vs_level.png"``: a published results folder, where
the PNGs are committed beside report.html and embedding them would store every figure twice). Either way the
page loads nothing from another site."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from urllib.parse import quote

# the Markdown the report writes: **bold** and `code` inside a line
_INLINE = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`")


def inline(text: str) -> list[tuple[str, str]]:
    """``text`` as (kind, text) spans, kind one of text, strong, code."""
    spans, pos = [], 0
    for m in _INLINE.finditer(text):
        if m.start() > pos:
            spans.append(("text", text[pos : m.start()]))
        spans.append(("strong", m.group(1)) if m.group(1) is not None else ("code", m.group(2)))
        pos = m.end()
    if pos < len(text):
        spans.append(("text", text[pos:]))
    return spans


def _cells(line: str) -> list[list[tuple[str, str]]]:
    return [inline(c.strip()) for c in line.strip().strip("|").split("|")]


def blocks(md: str) -> list[dict]:
    """The report's Markdown as blocks: headings, paragraphs (a ``> `` line is a warning), tables. Image
    lines are left out: the plots are embedded after the text."""
    out: list[dict] = []
    table: dict | None = None
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if set("".join(cells)) <= set("-:"):
                continue  # the header rule
            if table is None:
                table = {"kind": "table", "head": _cells(line), "rows": []}
                out.append(table)
            else:
                table["rows"].append(_cells(line))
            continue
        table = None
        if line.startswith("!["):
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append({"kind": "heading", "level": min(max(level, 1), 6), "spans": inline(line.lstrip("#").strip())})
        elif line.startswith("> "):
            out.append({"kind": "warn", "spans": inline(line[2:])})
        elif line.strip():
            out.append({"kind": "para", "spans": inline(line)})
    return out


def image_source(img: Path, link_from: Path | None = None) -> str:
    """The ``src`` of one image: a data: URI holding the PNG, or with ``link_from`` (the page's folder) the image's
    path relative to it, percent-encoded (a relative reference: no scheme, no host)."""
    if link_from is None:
        return "data:image/png;base64," + base64.b64encode(img.read_bytes()).decode("ascii")
    return quote(Path(os.path.relpath(img, link_from)).as_posix())


def render_html(md: str, images: list[Path], title: str = "basecap report", link_from: Path | None = None) -> str:
    """The page: ``md`` drawn from its blocks, then every image, embedded as a data: URI, or, with ``link_from``
    (the folder the page is written to), referenced by its path relative to that folder (``image_source``)."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("basecap.report", "templates"), autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True
    )
    pictures = [{"alt": img.stem, "src": image_source(img, link_from)} for img in images]
    return env.get_template("report.html.j2").render(title=title, blocks=blocks(md), images=pictures)
