"""The scale steps as text: a claim measured again at a larger size, outside the family (SCORECARD.md's section,
and the rows a study README shows for a step on its runs)."""

from __future__ import annotations

from .render_cells import ci_text, link_text, number_text, p_text, scale_text


def step_rows(step: dict, prefix: str = "") -> list[str]:
    """A scale step as two table rows: the claim at its own size, then at the step's (or what it is waiting for)."""
    b = step["base"]
    bt = b["test"] or {}
    if b.get("own", True):
        base_note = "the claim's own size (its row in the family)"
    else:
        runs = " against ".join(f"`{r}`" for r in step["runs"])
        base_note = f"{runs} at the smaller size" + (f": {b['detail']}" if not b["seeds"] and b.get("detail") else "")
    out = [
        f"| `{step['claim']}` | {b['size']} | {scale_text(b['scale'])} | {link_text(b['study'], b['results'], prefix)} | "
        f"{number_text(bt.get('mean'))} {ci_text(bt.get('ci95'))} | {len(b['seeds']) or '-'} | {base_note} |"
    ]
    t = step["test"] or {}
    if step["status"] == "measured":
        d = step["difference"]
        diff = f"; minus the {b['size']} gap: {number_text(d['mean'])} {ci_text(d['ci95'])} (Welch p {p_text(d['p'])})" if d else ""
        est, note = f"{number_text(t.get('mean'))} {ci_text(t.get('ci95'))}", f"{step['reading']}{diff}"
    else:
        est, note = "-", f"{step['status']}: {step['detail']}"
    out.append(
        f"| `{step['claim']}` | {step['size']} | {scale_text(step['scale'])} | {link_text(step['study'], step['results'], prefix)} | "
        f"{est} | {len(step['seeds']) or '-'} | {note} |"
    )
    return out


def step_level_rows(step: dict) -> list[str]:
    """A measured step's gap at both sizes at each other level (lowest common level, half of training)."""

    def cell(x: dict | None) -> str:
        if not x or not x.get("test"):
            return "-"
        t = x["test"]
        return f"{number_text(t['mean'])} {ci_text(t['ci95'])} at {x['band'][0]:.2f}-{x['band'][1]:.2f} ({t['n']} seed{'s' if t['n'] != 1 else ''})"

    out = []
    for lv in step.get("levels") or []:
        d = lv["difference"]
        diff = f"{number_text(d['mean'])} {ci_text(d['ci95'])} (Welch p {p_text(d['p'])})" if d else "-"
        out.append(
            f"| `{step['claim']}` | {step['base']['size']} to {step['size']} | {lv['label']} | {cell(lv['base'])} | {cell(lv['step'])} | {diff} |"
        )
    return out


def gap_model_lines(step: dict) -> list[str]:
    """A measured step's model of the gap against level and size (scorecard/gap_model.py), one bullet."""
    g = step.get("gap_model")
    if not g:
        return []

    def per_size(x: dict) -> str:
        a, b = x["gap_at_center"], x["slope"]
        return f"{number_text(a['mean'])} {ci_text(a['ci95'])} at {g['center']:.2f}, slope {number_text(b['mean'])} {ci_text(b['ci95'])} per nat ({len(x['seeds'])} seeds)"

    def term(t: dict | None) -> str:
        return "-" if not t else f"{number_text(t['mean'])} {ci_text(t['ci95'])}"

    return [
        f"- `{step['claim']}`, {step['base']['size']} against {step['size']}, over the levels both reach "
        f"({g['overlap'][1]:.2f} down to {g['overlap'][0]:.2f}): {step['base']['size']} {per_size(g['base'])}; "
        f"{step['size']} {per_size(g['step'])}. Level term (slope, both sizes) {term(g['level'])}; size term (gap at "
        f"{g['center']:.2f}, larger minus smaller) {term(g['size'])}; level x size (slope, larger minus smaller) "
        f"{term(g['level_x_size'])}. Supported: **{g['model']}**."
    ]


STEP_HEADER = ["| claim | size | scale | study | gap [95% CI] | seeds | reading |", "|---|---|---|---|---|---|---|"]


def scale_markdown(card: dict) -> list[str]:
    """SCORECARD.md's section on the scale steps (none: no section)."""
    steps = card.get("scale_steps") or []
    if not steps:
        return []
    lines = [
        "",
        "## Scale steps (outside the family)",
        "",
        "A claim measured again at a larger size, with the same design and band: its gap with an uncorrected 95% "
        "interval, and the difference from the gap at the claim's own size (Welch's interval: the sizes' runs are "
        "independent trainings). No Holm correction and no verdict: a step says whether a gap keeps its size as the "
        "model and its training tokens grow. " + " ".join(f"`{s['claim']}` at {s['size']}: {s['why']}" for s in steps),
        "",
        *STEP_HEADER,
    ]
    for step in steps:
        lines += step_rows(step)
    levels = [row for step in steps for row in step_level_rows(step)]
    if levels:
        lines += [
            "",
            "The same steps read at each size's lowest common level (the band from the lowest level every curve of the "
            "pair reaches) and at half of training (the band centred on the level the slower run reaches at its fork "
            "at 50%), so that a step is compared at the same level, at the same fraction of training, and where each "
            "size's curves end:",
            "",
            "| claim | step | where | smaller size | larger size | difference (larger minus smaller) |",
            "|---|---|---|---|---|---|",
            *levels,
        ]
    models = [line for step in steps for line in gap_model_lines(step)]
    if models:
        lines += [
            "",
            "The simplest model the steps support for the gap against the matched level and the size (two stages: each "
            "seed's gap curve as a line over the levels both sizes reach, then the seeds of a size as replicates; a term "
            "is kept when its uncorrected 95% interval excludes 0; docs/metrics.md, \"Scale steps\"):",
            "",
            *models,
        ]
    return lines
