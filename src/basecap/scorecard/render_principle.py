"""SCORECARD.md's sections on the principle (its points, its reading in each specification, the figure) and on the
predictions it makes for architectures the paper never saw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIGURE_NAME = "principle_mqar_vs_gap.png"


def _n(v: float | None, p: int = 3, sign: str = "+") -> str:
    return "-" if v is None else f"{v:{sign}.{p}f}"


def _cell(s: dict | None, p: int = 3, sign: str = "+") -> str:
    """mean [95% CI] (n) of a summary, or '-'."""
    if not s or s.get("mean") is None:
        return "-"
    ci = f" [{_n(s['ci95'][0], p, sign)}, {_n(s['ci95'][1], p, sign)}]" if s.get("ci95") else ""
    return f"{_n(s['mean'], p, sign)}{ci} ({s['n']})"


def principle_markdown(card: dict) -> list[str]:
    sec = card.get("principle")
    if not sec:
        return []
    row = next(r for r in card["claims"] if r.get("kind") == "principle")
    proto = sec["protocol"]
    t = row.get("test")
    reading = (
        f"rho = {t['mean']:+.2f}, 95% bootstrap interval [{t['ci95'][0]:+.2f}, {t['ci95'][1]:+.2f}] over {t['n']} points "
        f"({t['resamples']} resamples, {t['undefined']} with every drawn point tied on a coordinate, counted as rho = 0): "
        f"**{row['verdict']}**"
        if t
        else f"**not run**: {row['detail']}"
    )
    arm = sec.get("arm_a")
    arm_text = (
        f"rho = {arm['mean']:+.2f} [{arm['ci95'][0]:+.2f}, {arm['ci95'][1]:+.2f}] over {arm['n']} points (no verdict)"
        if arm
        else f"not read ({sec['arm_a_points']} points have an arm A reading; at least 5 needed)"
    )
    lines = [
        "## The principle: selection ability against the OOD gap",
        "",
        "Pre-registered in `experiments/paper/principle.toml` (docs/metrics.md, \"The principle\"): across architectures, the "
        "better an architecture selects, the smaller its OOD gap. Selection ability is MQAR accuracy at "
        f"{proto['score_kv_pairs']} key-value pairs ({proto['n_layers']} layers of width {proto['d_model']}, {proto['seq_len']}-token "
        f"sequences, {proto['steps']} steps, MQAR seeds {', '.join(map(str, proto['seeds']))}; `basecap principle mqar` writes "
        "`results/principle/mqar.json`); the gap is each point's primary gap against its study's reference, per LM seed. "
        "Spearman's rho of the points' means, with a percentile bootstrap over points, then over each drawn point's LM "
        f"seeds and MQAR seeds ({sec['bootstrap']['resamples']} resamples, generator seed {sec['bootstrap']['seed']}). "
        f"Holds: rho < 0 shown; fails: a correlation of {sec['margin']:g} or stronger ruled out. One claim of the family.",
        "",
        f"- Tuned comparison (the verdict): {reading}.",
        f"- Arm A (each architecture at Transformer++'s rate where it has that arm, else its tuned gap): {arm_text}.",
        f"- Figure: [{FIGURE_NAME}]({FIGURE_NAME}) (`basecap scorecard --figures`; drawn when a point has both its gap and its MQAR).",
        "",
        "| point | study | run vs reference | gap, tuned [95% CI] (LM seeds) | gap, arm A | MQAR accuracy [95% CI] (seeds) | missing |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in sec["points"]:
        a = p["arm_a"]
        arm_cell = _cell(a) if a.get("values") else f"waiting: {a.get('missing')}" if a.get("label") else "-"
        if a.get("values") and a.get("label", "").startswith("none"):
            arm_cell = "(no arm A: the tuned gap)"
        gap = "0 (the anchor)" if p["run"] == p["reference"] else _cell(p["gap"])
        if p["gap"] and p["gap"].get("note"):
            gap += f" ({p['gap']['note']})"
        if p["run"] == p["reference"]:
            arm_cell = "0"
        lines.append(
            f"| {p['label']} | {p['study']} | {p['run']} vs {p['reference']} | {gap} | {arm_cell} | "
            f"{_cell(p['mqar'], 2, '')} | {p['missing'] or '-'} |"
        )
    return lines + [""]


def predictions_markdown(card: dict) -> list[str]:
    preds = card.get("predictions") or []
    if not preds:
        return []
    called = sum(p["called"] == "called" for p in preds)
    missed = sum(p["called"] == "missed" for p in preds)
    lines = [
        "## Predictions (outside the family)",
        "",
        "What the principle predicts for architectures published after the paper, written in "
        "`experiments/paper/principle.toml` before any of them trained (docs/metrics.md, \"Predictions\"). Each is "
        "trained through `basecap compare`; its gap against Transformer++ is read in the tuned comparison and in arm A "
        f"(both at 2e-3), each with its own 95% interval, at alpha = {card['alpha']:g} one prediction at a time, the p values "
        "read through the plan of looks of the study it joined: "
        f"*keeps* = the gap shown within the margin ({card['margin']:g}) in both; *degrades* = shown worse in both; "
        "else *undecided*. Outside the Holm family: they test the principle out of sample, one at a time. "
        f"**{called} called, {missed} missed, {len(preds) - called - missed} not yet decided or not run.**",
        "",
        "The outcome is read again under each of the scorecard's specifications, each on its own (every target instead "
        "of the seen ones, the band at the lowest common level, at half of training): *robust* when all give it.",
        "",
        "| architecture | the principle predicts | why | study | gap, tuned [95% CI] (seeds) | gap, arm A | measured | "
        "under each specification | the principle |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in preds:
        study = f"[{p['results']}]({p['results']}/README.md)" if p["results"] else "-"
        measured = p["outcome"] + (f" ({p['detail']})" if p["detail"] else "")
        specs = "; ".join(f"{sp['spec']}: {sp['outcome']}" for sp in p.get("specs") or [])
        robust = ("robust" if p.get("robust") else "**fragile**") + (f" ({specs})" if specs else "") if p.get("specs") else "-"
        lines.append(
            f"| `{p['architecture']}` ({p['paper']}) | {p['predicts']} | {p['why']} | {study} | {_cell(p['tuned'])} | "
            f"{_cell(p['arm_a'])} | {measured} | {robust} | {p['called']} |"
        )
    return lines + [""]


def _label_points(ax: Any, points: list[tuple[float, float, str]]) -> None:
    """Label each point to its upper right; a label that would overprint one already placed moves down a line at a
    time (in data units of the drawn axes: a line of 7-point text and a character's width, roughly)."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    line, char = (y1 - y0) / 30, (x1 - x0) / 95
    boxes: list[tuple[float, float, float]] = []  # (left, right, baseline) of each placed label
    for x, y, label in sorted(points, key=lambda q: (-q[1], q[0])):
        left, right, base = x + char / 2, x + char / 2 + char * len(label), y + line / 4
        while any(left < r and lft < right and abs(base - b) < line for lft, r, b in boxes):
            base -= line
        boxes.append((left, right, base))
        ax.annotate(label, (x, y), xytext=(left, base), textcoords="data", fontsize=7)


def plot_principle(section: dict, path: Path) -> bool:
    """One point per architecture: MQAR accuracy (x, 95% interval over MQAR seeds) against its gap (y, 95% interval
    over LM seeds), labelled. False (nothing drawn) when no point has both."""
    pts = [p for p in section["points"] if p["gap"] and p["mqar"]]
    if not pts:
        return False
    import matplotlib  # only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for p in pts:
        x, y = p["mqar"]["mean"], p["gap"]["mean"]
        lo, hi = (max(0.0, p["mqar"]["ci95"][0]), min(1.0, p["mqar"]["ci95"][1])) if p["mqar"]["ci95"] else (x, x)  # an accuracy
        xerr = [[x - lo], [hi - x]] if p["mqar"]["ci95"] else None
        yerr = [[y - p["gap"]["ci95"][0]], [p["gap"]["ci95"][1] - y]] if p["gap"]["ci95"] else None
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", color="C3" if p["missing"] else "C0", capsize=2, lw=0.8)
    _label_points(ax, [(p["mqar"]["mean"], p["gap"]["mean"], p["label"]) for p in pts])
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel(f"MQAR accuracy at {section['protocol']['score_kv_pairs']} key-value pairs (mean, 95% CI over MQAR seeds)")
    ax.set_ylabel("OOD gap against the reference, nats/token (95% CI over LM seeds)")
    ax.set_title("Selection ability against the OOD gap", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
