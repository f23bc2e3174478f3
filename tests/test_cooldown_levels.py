"""Annealed points placed by level (``train.cooldown_levels``): where they go, that the main run stays untouched,
and that a run killed during a level branch resumes exactly."""

import os
import signal
import subprocess
import sys
import time

import pytest

from basecap.checkpoint import list_checkpoints
from basecap.config_base import ConfigError
from basecap.config import TrainConfig
from basecap.cooldown import level_forks, total_branch_steps
from basecap.train import train
from test_cooldown import quiet, records
from test_train import CHILD, run_cfg


def ev(step, loss):
    return {"kind": "eval", "step": step, "in_domain_loss": loss}


def an(step, loss):
    return {"kind": "anneal", "step": step, "in_domain_loss": loss}


def test_level_forks_known_answer():
    tc = TrainConfig(steps=100, cooldowns=[10], cooldown_levels=[4.5, 4.0, 3.9])
    recs = [ev(10, 5.2), an(10, 5.0), ev(20, 4.8), ev(30, 4.65), ev(40, 4.05), ev(50, 3.9), ev(100, 3.5)]
    # drop measured at 10: 0.2. Predictions: 20 -> 4.6, 30 -> 4.45 (serves 4.5), 40 -> 3.85 (serves 4.0 and 3.9)
    assert level_forks(tc, recs) == {30: [4.5], 40: [4.0, 3.9]}
    # the branch at 30 measures its own drop (0.45), which the next prediction uses: 40 -> 3.6
    assert level_forks(tc, [*recs[:4], an(30, 4.2), *recs[4:]]) == {30: [4.5], 40: [4.0, 3.9]}
    # the latest drop counts: with 10's (0.2) the prediction at 30 would be 4.1 and serve nothing; with 20's (0.6), 3.7
    assert level_forks(tc, [ev(10, 5.2), an(10, 5.0), ev(20, 4.6), an(20, 4.0), ev(30, 4.3)]) == {20: [4.5], 30: [4.0, 3.9]}
    # no drop measured yet (no branch before), or the last evaluation (the run's own end): no level fork
    assert level_forks(tc, [ev(10, 3.0), ev(20, 3.0)]) == {}
    assert level_forks(tc, [ev(10, 5.2), an(10, 5.0), ev(100, 3.0)]) == {}
    assert level_forks(TrainConfig(steps=100, cooldowns=[10]), recs) == {}


def test_level_config_is_validated(tiny_recipe_path):
    with pytest.raises(ConfigError, match="at least one step in cooldowns"):
        run_cfg(tiny_recipe_path, steps=40, cooldown_levels=[4.0])
    with pytest.raises(ConfigError, match="unique positive"):
        run_cfg(tiny_recipe_path, steps=40, cooldowns=[8], cooldown_levels=[4.0, 4.0])
    with pytest.raises(ConfigError, match="evaluation grid"):
        run_cfg(tiny_recipe_path, steps=40, cooldowns=[6], cooldown_levels=[4.0])  # eval.every = 4
    tc = run_cfg(tiny_recipe_path, steps=40, cooldowns=[8], cooldown_fraction=0.25, cooldown_levels=[4.0, 3.5]).train
    assert total_branch_steps(tc) == 2 + 2 * 10  # a level fork counted at its longest (round(0.25 x 39))


LEVEL_BASE = dict(steps=24, schedule="wsd", checkpoint_every=8, cooldowns=[4], cooldown_fraction=0.5)


def fixed_run_and_level(tiny_recipe_path, tiny_corpus, run_dir):
    """A run with one fixed fork (at 4) trained in ``run_dir``, its records, and a level its rule places at step 16."""
    train(run_cfg(tiny_recipe_path, **LEVEL_BASE), run_dir, corpus=tiny_corpus, log=quiet)
    fixed = records(run_dir)
    evals = {r["step"]: r["in_domain_loss"] for r in fixed if r["kind"] == "eval"}
    drop = evals[4] - next(r["in_domain_loss"] for r in fixed if r["kind"] == "anneal")
    assert evals[16] < evals[12] < evals[8]
    return fixed, (evals[12] + evals[16]) / 2 - drop  # reached at 16, not at 12 (the loss falls over these steps)


def test_a_level_fork_lands_where_the_records_say_and_the_main_run_is_unchanged(tiny_corpus, tiny_recipe_path, tmp_path):
    base = LEVEL_BASE
    fixed, level = fixed_run_and_level(tiny_recipe_path, tiny_corpus, tmp_path / "fixed")
    cfg = run_cfg(tiny_recipe_path, **base, cooldown_levels=[level])
    train(cfg, tmp_path / "levels", corpus=tiny_corpus, log=quiet)
    got = records(tmp_path / "levels")
    points = [r for r in got if r["kind"] == "anneal"]
    assert [(p["step"], p["end_step"], p.get("levels")) for p in points] == [(4, 6, None), (16, 24, [level])]
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "mfu")} for r in rs if r["kind"] != "anneal"]  # noqa: E731
    assert strip(got) == strip(fixed)  # the main run, bit for bit
    assert points[0]["domains"] == next(r for r in fixed if r["kind"] == "anneal")["domains"]

    # killed during the level branch: the resumed run decides the same fork from its records and finishes it exactly
    cfg = run_cfg(tiny_recipe_path, **{**base, "checkpoint_every": 2}, cooldown_levels=[level])
    train(cfg, tmp_path / "straight", corpus=tiny_corpus, log=quiet)
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, cfg.model_dump_json(), str(run_dir), str(tiny_corpus.dir)])
    deadline = time.time() + 120
    while time.time() < deadline and not list_checkpoints(run_dir / "cooldown" / "step_00000016"):
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list_checkpoints(run_dir / "cooldown" / "step_00000016"), "the level branch never checkpointed"
    msgs = []
    train(cfg, run_dir, corpus=tiny_corpus, log=msgs.append)
    assert any("cooldown branch at step 16: resuming" in m for m in msgs)
    strip_t = lambda rs: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "mfu")} for r in rs]  # noqa: E731
    assert strip_t(records(run_dir)) == strip_t(records(tmp_path / "straight"))
