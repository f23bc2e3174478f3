"""SCORECARD.md's sections on the principle (its points, its reading in each specification, the figure) and on the
predictions it makes for architectures the paper never saw."""

from __future__ import annotations

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
        f"(both at 2e-3), each with its own 95% interval, at alpha = {card['alpha']:g} one prediction at a time: "
        f"*keeps* = the gap shown within the margin ({card['margin']:g}) in both; *degrades* = shown worse in both; "
        "else *undecided*. Outside the Holm family: they test the principle out of sample, one at a time. "
        f"**{called} called, {missed} missed, {len(preds) - called - missed} not yet decided or not run.**",
        "",
        "| architecture | the principle predicts | why | study | gap, tuned [95% CI] (seeds) | gap, arm A | measured | the principle |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in preds:
        study = f"[{p['results']}]({p['results']}/README.md)" if p["results"] else "-"
        measured = p["outcome"] + (f" ({p['detail']})" if p["detail"] else "")
        lines.append(
            f"| `{p['architecture']}` ({p['paper']}) | {p['predicts']} | {p['why']} | {study} | {_cell(p['tuned'])} | "
            f"{_cell(p['arm_a'])} | {measured} | {p['called']} |"
        )
    return lines + [""]
