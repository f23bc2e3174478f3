"""Two scorecards side by side: each claim's verdict and estimate in an earlier ``scorecard.json`` and now, with the
robustness reading of now (``basecap scorecard --against OLD.json``; an earlier committed card:
``git show REV:results/scorecard.json > old.json``)."""

from __future__ import annotations

from typing import Any, cast

from .render_cells import estimate_text
from .rows import ClaimRow


def _reading(row: dict[str, Any] | None) -> tuple[str, str]:
    """(verdict, "estimate [interval]") of a card's row; a claim the card lacks reads "absent"."""
    if row is None:
        return "absent", "-"
    t = row.get("test") or {}
    if t.get("mean") is None:
        return str(row.get("verdict", "-")), "-"
    if "expect" in row:  # the card's own form: a speed ratio as "8.75x [8.30x, 9.22x]", an accuracy in points
        return str(row["verdict"]), estimate_text(cast(ClaimRow, row))
    ci = t.get("ci95")
    return str(row["verdict"]), f"{t['mean']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


def verdict_changes(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per claim of either card, in the new card's order (then the claims only the old card has):
    the verdict and estimate in each, whether the verdict changed, and now's robustness (robust, breaks)."""
    before = {r["id"]: r for r in old.get("claims", [])}
    now = {r["id"]: r for r in new.get("claims", [])}
    out = []
    for cid in [*now, *(c for c in before if c not in now)]:
        (v0, e0), (v1, e1) = _reading(before.get(cid)), _reading(now.get(cid))
        r = now.get(cid) or {}
        out.append(
            {
                "id": cid,
                "before": v0,
                "before_estimate": e0,
                "now": v1,
                "now_estimate": e1,
                "changed": v0 != v1,
                "robust": r.get("robust"),
                "breaks": list(r.get("breaks") or []),
            }
        )
    return out


def format_changes(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of ``verdict_changes``, then the count of changed verdicts."""
    lines = ["| claim | before | estimate before | now | estimate now | robust now | broken by |", "|" + "---|" * 7]
    for r in rows:
        robust = "-" if r["robust"] is None else "yes" if r["robust"] else "no"
        mark = "**" if r["changed"] else ""
        lines.append(
            f"| `{r['id']}` | {r['before']} | {r['before_estimate']} | {mark}{r['now']}{mark} | {r['now_estimate']} | {robust} "
            f"| {', '.join(r['breaks']) or '-'} |"
        )
    changed = sum(r["changed"] for r in rows)
    lines.append(f"\n{changed} of {len(rows)} verdicts changed (in bold).")
    return "\n".join(lines)
