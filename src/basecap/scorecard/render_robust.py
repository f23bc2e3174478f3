"""SCORECARD.md's sections on how far a verdict holds: the specification table (each claim under every
pre-declared analysis choice) and the gap along training."""

from __future__ import annotations

from .render_cells import ci_text, number_text, robust_text


def _spec_cell(s: dict | None) -> str:
    if s is None:
        return ""
    what = f"{s['label'].split(': ', 1)[1]}: " if s.get("label") else ""
    if s.get("label") and s.get("band"):  # an arm read at the rule band: its pair does not reach the study's
        what = f"{what[:-2]} (at {s['band'][0]:.2f}-{s['band'][1]:.2f}): "
    if s["verdict"] in ("n/a", "waiting"):
        return what + s["verdict"]
    return f"{what}{number_text(s['estimate'])} {ci_text(s['ci95'])} {s['verdict']}".strip()


def robustness_markdown(card: dict) -> list[str]:
    """The specification table: each tested claim's estimate and verdict under every pre-declared specification."""
    rows = [r for r in card["claims"] if r.get("specs")]
    if not rows:
        return []
    names: list[str] = []
    for r in rows:
        for s in r["specs"][1:]:
            if s["spec"] not in names:
                names.append(s["spec"])
    lines = [
        "## Robustness: the specification table",
        "",
        "Each claim again under every analysis choice declared in advance (docs/metrics.md, \"Robust verdicts\"): OOD "
        "loss on every target instead of the seen ones; the band moved to the lowest level every curve of the claim "
        "reaches, and to the level the slowest of its runs reaches at half of training; and each rate arm (the "
        "learning rate held equal: A, both at Transformer++'s 2e-3; B, both at the architecture's tuned rate); and a "
        "claim's controls (the same comparison in another study: for `mamba2_worse`, a BPE trained on the training domain "
        "only, in the tuned comparison and both arms, each read in nats per token of its own tokenizer at its study's "
        "band). Each cell is the estimate [95% CI] and the verdict that specification alone would "
        "give at the levels the claim's verdict used. A decided verdict is *robust* only when every specification "
        "agrees; otherwise the row names the one that breaks it. *n/a*: the specification cannot be read (the study "
        "has no band, or too few curves reach the level); *waiting*: the arm's runs are not published yet. An arm whose "
        "pair does not reach the study's band on every seed is read at the rule band of its pair (the band of the "
        "same width from the lowest level both reach, rounded up to 0.05; docs/metrics.md), shown as \"(at a-b)\".",
        "",
        "| claim | verdict | primary | " + " | ".join(names) + " |",
        "|" + "---|" * (3 + len(names)),
    ]
    for r in rows:
        by = {s["spec"]: s for s in r["specs"][1:]}
        lines.append(
            f"| `{r['id']}` | {r['verdict']} ({robust_text(r)}) | {_spec_cell(r['specs'][0])} | "
            + " | ".join(_spec_cell(by.get(n)) for n in names)
            + " |"
        )
    return lines + [""]


def along_training_markdown(card: dict) -> list[str]:
    """Where along training each verdict is read: the gap at the highest level every seed reaches, in the band, and
    at the lowest level at least 2 seeds reach (scorecard.json has every level; the figure draws them)."""
    rows = [r for r in card["claims"] if r.get("gap_along_training")]
    if not rows:
        return []
    lines = [
        "## Gap along training",
        "",
        "Each pair claim's gap against the matched in-domain level over the whole run (annealed points, the study's "
        "targets; mean over seeds with a 95% t interval where at least 2 seeds reach the level; `gap_along_training` "
        "in scorecard.json, drawn in [scorecard_gap_vs_level.png](scorecard_gap_vs_level.png) by `basecap scorecard "
        "--figures`). A verdict is read in the band; this shows whether the gap lasts as training goes on.",
        "",
        "| claim | verdict | early: highest level, gap [95% CI] | the band's middle | late: lowest level, gap [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        pts = [p for p in r["gap_along_training"]["points"] if p["ci95"]]
        if not pts:
            continue
        mid = sum(r["gap_along_training"]["band"]) / 2
        m = min(pts, key=lambda p: abs(p["level"] - mid))

        def cell(p: dict) -> str:
            return f"{p['level']:.2f}: {number_text(p['mean'])} {ci_text(p['ci95'])} ({p['n']} seeds)"

        lines.append(f"| `{r['id']}` | {r['verdict']} | {cell(pts[-1])} | {cell(m)} | {cell(pts[0])} |")
    return lines + [""]
