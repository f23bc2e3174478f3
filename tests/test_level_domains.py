"""Levels on another coordinate (``train.cooldown_level_domains``): a mixed-domain run matched on prose places its
level forks on its prose loss, while training and afterwards (``basecap anneal --level L --level-on prose``) alike."""

import json
import shutil

import pytest

from basecap.config import validate_run
from basecap.config_base import ConfigError
from basecap.config import TrainConfig
from basecap.cooldown import level_forks
from basecap.replay import add_level_forks
from basecap.rundir import matched_loss
from basecap.train import train
from test_cooldown import quiet, records
from test_cooldown_levels import LEVEL_BASE
from test_replay import strip
from test_train import run_cfg


def rec(kind, step, in_domain, prose, docs):
    doms = {"prose": {"loss": prose, "tokens": 100}, "docs": {"loss": docs, "tokens": 300}}
    return {"kind": kind, "step": step, "in_domain_loss": in_domain, "domains": doms}


def test_matched_loss_is_the_token_weighted_loss_of_its_domains():
    r = rec("eval", 10, 4.0, 5.0, 3.0)
    assert matched_loss(r, None) == matched_loss(r, []) == 4.0
    assert matched_loss(r, ["prose"]) == 5.0
    assert matched_loss(r, ["prose", "docs"]) == pytest.approx((5.0 * 100 + 3.0 * 300) / 400)
    assert matched_loss(r, ["code"]) is None


def test_level_forks_on_prose_known_answer():
    on_prose = TrainConfig(steps=100, cooldowns=[10], cooldown_levels=[4.5], cooldown_level_domains=["prose"])
    on_mixture = TrainConfig(steps=100, cooldowns=[10], cooldown_levels=[4.5])
    # prose drop at 10: 0.3; prose predictions 20 -> 4.9, 30 -> 4.5 (serves 4.5). The mixture (in-domain) loss is
    # lower throughout: its drop at 10 is 0.2 and its prediction at 20 is 4.4, so on it the level is served at 20.
    recs = [rec("eval", 10, 4.9, 5.5, 4.7), rec("anneal", 10, 4.7, 5.2, 4.6), rec("eval", 20, 4.6, 5.2, 4.4), rec("eval", 30, 4.4, 4.8, 4.2)]
    recs.append(rec("eval", 100, 3.9, 4.1, 3.8))
    assert level_forks(on_prose, recs) == {30: [4.5]}
    assert level_forks(on_mixture, recs) == {20: [4.5]}
    with pytest.raises(ValueError, match="the eval record of step 10 has no loss on them"):
        level_forks(TrainConfig(steps=100, cooldowns=[10], cooldown_levels=[4.5], cooldown_level_domains=["code"]), recs[:2])


def mixed(cfg, **train_over):
    """The same run trained on prose and code in equal weights (in-domain loss = their mean)."""
    d = json.loads(cfg.model_dump_json())
    d["data"]["train_weights"] = {"prose": 1.0, "code": 1.0}
    d["train"].update(train_over)
    return validate_run(d)


def test_level_domains_are_validated_before_any_compute(tiny_corpus, tiny_recipe_path, tmp_path):
    with pytest.raises(ConfigError, match="without cooldown_levels places nothing"):
        run_cfg(tiny_recipe_path, steps=40, cooldowns=[8], cooldown_level_domains=["prose"])
    with pytest.raises(ConfigError, match="a domain named twice"):
        run_cfg(tiny_recipe_path, steps=40, cooldowns=[8], cooldown_levels=[4.0], cooldown_level_domains=["prose", "prose"])
    d = json.loads(run_cfg(tiny_recipe_path, steps=40, cooldowns=[8], cooldown_levels=[4.0], cooldown_level_domains=["code"]).model_dump_json())
    d["data"]["eval_domains"] = ["prose"]
    with pytest.raises(ConfigError, match="not among data.eval_domains"):
        validate_run(d)
    cfg = run_cfg(tiny_recipe_path, steps=40, cooldowns=[8], cooldown_levels=[4.0], cooldown_level_domains=["docs"])
    with pytest.raises(ConfigError, match=r"train.cooldown_level_domains: unknown domain\(s\) \['docs'\]"):
        train(cfg, tmp_path / "r", corpus=tiny_corpus, log=quiet)
    assert not (tmp_path / "r" / "run.json").exists() and not (tmp_path / "r" / "metrics.jsonl").exists()  # nothing trained


def test_prose_levels_added_afterwards_equal_the_ones_placed_while_training(tiny_corpus, tiny_recipe_path, tmp_path):
    base = mixed(run_cfg(tiny_recipe_path, **LEVEL_BASE))
    train(base, tmp_path / "fixed", corpus=tiny_corpus, log=quiet)
    fixed = records(tmp_path / "fixed")
    prose = {r["step"]: matched_loss(r, ["prose"]) for r in fixed if r["kind"] == "eval"}
    drop = prose[4] - matched_loss(next(r for r in fixed if r["kind"] == "anneal"), ["prose"])
    assert prose[16] < prose[12] < prose[8]
    level = (prose[12] + prose[16]) / 2 - drop  # on prose: reached at 16, not at 12
    assert level_forks(mixed(base, cooldown_levels=[level], cooldown_level_domains=["prose"]).train, fixed) == {16: [level]}

    train(mixed(base, cooldown_levels=[level], cooldown_level_domains=["prose"]), tmp_path / "native", corpus=tiny_corpus, log=quiet)
    native = records(tmp_path / "native")
    assert [(r["step"], r.get("levels")) for r in native if r["kind"] == "anneal"] == [(4, None), (16, [level])]
    shutil.copytree(tmp_path / "fixed", tmp_path / "later")
    points = add_level_forks(tmp_path / "later", [level], corpus=tiny_corpus, log=quiet, domains=["prose"])
    assert [(p["step"], p["end_step"]) for p in points] == [(16, 24)]
    assert strip(records(tmp_path / "later")) == strip(native)
    info = json.loads((tmp_path / "later" / "run.json").read_text())
    assert info["config"]["train"]["cooldown_level_domains"] == ["prose"] and info["replayed_forks"][-1]["level_domains"] == ["prose"]
    assert validate_run(info["config"]) == validate_run(json.loads((tmp_path / "native" / "run.json").read_text())["config"])

    # one coordinate per run: in-domain levels cannot join prose ones; a domain the run never evaluated is named
    with pytest.raises(ConfigError, match="one coordinate per run"):
        add_level_forks(tmp_path / "later", [3.0], corpus=tiny_corpus, log=quiet)
    shutil.copytree(tmp_path / "fixed", tmp_path / "other")
    with pytest.raises(ConfigError, match=r"--level-on \['docs'\]: the run's evaluations have no such domain"):
        add_level_forks(tmp_path / "other", [3.0], corpus=tiny_corpus, log=quiet, domains=["docs"])
