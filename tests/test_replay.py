"""basecap anneal: an annealed point added to a finished run equals the point the run would have recorded had it
forked there while training, and nothing is added when the replay differs from the run's records."""

import json

import pytest

from basecap.config_base import ConfigError
from basecap.replay import add_forks, add_level_forks
from basecap.train import train
from test_cooldown import quiet, records
from test_cooldown_levels import LEVEL_BASE, fixed_run_and_level
from test_train import run_cfg

STRIP = ("tokens_per_s", "mfu")


def strip(rs):
    return [{k: v for k, v in r.items() if k not in STRIP} for r in rs]


def test_a_point_added_afterwards_equals_one_forked_while_training(tiny_corpus, tiny_recipe_path, tmp_path):
    base = dict(steps=16, schedule="wsd", checkpoint_every=8, cooldown_fraction=0.5)
    train(run_cfg(tiny_recipe_path, **base, cooldowns=[2, 4, 8]), tmp_path / "forked", corpus=tiny_corpus, log=quiet)
    train(run_cfg(tiny_recipe_path, **base, cooldowns=[8]), tmp_path / "later", corpus=tiny_corpus, log=quiet)
    msgs = []
    points = add_forks(tmp_path / "later", [4, 2], corpus=tiny_corpus, log=msgs.append)
    assert strip(records(tmp_path / "later")) == strip(records(tmp_path / "forked"))  # the same records, in the same order
    assert [(p["step"], p["end_step"]) for p in points] == [(2, 3), (4, 6)] and any("replay equals the run's 5 records" in m for m in msgs)
    info = json.loads((tmp_path / "later" / "run.json").read_text())
    assert info["config"]["train"]["cooldowns"] == [2, 4, 8]
    assert info["replayed_forks"][0]["steps"] == [2, 4] and info["replayed_forks"][0]["checked_records"] == 4 + 1  # 4 steps, 1 evaluation
    assert not (tmp_path / "later" / "cooldown").exists() or not any((tmp_path / "later" / "cooldown").iterdir())
    with pytest.raises(ConfigError, match="already has an annealed point"):
        add_forks(tmp_path / "later", [4], corpus=tiny_corpus, log=quiet)
    with pytest.raises(ConfigError, match="inside"):
        add_forks(tmp_path / "later", [16], corpus=tiny_corpus, log=quiet)


def test_a_replay_that_differs_adds_nothing(tiny_corpus, tiny_recipe_path, tmp_path):
    run = tmp_path / "r"
    train(run_cfg(tiny_recipe_path, steps=8, schedule="wsd"), run, corpus=tiny_corpus, log=quiet)
    recs = records(run)
    recs[2]["loss"] += 1e-6  # step 3: what another machine's kernels could give
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    before = (run / "metrics.jsonl").read_text(), (run / "run.json").read_text()
    with pytest.raises(RuntimeError, match="differs from the run's records at its train record of step 3"):
        add_forks(run, [4], corpus=tiny_corpus, log=quiet)
    assert ((run / "metrics.jsonl").read_text(), (run / "run.json").read_text()) == before
    (run / "done.json").unlink()
    with pytest.raises(ConfigError, match="not a finished run"):
        add_forks(run, [4], corpus=tiny_corpus, log=quiet)


def test_level_forks_added_afterwards_equal_the_ones_placed_while_training(tiny_corpus, tiny_recipe_path, tmp_path):
    import shutil

    _, level = fixed_run_and_level(tiny_recipe_path, tiny_corpus, tmp_path / "fixed")  # placed at step 16
    train(run_cfg(tiny_recipe_path, **LEVEL_BASE, cooldown_levels=[level]), tmp_path / "native", corpus=tiny_corpus, log=quiet)
    shutil.copytree(tmp_path / "fixed", tmp_path / "later")
    msgs: list[str] = []
    points = add_level_forks(tmp_path / "later", [level], corpus=tiny_corpus, log=msgs.append)
    assert [(p["step"], p["end_step"]) for p in points] == [(16, 24)]
    assert strip(records(tmp_path / "later")) == strip(records(tmp_path / "native"))  # the level marked on the point too
    info = json.loads((tmp_path / "later" / "run.json").read_text())
    assert info["config"]["train"]["cooldowns"] == [4] and info["config"]["train"]["cooldown_levels"] == [level]
    assert info["replayed_forks"][-1]["levels"] == [level] and info["replayed_forks"][-1]["steps"] == [16]
    # asked again: the level is served, nothing is replayed or added
    assert add_level_forks(tmp_path / "later", [level], corpus=tiny_corpus, log=msgs.append) == []
    assert strip(records(tmp_path / "later")) == strip(records(tmp_path / "native"))

    # a level served at a step the run forked at anyway marks that point and trains nothing
    shutil.copytree(tmp_path / "fixed", tmp_path / "at16")
    add_forks(tmp_path / "at16", [16], corpus=tiny_corpus, log=quiet)
    msgs.clear()
    assert add_level_forks(tmp_path / "at16", [level], corpus=tiny_corpus, log=msgs.append) == []
    assert [r.get("levels") for r in records(tmp_path / "at16") if r["kind"] == "anneal"] == [None, [level]]
    assert any("(forked already)" in m for m in msgs) and not any("replaying" in m for m in msgs)
