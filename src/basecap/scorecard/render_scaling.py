"""``results/SCALING.md``: what the scale steps say about whether each family's gap lasts, and what that predicts for
the paper's smallest size (written by ``basecap scorecard --write-readme`` from the card's ``scale_steps``)."""

from __future__ import annotations

from .render_cells import GENERATED, ci_text, gap_seeds_text, number_text, p_text, scale_text

READINGS = (("band", "the band"), ("lowest", "lowest common level"), ("half", "half of training"))


def _diff(d: dict | None) -> str:
    return "-" if not d else f"{number_text(d['mean'])} {ci_text(d['ci95'])} (p {p_text(d['p'])})"


def _family(step: dict) -> str:
    return step.get("family") or f"`{step['claim']}`"


def _row(step: dict) -> str:
    b = step["base"]
    if step["status"] != "measured":
        larger = f"{step['status']}: {step['detail']}"
        return f"| {_family(step)} | {b['size']} to {step['size']} | {' against '.join(step['runs'])} | {gap_seeds_text(b['test'], b['seeds'])} | {larger} | - | - | - | - |"
    dirs = step.get("direction") or {}
    lv = {x["level"]: x for x in step.get("levels") or []}
    cells = [f"**{dirs['band']}** {_diff(step['difference'])}" if "band" in dirs else "-"]
    for key, _ in READINGS[1:]:
        x = lv.get(key)
        cells.append(f"{dirs.get(key, '-')} {_diff(x['difference'] if x else None)}" if x else "-")
    return (
        f"| {_family(step)} | {b['size']} to {step['size']} | {' against '.join(step['runs'])} | {gap_seeds_text(b['test'], b['seeds'])} | "
        f"{gap_seeds_text(step['test'], step['seeds'])} | {' | '.join(cells)} | {'yes' if dirs.get('agree') else 'no'} |"
    )


def _trend_line(step: dict) -> str | None:
    t = step.get("trend")
    if not t:
        return None
    per = t["per_doubling"]
    what = "non-embedding parameters (the tokens grew with them)" if t["grows"] == "parameters" else "training tokens (the width held)"
    line = (
        f"- {_family(step)}, {step['base']['size']} to {step['size']} ({t['doublings']:.2f} doublings of {what}): the gap "
        f"changes by {number_text(per['mean'])} {ci_text(per['ci95'])} per doubling"
    )
    pr = t.get("prediction")
    if pr:
        target = pr["target"]
        sign = "above 0" if pr["ci95"][0] > 0 else "below 0" if pr["ci95"][1] < 0 else "across 0"
        line += (
            f". Carried log-linearly to the paper's {target['label'].upper()} ({target['params_non_embedding'] / 1e6:.1f}M non-embedding "
            f"parameters, {pr['k']:.2f} times the step's doublings past {step['size']}; on the step's path about "
            f"{pr['tokens_on_path'] / 1e6:.0f}M training tokens, where the paper's {target['label'].upper()} trains on "
            f"{target['train_tokens'] / 1e9:.1f}B, {target['train_tokens'] / pr['tokens_on_path']:.0f}x more): "
            f"**{number_text(pr['mean'])} {ci_text(pr['ci95'])}**, an interval {sign}"
        )
    return line + "."


def _missing(step: dict) -> str:
    """What a step still waits for: its larger size's runs, its smaller size's, or seeds for an interval."""
    parts = [step["detail"]] if step["status"] != "measured" else []
    if not step["base"]["seeds"] and step["base"].get("detail"):
        parts.append(step["base"]["detail"])
    if step["status"] == "measured" and not step["difference"]:
        parts.append(f"{len(step['seeds'])} seed(s) at {step['size']} so far, too few for an interval")
    return "; ".join(parts)


