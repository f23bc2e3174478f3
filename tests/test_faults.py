"""Fault injection: what a crash, a full disk or a bad input does to a run or a corpus build, with figures.

Every fault is real: a forked copy of the test process (modules, corpus and model code already loaded, so no
interpreter start) SIGKILLs itself from inside the code it interrupts, at seeded random steps; a file-size limit
makes a checkpoint write fail; bytes are torn, flipped, cut or planted on disk. Outcomes are compared with an
uninterrupted run: the per-step losses, evaluations and final weights exactly, a corpus file by file (SHA-256).

The module ends by printing its figures (faults injected, resumed runs and builds equal to the uninterrupted
ones, bytes lost); run it with ``-s`` to see them. ``BASECAP_FAULTS_JSON`` names a file to write them to as
JSON, ``BASECAP_FAULTS_SEED`` picks other kill points (default 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import gzip
import hashlib
import io
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
import traceback
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_data_helpers import (
    code_doc,
    make_tiny_data,
    prose_doc,
    tiny_recipe,
    write_jsonl_zst,
)
from test_data_caps import tar_gz
from test_train import run_cfg

import basecap.checkpoint as ckpt_mod
import basecap.train as train_mod
from basecap.checkpoint import (
    CheckpointError,
    _sha256,
    latest_good_checkpoint,
    list_checkpoints,
    load_weights,
    restore,
    verify_checkpoint,
)
from basecap.data import MalformedRecordWarning, build_corpus, recipe_from_dict
from basecap.data import build as build_mod
from basecap.data import collect as collect_mod
from basecap.data import sources as sources_mod
from basecap.data import tokenize as tokenize_mod
from basecap.model import build_model
from basecap.rundir import RunDir, RunDirBusy
from basecap.train import make_optimizer, train

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forked children, flock and RLIMIT_FSIZE as on Linux")
SEED = int(os.environ.get("BASECAP_FAULTS_SEED", "0"))
STEPS, EVERY = 24, 4  # checkpoints and evaluations every EVERY steps


def quiet(*_):
    pass


# ---- the figures ---------------------------------------------------------------------------------
class Figures:
    """Per case: faults injected, resumes compared with the uninterrupted run, resumes equal to it, bytes lost."""

    def __init__(self):
        self.cases: dict[str, Counter] = {}
        self.notes: dict[str, str] = {}

    def add(self, case: str, note: str = "", **counts: int):
        self.cases.setdefault(case, Counter()).update(counts)
        if note:
            self.notes[case] = note

    def totals(self) -> Counter:
        out = Counter()
        for c in self.cases.values():
            out.update(c)
        return out

    def as_json(self) -> dict:
        t = self.totals()
        return {"seed": SEED, "faults_injected": t["faults"], "resumes": t["resumes"], "resumed_exactly": t["exact"],
                "bytes_lost": t["bytes_lost"], "bytes_recomputed": t["bytes_recomputed"],
                "cases": {k: {**dict(v), "note": self.notes.get(k, "")} for k, v in self.cases.items()}}

    def summary(self) -> str:
        j = self.as_json()
        lines = [(f"fault injection (seed {SEED}): {j['faults_injected']} faults injected; {j['resumed_exactly']} of "
                  f"{j['resumes']} resumed runs and builds equal to the uninterrupted ones; {j['bytes_lost']} bytes lost "
                  f"({j['bytes_recomputed']} bytes past the last commit point recomputed on resume)")]
        for name, c in j["cases"].items():
            resumed = f", {c['exact']}/{c['resumes']} resumed exactly" if c.get("resumes") else ""
            lost = f", {c['bytes_lost']} bytes lost" if c.get("resumes") else ""
            lines.append(f"  {name}: {c.get('faults', 0)} faults{resumed}{lost}" + (f"; {c['note']}" if c["note"] else ""))
        return "\n".join(lines)


FIGURES = Figures()


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    if not FIGURES.cases:
        return
    print("\n" + FIGURES.summary())
    if os.environ.get("BASECAP_FAULTS_JSON"):
        Path(os.environ["BASECAP_FAULTS_JSON"]).write_text(json.dumps(FIGURES.as_json(), indent=1))


# ---- processes -----------------------------------------------------------------------------------
def die():
    """kill -9 of this process, from inside the code it interrupts."""
    os.kill(os.getpid(), signal.SIGKILL)


def fork(fn) -> int:
    """Run ``fn`` in a forked copy of this process; returns its PID. The child never returns into pytest: it exits
    0 when ``fn`` returns, with SystemExit's code, or 70 after printing any other exception."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        warnings.simplefilter("ignore")
        fn()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 70
    except BaseException:  # noqa: BLE001 - anything, printed, then the child's own exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def reap(pid: int, timeout: float = 120.0) -> int:
    """Wait for a child: its exit code, or minus the signal that ended it."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"child process did not finish within {timeout} s")
        time.sleep(0.01)


def in_child(fn, timeout: float = 120.0) -> int:
    return reap(fork(fn), timeout)


def lock_is_free(path: Path) -> bool:
    """Whether another process could take the flock on ``path`` now (taken and released at once)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing releases a lock taken above
    return True


