"""Fault injection into training runs: kill -9 at seeded random points of a step or a checkpoint, a full disk during a
checkpoint, torn and damaged metrics lines, a second process on a held run directory, planted pickles in a
checkpoint. Each faulted run is compared with the uninterrupted one: per-step losses, evaluations and final weights
exactly. Machinery: ``tests/faults_common.py`` (figures, forked processes), ``tests/faults_training.py``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import random
import re
import resource
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path

import pytest
from faults_common import FIGURES, SEED, figures, fork, in_child, lock_is_free, quiet, reap  # noqa: F401 - figures: the module's autouse fixture
from faults_training import (
    EVERY,
    STEPS,
    assert_resumed_exactly,
    bytes_past,
    committed_step,
    evidence,
    kill_plan,
    lost_bytes,
    outcome,
    snapshot,
    train_child,
)
from test_train import run_cfg

import basecap.train as train_mod
from basecap.checkpoint import CheckpointError, _sha256, list_checkpoints, load_weights, restore, verify_checkpoint
from basecap.model import build_model
from basecap.rundir import RunDirBusy
from basecap.optim import make_optimizer
from basecap.train import train

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forked children, flock and RLIMIT_FSIZE as on Linux")


# ---- the uninterrupted reference run ------------------------------------------------------------
@pytest.fixture(scope="module")
def ref(tiny_corpus, tiny_recipe_path, tmp_path_factory):
    """The uninterrupted run every faulted run is compared with (the peak FLOP/s is given: no probe per process)."""
    cfg = run_cfg(tiny_recipe_path, steps=STEPS, checkpoint_every=EVERY, peak_flops=1e12)
    run_dir = tmp_path_factory.mktemp("faults") / "reference"
    train(cfg, run_dir, corpus=tiny_corpus, log=quiet)
    return cfg, run_dir


def test_kill_9_at_random_points_of_a_training_run_then_resume_exactly(ref, tiny_corpus):
    cfg, ref_dir = ref
    plan = kill_plan(random.Random(SEED))
    run_dir = ref_dir.parent / "killed"
    redone = rolled_back = 0
    for at, phase in plan:
        start = committed_step(run_dir)
        assert train_child(cfg, run_dir, tiny_corpus, phase, at) == -signal.SIGKILL, f"{phase} at step {at}: not killed"
        evidence(run_dir, phase, at)
        assert lock_is_free(run_dir / "run.lock"), "the kernel did not release the killed run's lock"
        done = committed_step(run_dir)
        redone += at - (phase in ("before_step", "in_forward")) - done  # finished since the last checkpoint: run again
        rolled_back += bytes_past(run_dir, done)
        assert done >= start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stale temporaries removed, a torn line dropped: asserted elsewhere
        train(cfg, run_dir, corpus=tiny_corpus, log=quiet)  # this process takes the lock the killed ones held
    assert_resumed_exactly(ref_dir, run_dir)
    FIGURES.add("training: kill -9 at seeded random points", faults=len(plan), resumes=1, exact=1,
                bytes_lost=lost_bytes(ref_dir, run_dir), bytes_recomputed=rolled_back,
                note=f"{len(plan)} kills chained in one run of {STEPS} steps ("
                     + ", ".join(f"{p}@{s}" for s, p in plan) + f"); {redone} steps redone")


def test_kill_after_the_final_checkpoint_resumes_exactly(ref, tiny_corpus):
    cfg, ref_dir = ref
    run_dir = ref_dir.parent / "killed_at_the_end"
    assert train_child(cfg, run_dir, tiny_corpus, "ckpt_renamed", STEPS) == -signal.SIGKILL
    evidence(run_dir, "ckpt_renamed", STEPS)
    train(cfg, run_dir, corpus=tiny_corpus, log=quiet)
    lost = lost_bytes(ref_dir, run_dir)
    same = outcome(run_dir) == outcome(ref_dir)
    FIGURES.add("training: kill -9 after the final checkpoint", faults=1, resumes=1, exact=int(same), bytes_lost=lost,
                note="" if same else "the final evaluation is recorded twice (known, train._finish)")
    assert_resumed_exactly(ref_dir, run_dir)


def test_a_full_disk_during_a_checkpoint_fails_clearly_keeps_the_previous_one_and_resumes_exactly(ref, tiny_corpus):
    """RLIMIT_FSIZE (with SIGXFSZ ignored) makes every write past 16 KiB fail with EFBIG from the second checkpoint
    on, as a full disk would fail it with ENOSPC."""
    cfg, ref_dir = ref
    run_dir, at, limit = ref_dir.parent / "full_disk", 2 * EVERY, 16 << 10
    error = ref_dir.parent / "full_disk_error.txt"

    def child():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        real = train_mod.save_checkpoint

        def save(root, step, *a, **k):
            if step == at:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            return real(root, step, *a, **k)

        train_mod.save_checkpoint = save
        try:
            train(cfg, run_dir, corpus=tiny_corpus, log=quiet)
        except CheckpointError as e:
            error.write_text(str(e))
            sys.exit(3)

    assert in_child(child) == 3
    msg = error.read_text()
    assert f"checkpoint at step {at} failed" in msg and f"[Errno {errno.EFBIG}] File too large" in msg, msg
    ckpts = run_dir / "checkpoints"
    assert [p.name for p in list_checkpoints(ckpts)] == [f"step_{EVERY:08d}"] and not list(ckpts.glob(".tmp_step_*"))
    previous = list_checkpoints(ckpts)[0]
    verify_checkpoint(previous)
    model = build_model(cfg.model, tiny_corpus.vocab_size)
    load_weights(previous, model)
    assert restore(previous, model, make_optimizer(model, cfg.train))["step"] == EVERY
    recomputed = bytes_past(run_dir, EVERY)
    train(cfg, run_dir, corpus=tiny_corpus, log=quiet)  # the limit lifted (another process)
    assert_resumed_exactly(ref_dir, run_dir)
    FIGURES.add("checkpoint: full disk (RLIMIT_FSIZE)", faults=1, resumes=1, exact=1, bytes_lost=lost_bytes(ref_dir, run_dir),
                bytes_recomputed=recomputed, note=f"error: {msg.splitlines()[0]}")


def test_a_torn_last_metrics_line_is_dropped_and_a_damaged_middle_line_is_named(ref, tiny_corpus):
    cfg, ref_dir = ref
    run_dir, damaged = ref_dir.parent / "torn", ref_dir.parent / "damaged"
    assert train_child(cfg, run_dir, tiny_corpus, "after_optimizer", 10) == -signal.SIGKILL
    shutil.copytree(run_dir, damaged)
    metrics = run_dir / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write('{"kind": "train", "step": 10, "loss": 2.7')  # a partial record, as a full disk leaves it
    torn_line = len(metrics.read_text().splitlines())
    recomputed = bytes_past(run_dir, committed_step(run_dir))
    with pytest.warns(UserWarning, match=rf"metrics\.jsonl:{torn_line}: dropping a torn last record"):
        train(cfg, run_dir, corpus=tiny_corpus, log=quiet)
    assert_resumed_exactly(ref_dir, run_dir)

    lines = (damaged / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"
    (damaged / "metrics.jsonl").write_text("".join(lines))
    before = snapshot(damaged)
    with pytest.raises(ValueError, match=rf"{re.escape(str(damaged / 'metrics.jsonl'))}:3: not valid JSON"):
        train(cfg, damaged, corpus=tiny_corpus, log=quiet)
    assert snapshot(damaged) == before  # nothing trained, nothing rewritten
    FIGURES.add("metrics.jsonl: torn last line, damaged middle line", faults=3, resumes=1, exact=1,
                bytes_lost=lost_bytes(ref_dir, run_dir), bytes_recomputed=recomputed,
                note="a kill, then a torn last record (dropped with a warning) or a cut middle line (ValueError naming line 3)")


def test_a_second_process_on_a_held_run_directory_fails_at_once_naming_the_holder(ref, tiny_corpus):
    cfg, ref_dir = ref
    run_dir, held = ref_dir.parent / "held", ref_dir.parent / "held.pid"

    def holder():
        real = train_mod._step

        def step(run, s):
            if s + 1 == 6:
                held.with_suffix(".tmp").write_text(str(os.getpid()))
                os.rename(held.with_suffix(".tmp"), held)  # whole when it appears
                time.sleep(120)
            return real(run, s)

        train_mod._step = step
        train(cfg, run_dir, corpus=tiny_corpus, log=quiet)

    pid = fork(holder)
    try:
        deadline = time.monotonic() + 120
        while not held.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert held.read_text() == str(pid)
        before = snapshot(run_dir)
        t0 = time.perf_counter()
        with pytest.raises(RunDirBusy, match=rf"in use by process {pid}\b"):
            train(cfg, run_dir, corpus=tiny_corpus, log=quiet)
        waited = time.perf_counter() - t0
        assert waited < 5, f"the second process waited {waited:.1f} s"
        assert snapshot(run_dir) == before
    finally:
        os.kill(pid, signal.SIGKILL)
        status = reap(pid)
    assert status == -signal.SIGKILL
    train(cfg, run_dir, corpus=tiny_corpus, log=quiet)
    assert_resumed_exactly(ref_dir, run_dir)
    FIGURES.add("run directory: a second process, then kill -9 of the holder", faults=2, resumes=1, exact=1,
                bytes_lost=lost_bytes(ref_dir, run_dir), bytes_recomputed=0,
                note=f"RunDirBusy naming the holder's PID after {waited:.2f} s; nothing written")


class Payload:
    """Unpickling this creates ``marker``: the proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def rehash(ckpt: Path):
    """What a forger does: rewrite meta.json so the SHA-256 check passes."""
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"] = {name: _sha256(ckpt / name) for name in meta["files"]}
    (ckpt / "meta.json").write_text(json.dumps(meta))


