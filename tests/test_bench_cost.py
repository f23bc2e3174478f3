"""``basecap bench cost``: a finished run's wall clock split into optimizer steps, cooldown branches and the rest,
read from its records, grouped per mixer."""

from __future__ import annotations

import json

import pytest

from basecap.bench.cost import format_before_after, format_table, group_costs, main, run_cost
from basecap.train import train
from test_train import run_cfg


def test_a_run_is_split_into_steps_branches_and_the_rest(tiny_corpus, tiny_recipe_path, tmp_path, capsys):
    cfg = run_cfg(tiny_recipe_path, steps=12, schedule="wsd", cooldowns=[4, 8], cooldown_fraction=0.5)
    train(cfg, tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    row = run_cost(tmp_path / "r")
    assert row["mixer"] == "attention" and row["compile"] is False
    assert row["main"] == pytest.approx(12 * row["step_s"]) and row["branches"] == pytest.approx((2 + 4) * row["step_s"])
    assert row["main"] + row["branches"] + row["rest"] == pytest.approx(row["wall"])
    assert row["n_evals"] == 3 + 2  # evaluations at 4, 8, 12 and the two annealed points
    assert row["train_tokens"] == (12 + 6) * 4 * 32
    assert row["eval_tokens"] > 0
    assert run_cost(tmp_path / "nothing")["skipped"].startswith("not a finished run")
    (g,) = group_costs([row, row, {"run": "x", "skipped": "no wall clock in run.json"}])
    assert g["runs"] == 2 and g["wall"] == row["wall"]
    assert "| attention | None | no | 2 |" in format_table([g])
    main([str(tmp_path / "r"), str(tmp_path / "nothing"), "--out", str(tmp_path / "out"), "--before", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert "skipped" in out and json.loads((tmp_path / "out" / "cost.json").read_text())["groups"][0]["mixer"] == "attention"
    assert "before (--before) and after" in out and "| +0% |" in out
    half = {**g, "wall": g["wall"] / 2, "rest": 0.0}
    assert "| attention | None | 2 / 2 |" in format_before_after([g], [half]) and "| -50% |" in format_before_after([g], [half])
