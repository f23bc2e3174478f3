"""Experiment tracking (basecap.tracking): the records of metrics.jsonl read back from TensorBoard's event files
with TensorBoard's own reader, and a W&B offline run killed (SIGKILL) and resumed that keeps one run id and
holds every step once. Nothing here reaches the network: W&B runs offline, pointed at a closed local port."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from basecap.config_base import ConfigError
from basecap.tracking import (check_loggers, max_wandb_step, normalize_loggers, open_loggers, read_wandb_file, scalars,
                              wait_for_a_new_folder_name, wandb_run_files)

DOMAINS = ("prose", "code")


def need(package: str):
    """Skip when the optional package is missing, unless CI is set (there it must be installed)."""
    if importlib.util.find_spec(package) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{package} is not installed (CI must install basecap[test])")
        pytest.skip(f"{package} is not installed")


def make_records(steps: int, eval_every: int = 5) -> list[dict]:
    """What train.py writes to metrics.jsonl for ``steps`` steps: a train record per step, an eval record
    every ``eval_every`` steps (after that step's train record)."""
    rng = np.random.default_rng(0)
    out = []
    for s in range(1, steps + 1):
        out.append({"kind": "train", "step": s, "loss": float(6 - np.log(s) + 0.01 * rng.standard_normal()),
                    "lr": 3e-3 * min(1.0, s / 4), "grad_norm": float(abs(rng.standard_normal())), "tokens_per_s": float(1000 + s)})
        if s % eval_every == 0:
            res = {d: {"loss": float(6.5 - np.log(s) + i), "bpb": float(2.0 - 0.01 * s + i), "tokens": 4096} for i, d in enumerate(DOMAINS)}
            out.append({"kind": "eval", "step": s, "tokens": s * 2048, "split": "validation",
                        "in_domain_loss": res["prose"]["loss"], "domains": res})
    return out


def expected_by_step(records: list[dict]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for r in records:
        out.setdefault(r["step"], {}).update(scalars(r))
    return out


def test_scalars_of_the_records_train_py_writes():
    train, ev = make_records(5)[4:6]
    assert scalars(train) == {"train/loss": train["loss"], "train/lr": train["lr"], "train/grad_norm": train["grad_norm"],
                              "train/tokens_per_s": train["tokens_per_s"]}
    assert scalars(ev) == {"eval/in_domain_loss": ev["in_domain_loss"], "eval/prose/loss": ev["domains"]["prose"]["loss"],
                           "eval/prose/bpb": ev["domains"]["prose"]["bpb"], "eval/code/loss": ev["domains"]["code"]["loss"],
                           "eval/code/bpb": ev["domains"]["code"]["bpb"]}
    assert scalars({"kind": "note", "step": 3}) == {}


def test_logger_names_are_checked_before_any_compute(monkeypatch):
    assert normalize_loggers([]) == ("jsonl",)
    assert normalize_loggers(["tensorboard", "jsonl", "tensorboard"]) == ("jsonl", "tensorboard")
    with pytest.raises(ConfigError, match="unknown logger.*allowed: jsonl, tensorboard, wandb"):
        normalize_loggers(["mlflow"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("wandb", "tensorboard") else real(name, *a))
    assert check_loggers(["jsonl"]) == ("jsonl",)
    with pytest.raises(ConfigError, match=r"pip install 'basecap\[wandb\]'"):
        check_loggers(["jsonl", "wandb"])
    with pytest.raises(ConfigError, match=r"pip install 'basecap\[tensorboard\]'"):
        open_loggers(["tensorboard"], "unused", project="p", name="n")


def test_importing_tracking_imports_no_optional_package():
    code = "import sys, basecap.tracking; print([m for m in ('wandb', 'tensorboard', 'torch') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_only_an_enabled_rank_writes(tmp_path):
    with open_loggers(["jsonl", "tensorboard", "wandb"] if importlib.util.find_spec("wandb") else ["jsonl"], tmp_path,
                      project="p", name="n", enabled=False) as tracker:
        for r in make_records(10):
            tracker.log(r)
        tracker.flush()
    assert list(tmp_path.iterdir()) == []


# ---- TensorBoard -------------------------------------------------------------------------------------
def read_tensorboard(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series, through TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_tensorboard_holds(run_dir: Path, records: list[dict]):
    want: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for tag, v in scalars(r).items():
            want.setdefault(tag, []).append((r["step"], v))
    got = read_tensorboard(run_dir)
    assert sorted(got) == sorted(want)
    for tag, series in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in series], tag  # the same steps, each once
        np.testing.assert_array_equal(np.float32([v for _, v in got[tag]]), np.float32([v for _, v in series]), err_msg=tag)


def test_tensorboard_event_files_hold_the_records(tmp_path):
    need("tensorboard")
    records = make_records(23)
    with open_loggers(["jsonl", "tensorboard"], tmp_path, project="exp", name="run-s0", config={"train": {"lr": 3e-3}}) as tracker:
        for r in records:
            tracker.log(r)
    assert_tensorboard_holds(tmp_path, records)
    assert sorted(tags for tags in read_tensorboard(tmp_path))[:2] == ["eval/code/bpb", "eval/code/loss"]


def test_tensorboard_resume_hides_what_followed_the_checkpoint(tmp_path):
    """Killed after its checkpoint at step 6 with steps 7..10 on disk (here with other values, as if the run
    were not exact): the resumed run shows steps 1..12 once, 7..10 from the resumed run."""
    need("tensorboard")
    from basecap.tracking import TensorBoardSink

    records = make_records(12)
    stale = [dict(r, loss=r["loss"] + 1) if r["kind"] == "train" else r for r in records]
    first = TensorBoardSink(tmp_path)
    for r in stale:
        if r["step"] <= 10:
            first.log(r)
        if r["step"] == 6 and r["kind"] == "eval":
            first.flush()  # the trainer flushes after each checkpoint
    first.writer.flush()  # events after the checkpoint reached the disk, then the process died
    first.writer.close()
    with open_loggers(["tensorboard"], tmp_path, project="exp", name="run-s0", history=[r for r in records if r["step"] <= 6]) as tracker:
        for r in records:
            if r["step"] > 6:
                tracker.log(r)
    assert_tensorboard_holds(tmp_path, records)


def test_tensorboard_turned_on_at_resume_fills_from_metrics(tmp_path):
    need("tensorboard")
    records = make_records(12)
    with open_loggers(["tensorboard"], tmp_path, project="exp", name="run-s0", history=[r for r in records if r["step"] <= 6]) as tracker:
        for r in records:
            if r["step"] > 6:
                tracker.log(r)
    assert_tensorboard_holds(tmp_path, records)


# ---- Weights & Biases, offline -------------------------------------------------------------------------
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, so any network use would fail and log it

# One process of a training run: open the loggers, replay metrics.jsonl up to the checkpoint, log the steps
# after it; then finish, or die by SIGKILL (no finish, no atexit).
PROCESS = r"""
import json, os, signal, sys
from basecap.tracking import open_loggers
run_dir, records, ckpt, last, end = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
tracker = open_loggers(["jsonl", "wandb"], run_dir, project="exp", name="run-s0", group="run",
                       config={"train": {"lr": 3e-3}}, history=[r for r in records if r["step"] <= ckpt])
for r in records:
    if ckpt < r["step"] <= last:
        tracker.log(r)
print("logged", flush=True)
if end == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
tracker.close()
"""


def wandb_env(tmp_path: Path) -> dict[str, str]:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "XDG_"))}
    env.update(HOME=str(home), TMPDIR=str(tmp), OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true",
               WANDB_CONSOLE="off", WANDB_ERROR_REPORTING="false", WANDB__DISABLE_STATS="true", WANDB_BASE_URL=UNREACHABLE,
               HTTP_PROXY=UNREACHABLE, HTTPS_PROXY=UNREACHABLE, NO_PROXY="")
    return env


