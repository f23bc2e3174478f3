"""The scorecard's blocks in hand-written files: the README's Results section and each study README's generated
block, written between markers so the text around them stays hand-written."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .render_cells import (
    GENERATED,
    gap_seeds_text,
    counts,
    lean_text,
    link_text,
    pending_text,
    robust_text,
    scale_range,
    source_text,
    units_text,
    used_interval_text,
    value_text,
    verdict_text,
)
from .render_scale import STEP_HEADER, step_rows
from .verdicts import FAILS, HOLDS, NOT_RUN, UNDECIDED, UNTESTABLE

README_MARKERS = ("<!-- results:begin -->", "<!-- results:end -->")
STUDY_MARKERS = ("<!-- scorecard:begin -->", "<!-- scorecard:end -->")
FIGURE = "results/architectures/indomain_vs_ood.png"


def _summaries(root: Path, card: dict) -> dict[str, dict]:
    return {s: json.loads((root / "results" / s / "summary.json").read_text(encoding="utf-8")) for s in card["studies"]}


def _study_line(name: str, s: dict, card: dict) -> str:
    """One line per published study: its runs and seeds, and the claims it answers with their verdicts."""
    runs = ", ".join(f"{r['name']} ({len(r['seeds'])})" for r in s["runs"])
    claims = [r for r in card["claims"] if r["results"] == name]
    said = "; ".join(f"`{r['id']}` {r['verdict']}" for r in claims)
    for kind, what in (("arms", "rate arms of"), ("controls", "a control of")):
        of = [r["id"] for r in card["claims"] if any(a.get("results") == name for a in r.get(kind) or [])]
        if of:
            said += ("; " if said else "") + f"{what} " + ", ".join(f"`{i}`" for i in of)
    said = said or "no claim of the paper"
    copies = sum(c["study"] == name for c in card["copies"])
    reuse = f"; {copies} records are copies" if copies else ""
    return f"- [`results/{name}/`](results/{name}/README.md): runs (seeds) {runs}{reuse}. Claims: {said}."


def _step_line(step: dict) -> str:
    """A scale step as one README table row: the gap at each size, or why it is not there yet."""

    b = step["base"]
    larger = gap_seeds_text(step["test"], step["seeds"], step["status"]) if step["status"] == "measured" else step["status"]
    smaller = gap_seeds_text(b["test"], b["seeds"], "not yet")
    return f"| `{step['claim']}` | {b['size']} to {step['size']} | {' against '.join(step['runs'])} | {smaller} | {larger} |"


def readme_results(card: dict, root: Path) -> str:
    """The README's Results section (between the markers)."""
    c = counts(card)
    by = {v: [r for r in card["claims"] if r["verdict"] == v] for v in (HOLDS, FAILS, UNDECIDED)}
    scales = [r["scale"] for r in card["claims"] if r["test"] and r["scale"]]
    lines = [
        README_MARKERS[0],
        f"<!-- {GENERATED} -->",
        f"![In-domain vs OOD loss over training, architectures study at the small CPU size]({FIGURE})",
        "",
        f"The paper's claims at this scale ({scale_range(scales)}), each tested once in one family of "
        f"{card['family_size']} (Holm over both kinds of verdict with Shaffer's constraint; equivalence margin {card['margin']:g} nats/token), from "
        f"[`results/SCORECARD.md`](results/SCORECARD.md): **{c[HOLDS]} hold, {c[FAILS]} fail, {c[UNDECIDED]} "
        f"undecided, {c[NOT_RUN]} not run** ({sum(r['verdict'] == NOT_RUN and 'GPU' in r['detail'] for r in card['claims'])} "
        f"of them need the paper's GPU scale), {c[UNTESTABLE]} without a study.",
        "",
    ]
    lines += ["| claim | the paper | study | estimate | interval the verdict used | seeds | verdict |", "|---|---|---|---|---|---|---|"]
    for r in [*by[HOLDS], *by[FAILS], *by[UNDECIDED]]:
        lean = f", {lean_text(r)}" if r["verdict"] == UNDECIDED and lean_text(r) else ""
        robust = f" ({robust_text(r)})" if r["verdict"] in (HOLDS, FAILS) else ""
        t = r["test"] or {}
        lines.append(
            f"| `{r['id']}` | {r['paper']} | {link_text(r['study'], r['results'], 'results/')} | {value_text(r, t.get('mean'))} | "
            f"{used_interval_text(t, r)} | {units_text(r)} | {r['verdict']}{robust}{lean} |"
        )
    waiting = sorted({r["study"] for r in card["claims"] if r["verdict"] == NOT_RUN})
    in_part = sorted({r["study"] for r in card["claims"] if r.get("lacking")})  # published without some claims' runs yet
    lines += [
        "",
        f"Not run yet: {', '.join(f'`{s}`' for s in waiting if s not in in_part)} (their claims fill in when the results appear).",
        "",
    ]
    if in_part:
        lines += [f"Published in part, some claims still waiting for their runs: {', '.join(f'`{s}`' for s in in_part)}.", ""]
    reruns = sorted({(r["pending"]["study"], r["study"]) for r in card["claims"] if r.get("pending")})
    if reruns:
        lines += [
            "Reruns not published yet (until they are, their claims are answered by the earlier study): "
            + ", ".join(f"`{new}` (for `{old}`)" for new, old in reruns)
            + ".",
            "",
        ]
    steps = card.get("scale_steps") or []
    if steps:
        lines += [
            "Scale steps, outside the family (`results/SCORECARD.md`, \"Scale steps\"; per family, whether the gap grows, "
            "holds or shrinks, and what that predicts for the paper's size: [`results/SCALING.md`](results/SCALING.md)): "
            "each claim's gap at the smaller and the larger size, mean [95% CI] (seeds).",
            "",
            "| claim | step | runs | smaller size | larger size |",
            "|---|---|---|---|---|",
        ]
        lines += [_step_line(step) for step in steps]
        lines.append("")
    lines += [
        "Each published study (its report and `summary.json` hold the numbers; verdicts are the scorecard's):",
        "",
    ]
    lines += [_study_line(n, s, card) for n, s in _summaries(root, card).items()]
    lines.append(README_MARKERS[1])
    return "\n".join(lines)


