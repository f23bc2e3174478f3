"""results/SCORECARD.md: the claim table with the family's error control, then its sections (the principle, its
predictions, robustness, the gap along training, the seeds and looks, the reused runs, the scale steps)."""

from __future__ import annotations

from .render_cells import (
    GENERATED,
    analogue_text,
    ci_text,
    counts,
    domain_text,
    estimate_text,
    expects_text,
    link_text,
    number_text,
    p_text,
    pending_text,
    robust_text,
    scale_text,
    source_text,
    study_cell,
    units_text,
    used_interval_text,
    verdict_text,
)
from .render_principle import predictions_markdown, principle_markdown
from .render_robust import along_training_markdown, robustness_markdown
from .render_scale import scale_markdown
from .verdicts import FAILS, HOLDS, NOT_RUN, UNDECIDED, UNTESTABLE


def scorecard_markdown(card: dict) -> str:
    c = counts(card)
    lines = [
        "# Scorecard: the paper's claims at this scale",
        "",
        f"<!-- {GENERATED} -->",
        "",
        f"Every claim of the paper (`experiments/paper/claims.toml`, {len(card['claims'])} claims) tested once, from the "
        "archived records of the runs it names, with the reports' own matching (the primary OOD gap at matched "
        "in-domain loss, paired by seed; a claim's gap is the mean over its held-out domains). "
        f"**Error control: one family of m = {card['family_size']} claims** (every claim testable at this scale, run or "
        "not; a claim not run counts with p = 1) **over both kinds of verdict**: Holm over the 2m 'holds' and 'fails' "
        "hypotheses with Shaffer's constraint (a claim's two nulls exclude each other, so at most m are true; at each "
        f"step the divisor is the number of claims with an untested hypothesis), so the chance of any false verdict, "
        f"'holds' or 'fails', is at most alpha = {card['alpha']:g}" + _simulated(card) + ". A claim with rate arms holds "
        "only if it holds in its own comparison and in each arm, and fails only if it fails in all (an "
        "intersection-union test); a study's seeds are read by its declared plan, or after undeclared looks by "
        f"Bonferroni over the looks. Equivalence margin: {card['margin']:g} nats/token. {card['margin_reason']}" + _others(card),
        "",
        f"**{c[HOLDS]} hold, {c[FAILS]} fail, {c[UNDECIDED]} undecided, {c[NOT_RUN]} not run, {c[UNTESTABLE]} without "
        f"a study; {sum(1 for r in card['claims'] if r.get('robust') and r['verdict'] in (HOLDS, FAILS))} of the "
        f"{c[HOLDS] + c[FAILS]} decided verdicts are robust** (the same verdict under every specification of "
        "\"Robustness\" below). How to read a verdict: *holds*: the corrected test shows the paper's direction (for "
        "'no effect': TOST shows the gap inside the margin; for 'small': the gap shown inside (0, margin)); *fails*: "
        "an effect of the paper's size is ruled out (for 'no effect': a gap shown beyond the margin); *undecided*: "
        f"neither, with the sign the estimate leans to, the minimum detectable effect at {card['power']:.0%} power (for "
        "'no effect': the smallest margin TOST could show) at level alpha/m, and the seeds that would decide it if the "
        "truth were the estimate (docs/metrics.md, \"The scorecard\").",
        "",
        "| claim | section | the paper | study | expects | estimate [95% CI] | interval the verdict used | seeds | p holds / fails (family) | verdict | robust | scale |",
        "|" + "---|" * 12,
    ]
    for r in card["claims"]:
        t = r["test"] or {}
        dom = domain_text(r)
        est = estimate_text(r) + (f" ({dom})" if dom else "")
        if r.get("before") and r["before"]["mean"] is not None:
            b = r["before"]
            est += f"; before the comparison design ({link_text(b['study'], b['results'])}): {number_text(b['mean'])} {ci_text(b['ci95'])}".rstrip()
        if r.get("pending"):
            est += "; " + pending_text(r["pending"])
        ph = f"{p_text(t.get('p_holds_holm'))} / {p_text(t.get('p_fails_holm'))}" if t.get("n", 0) >= 2 and "p_holds_holm" in t else "-"
        lines.append(
            f"| `{r['id']}` | {r['section']} | {r['paper']}{analogue_text(r)} | {study_cell(r)} | {expects_text(r)} | "
            f"{est} | {used_interval_text(t, r)} | {units_text(r)} | {ph} | {verdict_text(r)} | {robust_text(r)} | "
            f"{scale_text(r['scale'])} |"
        )
    lines += [
        "",
        "Estimates are nats/token (a trend's: per doubling of x; an interaction's: limited-domain gap minus "
        "mixed-domain gap); positive = worse out of distribution than the reference at the same in-domain loss. "
        "The interval the verdict used is the one its deciding test corresponds to, at that test's own step of the "
        "family (alpha / divisor, read through the study's plan): two-sided 1 - a for a direction and for every "
        "'fails', 1 - 2a for TOST and for 'small'; for an undecided claim, its 'holds' test's. For a claim with arms "
        "it is the claim's own comparison's; each arm's estimate is in \"Robustness\". A speed ratio is the run's speed "
        "over the reference's (tested as its log, over the benchmark's repeats); an accuracy is the run's minus the "
        "reference's, in points; the principle's estimate is a rank correlation with its bootstrap interval.",
        "",
        *principle_markdown(card),
        *predictions_markdown(card),
        *robustness_markdown(card),
        *along_training_markdown(card),
        *looks_markdown(card),
        "## Reused runs",
        "",
        f"The studies publish {card['run_records']} run records of {card['distinct_runs']} distinct runs: "
        f"{len(card['copies'])} records are copies (`--reuse`, identical records) of a run another study trained. "
        "A copy is the same training, not a replication; a claim's row names the copies it uses.",
        "",
        "| record | copy of |",
        "|---|---|",
    ]
    lines += [f"| {c['study']}/{c['run']} | {source_text(c, prefix='')} |" for c in card["copies"]]
    lines += scale_markdown(card)
    return "\n".join(lines) + "\n"