def run_process(env, run_dir, records_path, ckpt, last, end):
    proc = subprocess.run([sys.executable, "-c", PROCESS, str(run_dir), str(records_path), str(ckpt), str(last), end],
                          env=env, capture_output=True, text=True, timeout=120)
    assert "logged" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == (-9 if end == "kill" else 0), proc.stderr[-3000:]


def test_wandb_offline_run_killed_twice_and_resumed_keeps_one_id_and_every_step_once(tmp_path):
    """Three processes of one run. The first is killed after step 10 (checkpoint at 6): wandb had written
    nothing yet, so the second fills steps 1..6 from metrics.jsonl. The second is killed after step 600
    (checkpoint at 400) with part of its tail written: the third skips the steps the run holds."""
    need("wandb")
    env = wandb_env(tmp_path)
    run_dir, records_path = tmp_path / "run", tmp_path / "records.json"
    records = make_records(620)
    records_path.write_text(json.dumps(records))
    held = []
    for ckpt, last, end in [(0, 10, "kill"), (6, 600, "kill"), (400, 620, "finish")]:
        run_process(env, run_dir, records_path, ckpt, last, end)
        run_id = json.loads((run_dir / "wandb_run.json").read_text())["id"]
        held.append(max_wandb_step(run_dir, run_id))
    assert held[0] < 10 and held[1] < 600 and held[2] == 620  # a killed process loses what wandb had not written

    files = wandb_run_files(run_dir, run_id)
    assert len(files) == 3 and all(f.parent.name.startswith("offline-run-") for f in files)  # one run id, 3 processes
    assert {p.name.rsplit("-", 1)[1] for p in (run_dir / "wandb").glob("*run-*")} == {run_id}
    parts = [read_wandb_file(f) for f in files]
    assert all(p["run_id"] in (run_id, None) for p in parts) and parts[-1]["run_id"] == run_id  # None: nothing written
    logged = [(s, v) for p in parts for s, v in p["history"]]
    assert [s for s, _ in logged] == list(range(1, 621))  # every step once, in order
    want = expected_by_step(records)
    for s, values in logged:
        assert values == want[s], s

    assert [p for p in (tmp_path / "home").rglob("*") if p.is_file()] == []  # nothing under the user's home
    assert list((run_dir / "wandb" / "cache").rglob("*.log"))  # wandb's own logs stayed in the run directory
    for log in (run_dir / "wandb").rglob("*.log"):
        assert "127.0.0.1:9" not in log.read_text(errors="replace"), log