def unfinished_copy(ref_dir: Path, name: str) -> tuple[Path, Path]:
    """A copy of the reference run without done.json (so training resumes it) and its newest checkpoint."""
    run_dir = ref_dir.parent / name
    shutil.copytree(ref_dir, run_dir)
    (run_dir / "done.json").unlink()
    return run_dir, list_checkpoints(run_dir / "checkpoints")[-1]


def test_planted_pickles_in_a_checkpoint_are_refused_and_run_nothing(ref, tiny_corpus):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    cfg, ref_dir = ref
    run_dir, ckpt = unfinished_copy(ref_dir, "planted_metadata")
    marker = ref_dir.parent / "metadata_code_ran"
    (ckpt / "state" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    rehash(ckpt)
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError, match=r"refusing to load io\.open"):
        train(cfg, run_dir, corpus=tiny_corpus, log=quiet)
    assert not marker.exists() and snapshot(run_dir) == before
    pickle.loads((ckpt / "state" / ".metadata").read_bytes())  # control: the payload is live
    assert marker.exists()

    run_dir, ckpt = unfinished_copy(ref_dir, "planted_entry")
    marker = ref_dir.parent / "entry_code_ran"
    model = build_model(cfg.model, tiny_corpus.vocab_size)
    opt = make_optimizer(model, cfg.train)
    restore(ckpt, model, opt)
    msd, osd = get_state_dict(model, opt)
    osd["param_groups"][0]["lr"] = Payload(marker)  # a non-tensor entry: pickled bytes in the .distcp file
    shutil.rmtree(ckpt / "state")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(ckpt / "state"))
    rehash(ckpt)
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError, match=r"refused \(.*io\.open"):
        train(cfg, run_dir, corpus=tiny_corpus, log=quiet)
    assert not marker.exists() and snapshot(run_dir) == before
    msd, osd = get_state_dict(model, opt)
    with warnings.catch_warnings(), contextlib.suppress(Exception):
        warnings.simplefilter("ignore")
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(ckpt / "state"))  # control: the default loader runs it
    assert marker.exists()
    FIGURES.add("checkpoint: planted pickles", faults=2, note="metadata and a non-tensor entry, hashes rewritten: refused "
                "with CheckpointError, no code ran, nothing written (each payload runs under the plain loader)")