def _others(card: dict) -> str:
    """The family's members that are not loss gaps, and the claims at the paper's GPU scale outside it."""
    fam = [r for r in card["claims"] if r["family"]]
    metrics = sum(1 for r in fam if r.get("metric", "ood_gap") not in ("ood_gap", "spearman"))
    principle = any(r.get("kind") == "principle" for r in fam)
    out = ""
    if metrics or principle:
        out += (
            f" Besides the loss gaps, the family holds {metrics} claims whose statistic is a speed ratio or an accuracy (each "
            "with its own margin, stated in the claims file, and its own test)"
            + (" and the principle (selection ability predicts the OOD gap: \"The principle\" below)" if principle else "")
            + "."
        )
    if card.get("gpu_family_size"):
        out += (
            f" The {card['gpu_family_size']} claims at the paper's GPU scale are outside it: once their results exist they are "
            "read as a family of their own, so their arrival changes no verdict above."
        )
    return out


def _simulated(card: dict) -> str:
    sim = card.get("error_control")
    if not sim:
        return ""
    worst = max(sim["configurations"], key=lambda c: c["any_false"])
    size = f" of m = {sim['family_size']}" if sim.get("family_size") not in (None, card["family_size"]) else ""
    return (
        f" (simulated, `results/error_control.json`: at most {worst['any_false']:.3f} over {len(sim['configurations'])} "
        f"null configurations, {sim['n_sim']} families{size} each)"
    )


def looks_markdown(card: dict) -> list[str]:
    """How each study's seeds were looked at."""
    plans = card.get("plans") or {}
    if not plans:
        return []
    lines = ["## Seeds and looks", "", "| study | plan | how its claims are read |", "|---|---|---|"]
    for study, p in plans.items():
        lines.append(f"| {study} | {p['plan']} | {p['reading']} |")
    return lines + [""]
