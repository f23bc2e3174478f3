"""Fault injection into training runs, shared machinery: comparisons with the uninterrupted reference run, and
kills armed at chosen phases of a step (tests: ``tests/test_faults_train.py``; what the faults are: ``tests/faults_common.py``).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path

import torch
from faults_common import die, in_child, lock_is_free, quiet
from safetensors.torch import load_file

import basecap.checkpoint as ckpt_mod
import basecap.train as train_mod
from basecap.checkpoint import _sha256, latest_good_checkpoint, list_checkpoints
from basecap.rundir import RunDir
from basecap.train import train

STEPS, EVERY = 24, 4  # checkpoints and evaluations every EVERY steps


# ---- comparisons with the uninterrupted reference run -------------------------------------------
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


def snapshot(run_dir: Path) -> dict[str, str]:
    """SHA-256 of every file of a run directory but its lock file (which holds the last holder's PID)."""
    return {str(p.relative_to(run_dir)): _sha256(p) for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != "run.lock"}

