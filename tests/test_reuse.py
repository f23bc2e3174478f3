"""--reuse DIR: a finished run of another study with the same config but for its name stands in for a run
(copied, relabelled, not trained again); any other difference trains anew."""

import json
import shutil

import pytest

from basecap.config_base import ConfigError
from tests.test_sweep import write_exp


def metrics(run_dir):
    return (run_dir / "metrics.jsonl").read_text()


def test_an_identical_finished_run_is_reused_relabelled_and_another_is_trained(tiny_recipe_path, tmp_path):
    from basecap.experiment import run_experiment

    first = tmp_path / "first"
    first.mkdir()
    run_experiment(write_exp(first, tiny_recipe_path), log=lambda *_: None)  # tpp and abs, seed 0
    second = tmp_path / "second"
    second.mkdir()
    runs = """
[[runs]]
name = "rope"
model.mixer = {name = "attention", head_dim = 8}
[[runs]]
name = "alibi"
model.mixer = {name = "attention", head_dim = 8, position = "alibi"}
"""
    path = write_exp(second, tiny_recipe_path, runs=runs).read_text().replace('reference = "tpp"', 'reference = "rope"')
    (second / "exp.toml").write_text(path)
    lines = []
    rep = run_experiment(second / "exp.toml", log=lines.append, reuse=[first / "runs"])
    src, dst = first / "runs" / "tpp-s0", second / "runs" / "rope-s0"
    assert any("[rope-s0] reused" in m for m in lines) and not any("[alibi-s0] reused" in m for m in lines)
    assert metrics(dst) == metrics(src)  # the same training, not a new one
    info = json.loads((dst / "run.json").read_text())
    assert info["run_id"] == "rope-s0" and info["config"]["name"] == "rope"
    assert info["reused_from"] == {"run_dir": str(src), "run_id": "tpp-s0"}
    assert json.loads((dst / "eval.json").read_text())["run_id"] == "rope-s0"
    assert (second / "runs" / "alibi-s0" / "done.json").is_file() and "reused_from" not in json.loads(
        (second / "runs" / "alibi-s0" / "run.json").read_text())
    summary = json.loads((rep.parent / "summary.json").read_text())
    assert {r["name"] for r in summary["runs"]} == {"rope", "alibi"}
    assert [k for k, v in summary["commits"].items() if "reused_from" in v] == ["rope-s0"]
    assert all(v["wall_s"] > 0 for v in summary["commits"].values())  # each run's recorded wall clock (a copy keeps its own)
    report = (rep.parent / "report.md").read_text()  # the report itself says which runs are copies
    assert "**Reused runs** (1 of 2;" in report and f"`rope-s0` (copy of `{src}`)" in report
    # a run that already exists is never replaced; a different setting (steps) is not reused
    assert not any("reused" in m for m in [*_run(second, tiny_recipe_path, runs, first, "")])
    out = _run(tmp_path / "third", tiny_recipe_path, runs, first, "steps = 6", "steps = 9")
    assert not any("reused" in m for m in out)


def _run(folder, recipe, runs, first, old, new=None):
    from basecap.experiment import run_experiment

    folder.mkdir(exist_ok=True)
    text = write_exp(folder, recipe, runs=runs).read_text().replace('reference = "tpp"', 'reference = "rope"')
    if new is not None:
        text = text.replace(old, new)
    (folder / "exp.toml").write_text(text)
    lines = []
    run_experiment(folder / "exp.toml", log=lines.append, reuse=[first / "runs"])
    return lines


def test_a_missing_reuse_folder_is_a_clear_error(tiny_recipe_path, tmp_path):
    from basecap.experiment import run_experiment

    with pytest.raises(ConfigError, match="--reuse .*nope: no such folder"):
        run_experiment(write_exp(tmp_path, tiny_recipe_path), log=lambda *_: None, reuse=[tmp_path / "nope"])


def test_a_run_recorded_before_an_option_existed_is_still_the_same_run():
    """A config field added after a run trained takes its default, which is what the run did: the stored config
    (without the field) and today's (with it at its default) are the same run; a non-default value is another."""
    from basecap.config import validate_run
    from basecap.reuse import _key

    cfg = json.loads(validate_run({"name": "a", "seed": 0, "model": {"d_model": 32, "n_layers": 2}}).model_dump_json())
    old = json.loads(json.dumps(cfg))
    del old["seed_offset"]
    for k in ("schedule", "decay_fraction", "decay_shape", "cooldowns", "cooldown_fraction", "keep_cooldown_weights"):
        del old["train"][k]
    del old["eval"]["seen_min_count"]
    assert _key(old) == _key(cfg)
    assert _key(dict(cfg, seed_offset=5)) != _key(cfg)
    assert _key(dict(cfg, name="b")) == _key(cfg)