def test_a_resume_within_the_second_of_the_last_start_waits_for_a_new_folder_name(tmp_path):
    """wandb's folder name holds the start second; a resume in that same second would overwrite the last
    process's file, so it waits for the next second (a fake clock: no real sleep)."""
    from datetime import datetime

    start = 1_800_000_000.25
    spec = datetime.fromtimestamp(start).strftime("%Y%m%d_%H%M%S")
    folder = tmp_path / "wandb" / f"offline-run-{spec}-abcd1234"
    folder.mkdir(parents=True)
    (folder / "run-abcd1234.wandb").write_bytes(b"")
    t, slept = [start + 0.5], []

    def sleep(s):
        slept.append(s)
        t[0] += s

    wait_for_a_new_folder_name(tmp_path, "abcd1234", clock=lambda: t[0], sleep=sleep)
    assert slept and t[0] - start < 0.8 and datetime.fromtimestamp(t[0]).strftime("%Y%m%d_%H%M%S") != spec
    slept.clear()
    wait_for_a_new_folder_name(tmp_path, "abcd1234", clock=lambda: t[0], sleep=sleep)  # a later second: no wait
    wait_for_a_new_folder_name(tmp_path, "other123", clock=lambda: start, sleep=sleep)  # another run: no wait
    assert slept == []


def test_trainer_feeds_both_loggers_across_a_resume(tiny_corpus, tiny_recipe_path, tmp_path, monkeypatch):
    """train.loggers wired into the trainer: a run trained, its last checkpoint lost, resumed; TensorBoard's
    reader and the W&B files hold every step once, with metrics.jsonl's values."""
    import shutil

    from basecap.config import validate_run
    from basecap.train import train

    need("tensorboard")
    need("wandb")
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(k, v)
    cfg = validate_run({
        "name": "t", "seed": 0,
        "data": {"recipe": str(tiny_recipe_path), "train_weights": {"prose": 1.0}, "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 2, "max_seq_len": 32, "mixer": {"name": "attention", "head_dim": 8}},
        "train": {"steps": 8, "batch_size": 4, "warmup_steps": 2, "checkpoint_every": 4, "progress": False,
                  "loggers": ["tensorboard", "wandb"]},
        "eval": {"every": 4, "max_tokens": 1024, "batch_size": 4},
    })
    assert cfg.train.loggers == ["jsonl", "tensorboard", "wandb"]
    rd = tmp_path / "exp" / "t-s0"
    train(cfg, rd, corpus=tiny_corpus, log=lambda *_: None)
    shutil.rmtree(rd / "checkpoints" / "step_00000008")
    os.remove(rd / "done.json")
    train(cfg, rd, corpus=tiny_corpus, log=lambda *_: None)  # resumes at step 4
    want: dict[int, dict] = {}
    for line in (rd / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        want.setdefault(rec["step"], {}).update(scalars(rec))

    def same(step, values):  # tokens/s and MFU are measured again after the resume; every other value is exact
        keep = lambda d: {k: np.float32(x) for k, x in d.items() if k not in ("train/tokens_per_s", "train/mfu") or step <= 4}  # noqa: E731
        return keep(values) == keep({k: want[step][k] for k in values})

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(rd / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert "eval/code/bpb" in acc.Tags()["scalars"] and "train/grad_norm" in acc.Tags()["scalars"]
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [s for s in sorted(want) if tag in want[s]], tag
        assert all(same(e.step, {tag: e.value}) for e in events), tag
    state = json.loads((rd / "wandb_run.json").read_text())
    files = wandb_run_files(rd, state["id"])
    assert len(files) == 2  # one offline folder per process, one run id
    logged = [(s, v) for f in files for s, v in read_wandb_file(f)["history"]]
    assert [s for s, _ in logged] == list(range(1, 9))
    assert all(same(s, v) for s, v in logged)