def scaling_markdown(card: dict) -> str:
    """The whole file: the steps per family, the readings' agreement, the prediction, and the comparison with
    DataDecide and the paper."""
    steps = card.get("scale_steps") or []
    margin = card.get("margin", 0.05)
    measured = [s for s in steps if s["status"] == "measured"]
    lines = [
        "# Does the gap last? The scale ladder",
        "",
        f"<!-- {GENERATED} -->",
        "",
        "Each family's OOD gap against Transformer++ at matched in-domain loss (nats/token, the mean of the held-out "
        "domains, positive = the architecture is worse; annealed points, seen targets) at a smaller and a larger size: "
        "the scorecard's scale steps (`experiments/paper/claims.toml`, `[[scale_steps]]`; [SCORECARD.md](SCORECARD.md), "
        '"Scale steps"). Every step is outside the Holm family: uncorrected 95% intervals, mean [95% CI] (seeds). '
        "A step changes one thing where it can: the ladder's steps (`scale_ladder.toml`, `scale_long.toml`) train every "
        "run at the shared rate 4e-3 at both sizes; the first step (`architectures_annealed_4x`) keeps each "
        "architecture at its rate tuned at small.",
        "",
        "**How a step is read** (declared with the ladder, docs/metrics.md \"Scale steps\"): from the Welch 95% interval "
        f"of the larger size's gap minus the smaller's, the gap **grows** (interval above 0), **shrinks** (below 0), "
        f"**holds** (inside +-{margin} nats, the claims' margin) or is **not determined**. It is read in the studies' "
        "band (4.0-4.2 in-domain), at each size's lowest common level and at half of training; a direction is a finding "
        "only where all three agree, otherwise it depends on where the gap is read.",
        "",
        "| family | step | runs | smaller size | larger size | in the band | at the lowest common level | at half of training | all three agree |",
        "|---|---|---|---|---|---|---|---|---|",
        *[_row(s) for s in steps],
        "",
        "## What the ladder predicts for the paper's size",
        "",
    ]
    trends = [line for s in measured if (line := _trend_line(s))]
    if trends:
        lines += [
            "A step of two sizes fixes a line in log size and nothing more; carried several doublings, its interval is "
            "what it is worth. The prediction is for a model on the step's own path (tokens growing with parameters); "
            "the paper's size trains on many more tokens per parameter (below), which the token step (the small width "
            "on 4x the tokens) speaks to.",
            "",
            *trends,
        ]
    else:
        lines.append("No measured step has both sizes' intervals and a growth in parameters or tokens yet: nothing to carry.")
    lines += ["", "## Against DataDecide and the paper", ""]
    size_steps = [s for s in measured if (s.get("trend") or {}).get("grows") == "parameters" and s["base"]["test"]]
    kept = [s for s in size_steps if (s["test"]["mean"] > 0) == (s["base"]["test"]["mean"] > 0)]
    if size_steps:
        lines.append(
            f"- **Ranking kept across the size step**: {len(kept)} of {len(size_steps)} measured size steps keep the sign "
            "of the gap (which of the two architectures has the lower OOD loss at matched in-domain loss). DataDecide "
            "(Magnusson et al., ICML 2025) finds the ranking at one small size predicts the 1B winner in about 80% of "
            "pairs; here the steps are 2 doublings, not 10, so agreement is expected to be higher, and a flip would "
            "say more than a match."
        )
        lines += [f"- {_family(s)} at {s['size']}: {s['reading']}." for s in measured]
    else:
        lines.append("No size step is measured yet.")
    lines += [
        "- The paper reports its gaps from 110M parameters up; a gap that grows or holds from 1.3M to 4.2M is in "
        "line with a gap still present there, one that shrinks is the first sign that a CPU-size gap might not last.",
        "",
        "## Not measured yet",
        "",
    ]
    waiting = [s for s in steps if s["status"] != "measured" or not s["difference"]]
    lines += [f"- {_family(s)}, {s['base']['size']} to {s['size']} ({scale_text(s['scale'])}): {_missing(s)}" for s in waiting] or [
        "Every step is measured."
    ]
    return "\n".join(lines) + "\n"