def test_a_published_study_keeps_its_tuning_runs_records_and_can_stand_in_for_its_run_folder(tiny_recipe_path, tmp_path):
    """``basecap report --archive --tuning T`` keeps the tuning runs' records (run.json, done.json, compressed
    metrics; no checkpoints) in ``OUT/tuning_runs/`` beside ``OUT/tuning.json``. With the study folder gone, the
    report is written again from the results folder alone, fixed-value table included, and ``--reuse`` of the
    archive copies every run in instead of training it: the choice and the comparison are the same."""
    from basecap.experiment import run_experiment
    from basecap.report.core import report
    from basecap.rundir import RunDir
    from basecap.sweep import TUNING_FILE
    from tests.test_sweep import TUNE

    path = write_exp(tmp_path, tiny_recipe_path, extra=TUNE.replace("[1e-3, 2e-3, 4e-3]", "[1e-6, 1e-2]"))
    runs, out = tmp_path / "runs", tmp_path / "published"
    run_experiment(path, log=lambda *_: None)
    first = report(sorted(runs.glob("*-s0")), out, reference="tpp", tuning_json=runs / TUNING_FILE, archive=True).read_text()
    assert "### Does a fixed value change the verdict?" in first
    kept = sorted(p.name for p in (out / "tuning_runs").iterdir())
    assert kept == ["abs@lr=0.01-s100", "abs@lr=1e-06-s100", "tpp@lr=0.01-s100", "tpp@lr=1e-06-s100"]
    assert sorted(p.name for p in (out / "tuning_runs" / kept[0]).iterdir()) == ["done.json", "metrics.jsonl.zst", "run.json"]

    # a tuning run still training (no done.json) gives no gap and is not archived
    unfinished = runs / "tpp@lr=1e-06-s100" / "done.json"
    done = unfinished.read_text()
    unfinished.unlink()
    report(sorted(runs.glob("*-s0")), tmp_path / "partial", reference="tpp", tuning_json=runs / TUNING_FILE, archive=True)
    assert sorted(p.name for p in (tmp_path / "partial" / "tuning_runs").iterdir()) == [k for k in kept if k != "tpp@lr=1e-06-s100"]
    unfinished.write_text(done)

    def records(folder):
        return {d.name: [line for line, _ in RunDir(d)._metric_lines()] for d in sorted(folder.glob("*-s*"))}

    before = records(runs)
    shutil.rmtree(runs)
    again = report(sorted((out / "runs").glob("*-s0")), tmp_path / "again", reference="tpp", tuning_json=out / TUNING_FILE)
    assert again.read_text() == first
    lines = []
    run_experiment(path, log=lines.append, reuse=[out / "tuning_runs", out / "runs"])
    assert not any("] step " in m for m in lines)  # nothing trained again
    # the study's own records are restored, not copies of another study's runs: no report calls them reused
    assert sum("restored from" in m for m in lines) == 6 and not any("] reused" in m for m in lines)
    assert records(runs) == before
    for d in sorted(runs.glob("*-s*")):
        info = json.loads((d / "run.json").read_text())
        assert "reused_from" not in info and info["restored_from"].startswith(str(out)), d.name
    assert "Reused runs" not in report(sorted(runs.glob("*-s0")), tmp_path / "restored", reference="tpp").read_text()
    assert json.loads((runs / TUNING_FILE).read_text())["runs"]["tpp"]["chosen"] == {"train.lr": 0.01}


def test_a_display_key_alone_does_not_make_another_run():
    """A run trained with the progress bar and one trained without it (`--set train.progress=false`) are the same
    training: the key ignores it, and nothing else that changes what is computed."""
    from basecap.config import validate_run
    from basecap.reuse import _key

    cfg = json.loads(validate_run({"name": "a", "seed": 0, "model": {"d_model": 32, "n_layers": 2}}).model_dump_json())
    quiet = json.loads(json.dumps(cfg))
    quiet["train"]["progress"] = not cfg["train"]["progress"]
    assert _key(quiet) == _key(cfg)
    other = json.loads(json.dumps(cfg))
    other["train"]["lr"] = cfg["train"]["lr"] * 2
    assert _key(other) != _key(cfg)
