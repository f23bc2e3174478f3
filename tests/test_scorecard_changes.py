"""``basecap scorecard --against OLD.json``: each claim's verdict and estimate then and now."""

from __future__ import annotations

import json

from basecap.scorecard.changes import format_changes, verdict_changes


def card(*rows):
    return {"claims": list(rows)}


def row(cid, verdict, mean=None, ci=None, **more):
    return {"id": cid, "verdict": verdict, "test": None if mean is None else {"mean": mean, "ci95": ci}, **more}


def test_verdicts_then_and_now_side_by_side():
    old = card(row("a", "holds", 0.2, [0.1, 0.3]), row("b", "fails", -0.02, [-0.03, -0.01]), row("gone", "undecided", 0.1, None))
    new = card(
        row("a", "undecided", 0.2, [0.1, 0.3], robust=False, breaks=["targets: all", "rate arm A"]),
        row("b", "fails", -0.02, [-0.03, -0.01], robust=True, breaks=[]),
        row("new", "not run"),
    )
    got = {r["id"]: r for r in verdict_changes(old, new)}
    assert list(got) == ["a", "b", "new", "gone"]
    assert got["a"]["changed"] and (got["a"]["before"], got["a"]["now"]) == ("holds", "undecided")
    assert got["a"]["before_estimate"] == "+0.200 [+0.100, +0.300]" and got["a"]["breaks"] == ["targets: all", "rate arm A"]
    assert not got["b"]["changed"] and got["b"]["robust"] is True
    assert (got["new"]["before"], got["new"]["now"], got["new"]["now_estimate"]) == ("absent", "not run", "-")
    assert (got["gone"]["now"], got["gone"]["before_estimate"]) == ("absent", "+0.100")
    table = format_changes(list(got.values()))
    assert "| `a` | holds | +0.200 [+0.100, +0.300] | **undecided** | +0.200 [+0.100, +0.300] | no | targets: all, rate arm A |" in table
    assert "| `b` | fails | -0.020 [-0.030, -0.010] | fails | -0.020 [-0.030, -0.010] | yes | - |" in table
    assert table.endswith("3 of 4 verdicts changed (in bold).")


def test_the_command_prints_the_table_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    from basecap.cli import main

    root = Path(__file__).resolve().parents[1]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(card(row("limited_exposes_mixed_hides", "undecided", 0.1, [0.0, 0.2]))))
    before = (root / "results" / "scorecard.json").read_bytes()
    main(["scorecard", "--root", str(root), "--against", str(old)])
    out = capsys.readouterr().out
    assert "| `limited_exposes_mixed_hides` | undecided | +0.100 [+0.000, +0.200] |" in out and "verdicts changed" in out
    assert (root / "results" / "scorecard.json").read_bytes() == before


def test_a_speed_ratio_and_an_accuracy_read_in_their_own_units():
    """A row in the card's own form (it names what it expects) shows a speed ratio as a ratio and an accuracy in
    points, as SCORECARD.md does; a bare row falls back to the loss gap's numbers."""
    speed = row("s", "holds", 2.169, [2.116, 2.221], metric="speed_ratio", expect="better")
    acc = row("a", "undecided", -3.0, [-12.5, 6.5], metric="accuracy", expect="no_effect")
    got = {r["id"]: r for r in verdict_changes(card(), card(speed, acc))}
    assert got["s"]["now_estimate"] == "8.75x [8.30x, 9.22x]"
    assert got["a"]["now_estimate"].startswith("-3.0") and "[-12.5" in got["a"]["now_estimate"]
