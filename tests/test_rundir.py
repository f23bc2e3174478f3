"""The run directory: one process at a time (a lock naming its holder), stale temporaries removed, a torn
last metrics line dropped on resume while a damaged middle line is an error."""

import json
import os
import subprocess
import sys
import time

import pytest

from basecap.rundir import RunDir, RunDirBusy

HOLDER = """
import sys, time
from basecap.rundir import RunDir
with RunDir(sys.argv[1]).lock():
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_process_fails_at_once_naming_the_holder(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "r")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        t0 = time.perf_counter()
        with pytest.raises(RunDirBusy, match=rf"in use by process {proc.pid}\b"):
            with RunDir(tmp_path / "r").lock():
                pass
        assert time.perf_counter() - t0 < 2
    finally:
        proc.kill()
        proc.wait()
    with RunDir(tmp_path / "r").lock():  # the kernel dropped the killed holder's lock
        assert (tmp_path / "r" / "run.lock").read_text().strip() == str(os.getpid())


def test_the_lock_is_released_and_taken_again_in_one_process(tmp_path):
    rd = RunDir(tmp_path / "r")
    with rd.lock():
        pass
    with rd.lock():
        with pytest.raises(RunDirBusy):
            with rd.lock():
                pass


def test_stale_temporary_checkpoints_are_removed_when_the_lock_is_taken(tmp_path):
    rd = RunDir(tmp_path / "r")
    (rd.checkpoints / ".tmp_step_00000004" / "state").mkdir(parents=True)
    (rd.checkpoints / "step_00000002").mkdir()
    with pytest.warns(UserWarning, match="incomplete checkpoint"), rd.lock():
        pass
    assert [p.name for p in rd.checkpoints.iterdir()] == ["step_00000002"]


def test_a_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path):
    rd = RunDir(tmp_path)
    for step in (1, 2, 3):
        rd.append_metrics({"kind": "train", "step": step, "loss": 1.0})
    with open(rd.metrics_path, "a") as f:
        f.write('{"kind": "train", "step": 4, "lo')  # a kill during the append
    with pytest.warns(UserWarning, match=r"metrics.jsonl:4: dropping a torn last record"):
        assert [r["step"] for r in rd.read_metrics()] == [1, 2, 3]
    with pytest.warns(UserWarning):
        rd.truncate_metrics(2)
    assert [json.loads(line)["step"] for line in rd.metrics_path.read_text().splitlines()] == [1, 2]


def test_a_damaged_middle_metrics_line_is_an_error_naming_it(tmp_path):
    rd = RunDir(tmp_path)
    rd.metrics_path.write_text('{"kind": "train", "step": 1}\n{"step": 2, oops\n{"kind": "train", "step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        rd.read_metrics()
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        rd.truncate_metrics(3)


def test_training_resumes_past_a_torn_metrics_line_and_syncs_before_checkpoints(tiny_corpus, tiny_recipe_path, tmp_path, monkeypatch):
    from test_train import losses, run_cfg

    from basecap import checkpoint, rundir
    from basecap.train import train

    synced = []
    real = rundir.fsync
    for mod in (rundir, checkpoint):
        monkeypatch.setattr(mod, "fsync", lambda p: (synced.append(os.path.basename(p)), real(p)))
    train(run_cfg(tiny_recipe_path, steps=8), tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None, stop_at=4)
    assert synced.count("metrics.jsonl") == 1  # one checkpoint (step 4), and the metrics first
    assert synced.index("metrics.jsonl") < synced.index("model.safetensors")
    with open(tmp_path / "r" / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "st')
    with pytest.warns(UserWarning, match="torn last record"):
        train(run_cfg(tiny_recipe_path, steps=8), tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    assert len(losses(tmp_path / "r")[0]) == 8


def test_a_second_train_on_a_held_run_directory_fails(tiny_corpus, tiny_recipe_path, tmp_path):
    from test_train import run_cfg

    from basecap.train import train

    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "r")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=f"process {proc.pid}"):
            train(run_cfg(tiny_recipe_path, steps=4), tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    finally:
        proc.kill()
        proc.wait()
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_the_commit_is_read_once_per_process(monkeypatch):
    """A process keeps the code it imported: every run it trains records the commit read at its first run, not
    a commit made while it was training (``--run`` trains several runs in one process)."""
    import subprocess

    import torch

    from basecap import rundir

    rundir.git_state.cache_clear()
    calls, real = [], subprocess.run
    monkeypatch.setattr(rundir.subprocess, "run", lambda cmd, **kw: (calls.append(cmd), real(cmd, **kw))[1])
    first = rundir.environment_info(torch.device("cpu"))
    second = rundir.environment_info(torch.device("cpu"))
    assert (first["git_commit"], first["git_dirty"]) == (second["git_commit"], second["git_dirty"])
    assert len([c for c in calls if c[0] == "git"]) <= 2  # rev-parse and status, once
    rundir.git_state.cache_clear()


def test_archived_metrics_are_compressed_and_read_like_plain_ones(tmp_path):
    import zstandard

    rd = RunDir(tmp_path / "r")
    rd.create()
    recs = [{"kind": "train", "step": i, "loss": 1.0 / (i + 1), "new_field": [i, "x"]} for i in range(1, 6)]
    for r in recs:
        rd.append_metrics(r)
    plain = rd.metrics_path.read_bytes()
    assert rd.compress_metrics() == rd.metrics_archive_path and not rd.metrics_path.exists()
    assert zstandard.ZstdDecompressor().decompress(rd.metrics_archive_path.read_bytes()) == plain  # the same bytes
    assert rd.read_metrics() == recs and rd.has_metrics()
    assert rd.metrics_archive_path in rd.records() and rd.metrics_path not in rd.records()
    # compressing is deterministic: the same records give the same archive bytes
    other = RunDir(tmp_path / "o")
    other.create()
    other.metrics_path.write_bytes(plain)
    other.compress_metrics()
    assert other.metrics_archive_path.read_bytes() == rd.metrics_archive_path.read_bytes()


def test_a_run_that_trains_again_expands_its_archived_records(tmp_path):
    rd = RunDir(tmp_path / "r")
    rd.create()
    for i in range(1, 5):
        rd.append_metrics({"kind": "train", "step": i})
    rd.compress_metrics()
    rd.truncate_metrics(2)  # resuming at step 2: plain jsonl again, which appends go to
    assert rd.metrics_path.is_file() and not rd.metrics_archive_path.exists()
    rd.append_metrics({"kind": "train", "step": 3})
    assert [r["step"] for r in rd.read_metrics()] == [1, 2, 3]


def test_copied_records_are_compressed_and_replace_the_other_form(tmp_path):
    src = RunDir(tmp_path / "src")
    src.create()
    src.info_path.write_text(json.dumps({"run_id": "a"}))
    src.append_metrics({"kind": "eval", "step": 1})
    (src.path / "checkpoints").mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "metrics.jsonl").write_text('{"stale": true}\n')  # an older archive's plain records
    written = src.copy_records(dest)
    assert sorted(p.name for p in written) == ["metrics.jsonl.zst", "run.json"]
    assert not (dest / "metrics.jsonl").exists() and RunDir(dest).read_metrics() == [{"kind": "eval", "step": 1}]
    again = RunDir(dest).copy_records(tmp_path / "dest2")  # an archive copied again stays compressed
    assert sorted(p.name for p in again) == ["metrics.jsonl.zst", "run.json"]