# ---- training: the uninterrupted reference and comparisons ---------------------------------------
@pytest.fixture(scope="module")
def ref(tiny_corpus, tiny_recipe_path, tmp_path_factory):
    """The uninterrupted run every faulted run is compared with (the peak FLOP/s is given: no probe per process)."""
    cfg = run_cfg(tiny_recipe_path, steps=STEPS, checkpoint_every=EVERY, peak_flops=1e12)
    run_dir = tmp_path_factory.mktemp("faults") / "reference"
    train(cfg, run_dir, corpus=tiny_corpus, log=quiet)
    return cfg, run_dir


def outcome(run_dir: Path) -> tuple[list, list, dict]:
    """What must not depend on faults: every step's (step, loss, lr, grad norm), every evaluation, the final record."""
    recs = RunDir(run_dir).read_metrics()
    steps = [(r["step"], r["loss"], r["lr"], r["grad_norm"]) for r in recs if r["kind"] == "train"]
    evals = [(r["step"], r["in_domain_loss"], r["domains"]) for r in recs if r["kind"] == "eval"]
    return steps, evals, RunDir(run_dir).read_done()


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(list_checkpoints(run_dir / "checkpoints")[-1] / "model.safetensors")


def lost_bytes(ref_dir: Path, run_dir: Path) -> int:
    """Bytes of the reference's results (deterministic metrics fields as JSON lines, final weights) that the run
    does not hold identically."""
    def lines(d):
        steps, evals, done = outcome(d)
        return Counter(json.dumps(x) for x in [*steps, *evals, done])

    want, have = lines(ref_dir), lines(run_dir)
    lost = sum(len(line) * n for line, n in (want - have).items())
    a, b = final_weights(ref_dir), final_weights(run_dir)
    return lost + sum(t.numel() * t.element_size() for k, t in a.items() if k not in b or not torch.equal(t, b[k]))