def study_block(card: dict, study: str) -> str:
    """A study README's generated block: the claims it provides and the records that are copies."""
    rows = [r for r in card["claims"] if r["results"] == study]
    copies = [c for c in card["copies"] if c["study"] == study]
    lines = [STUDY_MARKERS[0], f"<!-- {GENERATED} -->", "## In the scorecard", ""]
    if rows:
        lines += [
            "Claims of the paper this study tests, with the project's verdict (one family over every claim, "
            "[`results/SCORECARD.md`](../SCORECARD.md)):",
            "",
            "| claim | the paper | estimate | interval the verdict used | seeds | verdict | robust |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| `{r['id']}` | {r['paper']} | {value_text(r, (r['test'] or {}).get('mean'))} | {used_interval_text(r['test'] or {}, r)} | "
            f"{units_text(r)} | {verdict_text(r)} | {robust_text(r)} |"
            for r in rows
        ]
        by_rerun: dict[str, list[dict]] = {}
        for r in rows:
            if r.get("pending"):
                by_rerun.setdefault(r["pending"]["study"], []).append(r)
        for rerun, rs in by_rerun.items():
            ids = ", ".join(f"`{r['id']}`" for r in rs)
            lines += ["", f"{ids} move to `{rerun}` once it is published: {pending_text(rs[0]['pending'])}."]
    steps = [s for s in card.get("scale_steps") or [] if study in (s["results"], s["base"]["results"])]
    if steps:
        lines += [
            "",
            "Scale steps outside the family ([`results/SCORECARD.md`](../SCORECARD.md), \"Scale steps\") that read this "
            "study's runs: a claim's gap at the smaller size, then at the larger.",
            "",
            *STEP_HEADER,
        ]
        for step in steps:
            lines += step_rows(step, prefix="../")
    elif not rows:
        lines.append("No claim of the paper is tested on this study's runs.")
    if copies:
        lines += ["", "Runs copied from another study (identical records, `--reuse`): the same trainings, not replications.", ""]
        lines += [f"- `{c['run']}`: copy of {source_text(c)}" for c in copies]
    else:
        lines += ["", "Every run record here was trained for this study (none is a copy)."]
    lines.append(STUDY_MARKERS[1])
    return "\n".join(lines)


def replace_block(text: str, block: str, markers: tuple[str, str], append: bool = False) -> str:
    """``text`` with the block between ``markers`` replaced (appended at the end when absent and ``append``)."""
    pat = re.compile(re.escape(markers[0]) + r".*?" + re.escape(markers[1]), re.S)
    if pat.search(text):
        return pat.sub(lambda _: block, text, count=1)
    if not append:
        raise ValueError(f"no {markers[0]} ... {markers[1]} block")
    return text.rstrip("\n") + "\n\n" + block + "\n"