def assert_resumed_exactly(ref_dir: Path, run_dir: Path):
    got, want = outcome(run_dir), outcome(ref_dir)
    assert got[0] == want[0], "per-step losses differ from the uninterrupted run"
    assert got[1] == want[1], "evaluations differ from the uninterrupted run"
    assert got[2] == want[2]
    a, b = final_weights(ref_dir), final_weights(run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "final weights differ"
    assert not list((run_dir / "checkpoints").glob(".tmp_step_*")), "a temporary checkpoint folder survived"
    assert lock_is_free(run_dir / "run.lock")


def committed_step(run_dir: Path) -> int:
    good = latest_good_checkpoint(run_dir / "checkpoints", log=quiet)
    return json.loads((good / "trainer.json").read_text())["step"] if good else 0


def bytes_past(run_dir: Path, step: int) -> int:
    """metrics.jsonl bytes after the records of ``step`` (a torn tail included): what a resume from there rewrites."""
    text = (run_dir / "metrics.jsonl").read_bytes() if (run_dir / "metrics.jsonl").exists() else b""
    keep = 0
    for line in text.splitlines(keepends=True):
        try:
            if json.loads(line)["step"] > step:
                break
        except ValueError:
            break
        keep += len(line)
    return len(text) - keep


# ---- training: where a kill lands ------------------------------------------------------------------
# In the order they happen within a step; ckpt_* only at checkpoint steps, in_eval only at evaluation steps.
STEP_PHASES = ("before_step", "in_forward", "after_optimizer", "torn_metrics", "in_eval")
CKPT_PHASES = ("ckpt_state_partial", "ckpt_before_weights", "ckpt_weights_partial", "ckpt_fsync", "ckpt_renamed")
PHASES = STEP_PHASES + CKPT_PHASES


def arm(phase: str, at: int):
    """In a child: SIGKILL this process at ``phase`` of step ``at`` (1-based). Patches module globals, which is
    harmless in a process about to die."""
    now = {"step": 0}

    def here() -> bool:
        return now["step"] == at

    real_step, real_loss, real_idl = train_mod._step, train_mod._loss, train_mod.in_domain_loss

    def step(run, s):
        now["step"] = s + 1
        if phase == "before_step" and here():
            die()
        out = real_step(run, s)
        if phase == "after_optimizer" and here():
            die()
        return out

    def loss(model, x, y):
        out = real_loss(model, x, y)
        if phase == "in_forward" and here():
            die()  # the forward pass done, its backward not
        return out

    def in_domain_loss(*a, **k):
        if phase == "in_eval" and here():
            die()  # every domain evaluated, the record not written
        return real_idl(*a, **k)

    train_mod._step, train_mod._loss, train_mod.in_domain_loss = step, loss, in_domain_loss

    if phase == "torn_metrics":
        real_append = RunDir.append_metrics

        def append(self, rec):
            if rec.get("kind") == "train" and rec["step"] == at:
                line = json.dumps(rec) + "\n"
                with open(self.metrics_path, "a") as f:
                    f.write(line[: len(line) // 2])
                die()
            real_append(self, rec)

        RunDir.append_metrics = append

    dcp = ckpt_mod.dcp
    real_dcp_save, real_save_file, real_fsync, real_replace = dcp.save, ckpt_mod.save_file, ckpt_mod.fsync, os.replace

    def dcp_save(*a, **k):
        out = real_dcp_save(*a, **k)
        if phase == "ckpt_state_partial" and here():
            biggest = max(Path(k["checkpoint_id"]).glob("*.distcp"), key=lambda p: p.stat().st_size)
            os.truncate(biggest, biggest.stat().st_size // 2)
            die()
        return out

    def save_file(tensors, path, *a, **k):
        if phase == "ckpt_before_weights" and here():
            die()
        real_save_file(tensors, path, *a, **k)
        if phase == "ckpt_weights_partial" and here():
            os.truncate(path, os.path.getsize(path) // 2)
            die()

    fsyncs = []

    def fsync(path):
        real_fsync(path)
        if phase == "ckpt_fsync" and here():
            fsyncs.append(path)
            if len(fsyncs) == 2:
                die()  # every file written, not all of them synced, nothing renamed

    def replace(src, dst):
        real_replace(src, dst)
        if phase == "ckpt_renamed" and Path(dst).name == f"step_{at:08d}":
            die()  # the checkpoint is in place; older ones not pruned, done.json not written

    dcp.save, ckpt_mod.save_file, ckpt_mod.fsync, os.replace = dcp_save, save_file, fsync, replace


def kill_plan(rng: random.Random) -> list[tuple[int, str]]:
    """Every phase once, at a seeded random step where it can happen, in the order a chain of runs meets them. A
    kill after a checkpoint is in place (ckpt_renamed, the last phase of a step) resumes past that step, so nothing
    may follow it in the same step: none does. The final step is left out for ckpt_renamed (see the test of a kill after the final checkpoint)."""
    plan = []
    for p in PHASES:
        if p in CKPT_PHASES or p == "in_eval":
            plan.append((rng.choice(range(EVERY, STEPS + (p != "ckpt_renamed"), EVERY)), p))
        else:
            plan.append((rng.randint(1, STEPS), p))
    return sorted(plan, key=lambda sp: (sp[0], PHASES.index(sp[1])))


def evidence(run_dir: Path, phase: str, at: int):
    """What the kill left behind: proof it landed where it was aimed."""
    ckpts = run_dir / "checkpoints"
    tmp = ckpts / f".tmp_step_{at:08d}"
    if phase in ("ckpt_state_partial", "ckpt_before_weights", "ckpt_fsync"):
        assert tmp.is_dir() and any(tmp.rglob("*.distcp")), phase
    if phase == "ckpt_weights_partial":
        assert (tmp / "model.safetensors").is_file() and not (tmp / "meta.json").exists()
    if phase == "ckpt_renamed":
        assert (ckpts / f"step_{at:08d}" / "meta.json").is_file() and not tmp.exists()
    if phase == "torn_metrics":
        assert not (run_dir / "metrics.jsonl").read_bytes().endswith(b"\n")
    assert not (run_dir / "done.json").exists()


def train_child(cfg, run_dir: Path, corpus, phase: str | None = None, at: int = 0) -> int:
    def child():
        if phase:
            arm(phase, at)
        train(cfg, run_dir, corpus=corpus, log=quiet)

    return in_child(child)


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


def snapshot(run_dir: Path) -> dict[str, str]:
    """SHA-256 of every file of a run directory but its lock file (which holds the last holder's PID)."""
    return {str(p.relative_to(run_dir)): _sha256(p) for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != "run.lock"}


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


# ---- corpus builds -------------------------------------------------------------------------------
# In pipeline order: inside source reading (at a document), after the collection is committed, inside tokenizer
# training, inside a unit's write (half the file), after a unit is committed, between two domains' shards, and
# with every shard written but no manifest yet.
BUILD_PHASES = ("reading", "collected", "in_bpe", "mid_commit", "committed", "shards", "before_manifest")


@pytest.fixture(scope="module")
def build_ref(tmp_path_factory):
    """Generated sources (a folder of files and a jsonl.zst) cut into small units, and their uninterrupted build,
    counting the documents read and listing the units in the order they commit."""
    root = tmp_path_factory.mktemp("faults_build")
    data = make_tiny_data(root / "data")
    recipe = recipe_from_dict(tiny_recipe(data) | {"build": {"unit_bytes": 8000, "workers": 1}})
    read, units = [], []
    real_read = collect_mod.read_source
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(collect_mod, "read_source", lambda prep: (read.append(1) or doc for doc in real_read(prep)))
        mp.setattr(tokenize_mod, "_committed", lambda unit: units.append(unit.file))
        corpus = build_corpus(recipe, home=root / "reference", log=quiet)
    return root, recipe, corpus, len(read), units


def arm_build(phase: str, where):
    """In a child: SIGKILL this process at ``phase`` of a build (``where``: a document count or a unit file)."""
    if phase == "reading":
        real_read, seen = collect_mod.read_source, [0]

        def read_source(prep):
            for doc in real_read(prep):
                seen[0] += 1
                if seen[0] == where:
                    die()
                yield doc

        collect_mod.read_source = read_source
    elif phase == "collected":
        real_save = build_mod.save_collected
        build_mod.save_collected = lambda *a, **k: (real_save(*a, **k), die())
    elif phase == "in_bpe":
        real_train = build_mod.train_bpe
        build_mod.train_bpe = lambda *a, **k: (real_train(*a, **k), die())
    elif phase == "mid_commit":
        real_commit = tokenize_mod._commit

        def commit(path, tokens, lengths):
            if Path(path).name == where:
                buf = io.BytesIO()
                np.savez(buf, tokens=tokens, lengths=lengths)
                with tokenize_mod.atomic_open(path) as f:
                    f.write(buf.getvalue()[: buf.tell() // 2])
                    f.flush()
                    die()
            real_commit(path, tokens, lengths)

        tokenize_mod._commit = commit
    elif phase == "committed":
        tokenize_mod._committed = lambda unit: die() if unit.file == where else None
    elif phase == "shards":
        real_shards, calls = build_mod._write_shards, [0]

        def write_shards(*a, **k):
            calls[0] += 1
            if calls[0] == 2:
                die()  # the first domain's shards are written
            return real_shards(*a, **k)

        build_mod._write_shards = write_shards
    elif phase == "before_manifest":
        real_write = build_mod.write_json
        build_mod.write_json = lambda path, *a, **k: die() if Path(path).name == "manifest.json" else real_write(path, *a, **k)


def build_plan(rng: random.Random, n_docs: int, units: list[str]) -> list[tuple[str, object]]:
    """Every phase once, in pipeline order, at seeded random documents and units (a unit cut mid-write comes
    no later than the unit committed after it)."""
    cut, after = sorted(rng.sample(range(len(units)), 2))
    where = {"reading": rng.randrange(1, n_docs), "mid_commit": units[cut], "committed": units[after]}
    return [(p, where.get(p)) for p in BUILD_PHASES]


def file_digests(folder: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(folder)): (_sha256(p), p.stat().st_size) for p in sorted(folder.rglob("*")) if p.is_file()}


def at_unit(where) -> str:
    """``@6`` for a document count, ``@prose-00006`` for a unit file, nothing for None."""
    return "" if where is None else f"@{where}" if isinstance(where, int) else "@" + "-".join(where.split("-")[:2])


def build_evidence(corpora: Path, name: str, phase: str, where):
    work = corpora / f".tmp-{name}" / "work"
    assert not (corpora / name).exists(), "an interrupted build left a folder that looks complete"
    assert lock_is_free(corpora / f".lock-{name}")
    if phase == "reading":
        assert (work / "spool").is_dir() and not (work / "collected.npz").exists()
    elif phase == "collected":
        assert (work / "collected.npz").is_file() and not (work / "tokenizer.json").exists()
    elif phase == "in_bpe":
        assert not (work / "tokenizer.json").exists()
    elif phase == "mid_commit":
        assert list((work / "units").glob(f".{where}.tmp-*")) and not (work / "units" / where).exists()
    elif phase == "committed":
        assert (work / "units" / where).is_file()
    elif phase == "shards":
        assert work.is_dir() and list((corpora / f".tmp-{name}" / "tokens").glob("*.bin"))
    elif phase == "before_manifest":
        assert not work.exists() and not (corpora / f".tmp-{name}" / "manifest.json").exists()


def test_kill_9_at_random_points_of_a_corpus_build_then_resume_byte_for_byte(build_ref):
    root, recipe, ref_corpus, n_docs, units = build_ref
    home, name = root / "killed", ref_corpus.dir.name
    plan = build_plan(random.Random(SEED), n_docs, units)
    for phase, where in plan:
        def child(phase=phase, where=where):
            arm_build(phase, where)
            build_corpus(recipe, home=home, log=quiet)

        assert in_child(child) == -signal.SIGKILL, f"{phase} ({where}): not killed"
        build_evidence(home / "corpora", name, phase, where)
    corpus = build_corpus(recipe, home=home, log=quiet)
    assert corpus.dir.name == name
    want, got = file_digests(ref_corpus.dir), file_digests(corpus.dir)
    assert got == want, "the resumed corpus differs from the uninterrupted build"
    assert not list((home / "corpora").glob(".tmp-*"))
    lost = sum(size for f, (digest, size) in want.items() if got.get(f, ("", 0))[0] != digest)
    FIGURES.add("corpus build: kill -9 at seeded random points", faults=len(plan), resumes=1, exact=1, bytes_lost=lost,
                note=f"{len(plan)} kills chained in one build ({', '.join(p + at_unit(w) for p, w in plan)}); "
                     f"{len(want)} files, SHA-256 equal")


def gone(pid: int) -> bool:
    """Whether a process (not our child) has exited: no longer listed, or a zombie waiting for its new parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_kill_9_of_a_parallel_build_leaves_no_worker_behind_and_resumes_byte_for_byte(build_ref):
    """Two tokenising processes: the build is killed once the first unit is in; its workers exit on their own."""
    root, recipe, ref_corpus, _, _ = build_ref
    home, pids = root / "killed_parallel", root / "workers.pid"
    real_pool = tokenize_mod._pool

    @contextlib.contextmanager
    def pool(*a, **k):
        with real_pool(*a, **k) as p:
            pids.write_text(" ".join(str(w.pid) for w in p._pool))
            yield p

    def child():
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the orphaned workers' broken-pipe tracebacks
        tokenize_mod._pool, tokenize_mod._committed = pool, lambda unit: die()
        build_corpus(recipe, home=home, log=quiet, workers=2)

    assert in_child(child) == -signal.SIGKILL
    workers = [int(w) for w in pids.read_text().split()]
    deadline = time.monotonic() + 30
    while not all(gone(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [w for w in workers if not gone(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, f"tokenising workers {left} outlived the killed build"
    assert len(list((home / "corpora" / f".tmp-{ref_corpus.dir.name}" / "work" / "units").glob("*.npz"))) >= 1
    corpus = build_corpus(recipe, home=home, log=quiet, workers=2)
    want, got = file_digests(ref_corpus.dir), file_digests(corpus.dir)
    assert got == want
    FIGURES.add("corpus build: kill -9 with 2 tokenising workers", faults=1, resumes=1, exact=1,
                bytes_lost=sum(size for f, (digest, size) in want.items() if got.get(f, ("", 0))[0] != digest),
                note=f"both workers exited by themselves within {30 - (deadline - time.monotonic()):.1f} s; the resume "
                     "with 2 workers equals the 1-worker build")


def test_oversized_members_and_lines_are_skipped_counted_and_the_build_goes_on(tmp_path, monkeypatch):
    """Caps lowered to 16 KiB: an archive member, a nested .gz, a file, a .gz file and a jsonl line past them."""
    cap, big = 16 << 10, 40 << 10
    monkeypatch.setattr(sources_mod, "LIMITS", dataclasses.replace(sources_mod.LIMITS, member_bytes=cap, line_bytes=cap))
    data = make_tiny_data(tmp_path / "data")
    rng = random.Random(SEED)
    (data / "prose" / "huge.txt").write_text(prose_doc(rng, big // 5), encoding="utf-8")
    (data / "prose" / "bomb.txt.gz").write_bytes(gzip.compress(b"z" * big))
    write_jsonl_zst(data / "pajama" / "shard1.jsonl.zst", [
        {"text": prose_doc(rng, 100), "meta": {"redpajama_set_name": "RedPajamaC4"}},
        {"text": prose_doc(rng, big // 5), "meta": {"redpajama_set_name": "RedPajamaC4"}},
        {"text": prose_doc(rng, 100), "meta": {"redpajama_set_name": "RedPajamaC4"}}])
    archive = tar_gz({"a.py": code_doc(rng).encode(), "big.py": code_doc(rng, 2000).encode(),
                      "bomb.py.gz": gzip.compress(b"q" * big), "b.py.gz": gzip.compress(code_doc(rng).encode())})
    home = tmp_path / "home"
    cached = home / "downloads" / "pip" / "pkg-1.0" / "pkg-1.0.tar.gz"  # as fetched before: no network
    cached.parent.mkdir(parents=True)
    cached.write_bytes(archive)
    raw = tiny_recipe(data)
    raw["sources"][0]["include"] = ["*.txt", "*.txt.gz"]
    raw["sources"].append({"kind": "pip_sdist", "name": "sdist", "domain": "code", "package": "pkg", "version": "1.0",
                           "sha256": hashlib.sha256(archive).hexdigest(), "include": ["*.py", "*.py.gz"]})
    with pytest.warns(MalformedRecordWarning) as warned:
        corpus = build_corpus(recipe_from_dict(raw), home=home, log=quiet, workers=1)
    skipped = sorted(str(w.message).split(": skipped")[0].rsplit("/", 1)[-1] for w in warned if ": skipped" in str(w.message))
    assert skipped == ["bomb.txt.gz", "huge.txt", "pkg-1.0.tar.gz:big.py", "pkg-1.0.tar.gz:bomb.py.gz",
                       "shard1.jsonl.zst:2"], skipped
    src = {s["id"]: s for s in corpus.manifest["sources"]}
    assert {k: src[k]["oversized"] for k in src} == {"prose-files": 2, "pajama": 1, "sdist": 2}
    assert src["prose-files"]["documents_read"] == 40 and src["sdist"]["documents_read"] == 2
    assert src["pajama"]["documents_read"] == 40 + 2  # shard0's mapped records and shard1's two short ones
    FIGURES.add("data: oversized archive members, files and jsonl lines", faults=5,
                note=f"caps {cap:,} bytes; each skipped with a warning naming the file (and member), counted as "
                     "oversized in the manifest; the build finished")


def test_a_tampered_shard_fails_verify_naming_it_and_a_truncated_one_is_refused_on_open(build_ref, tmp_path, capsys):
    from basecap.cli import main
    from basecap.config_base import ConfigError
    from basecap.data import load_corpus

    _, _, corpus, _, _ = build_ref
    shard = corpus.manifest["domains"]["prose"]["splits"]["train"]["file"]
    tampered = tmp_path / "tampered" / corpus.dir.name
    shutil.copytree(corpus.dir, tampered)
    flipped = bytearray((tampered / shard).read_bytes())
    flipped[len(flipped) // 3] ^= 0x10
    (tampered / shard).write_bytes(bytes(flipped))
    load_corpus(tampered)  # the size still matches: opening checks sizes, verify checks hashes
    capsys.readouterr()
    assert main(["data", "verify", str(tampered)]) == 2
    err = capsys.readouterr().err
    assert f"{Path(shard).name}: SHA-256" in err, err

    truncated = tmp_path / "truncated" / corpus.dir.name
    shutil.copytree(corpus.dir, truncated)
    size = (truncated / shard).stat().st_size
    os.truncate(truncated / shard, size - 2)
    with pytest.raises(ConfigError, match=rf"{re.escape(str(truncated / shard))}: token shard of prose/train is {size - 2} bytes, "
                                          rf"the manifest records {size} bytes.*basecap data verify"):
        load_corpus(truncated)
    FIGURES.add("data: tampered and truncated token shards", faults=2,
                note="verify exits 2 naming the shard; opening the truncated corpus fails naming it")
