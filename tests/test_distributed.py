"""torchrun with the gloo backend and 2 CPU processes: DDP and FSDP2 match the single-process loss
sequence, and a run whose rank is killed resumes from its last checkpoint with nothing lost."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from basecap.checkpoint import list_checkpoints
from basecap.cli import main


def exp_file(tmp_path, recipe, steps, ckpt_every):
    p = tmp_path / "exp.toml"
    p.write_text(f"""
name = "dist"
out_dir = "{tmp_path / 'runs'}"
[data]
recipe = "{recipe}"
train_weights = {{prose = 1.0}}
seq_len = 32
[model]
d_model = 32
n_layers = 2
max_seq_len = 32
mixer = {{name = "attention", head_dim = 8}}
[train]
steps = {steps}
batch_size = 8
grad_accum = 2
warmup_steps = 2
checkpoint_every = {ckpt_every}
progress = false
threads = 1
[eval]
every = {ckpt_every}
max_tokens = 512
batch_size = 4
""")
    return p


def torchrun(exp, *sets):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "basecap", "train", str(exp)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def train_losses(run_dir: Path):
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if r["kind"] == "train"]


@pytest.fixture(scope="module")
def single(tiny_recipe_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single")
    exp = exp_file(tmp, tiny_recipe_path, 12, 4)
    assert main(["train", str(exp)]) == 0
    return train_losses(tmp / "runs" / "dist-s0")


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_match_single_process(mode, single, tiny_recipe_path, tmp_path):
    exp = exp_file(tmp_path, tiny_recipe_path, 12, 4)
    r = subprocess.run(torchrun(exp, f"train.parallel={mode}"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = train_losses(tmp_path / "runs" / "dist-s0")
    assert len(got) == len(single)
    assert got == pytest.approx(single, rel=1e-4)
    info = json.loads((tmp_path / "runs" / "dist-s0" / "run.json").read_text())
    assert info["world_size"] == 2 and info["parallel"] == mode


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(p.name))
    return out


def test_killed_rank_resumes_from_last_checkpoint_even_at_another_world_size(tiny_recipe_path, tmp_path):
    """Kill one rank of a 2-rank FSDP run after its first checkpoint; torchrun stops the job. Resume
    (here in a single process: the DCP checkpoint is re-sharded) and finish: the whole loss sequence
    equals an uninterrupted single-process run's, so nothing was lost."""
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    assert main(["train", str(exp_file(ref_dir, tiny_recipe_path, 60, 4))]) == 0
    ref = train_losses(ref_dir / "runs" / "dist-s0")

    exp = exp_file(tmp_path, tiny_recipe_path, 60, 4)
    run_dir = tmp_path / "runs" / "dist-s0"
    proc = subprocess.Popen(torchrun(exp, "train.parallel=fsdp"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and not list_checkpoints(run_dir / "checkpoints"):
        time.sleep(0.02)
    workers = _children(proc.pid)
    assert workers, "no worker processes found"
    os.kill(workers[-1], signal.SIGKILL)
    assert proc.wait(timeout=120) != 0, "the job finished before a rank was killed"
    assert not (run_dir / "done.json").exists()
    saved = int(list_checkpoints(run_dir / "checkpoints")[-1].name.split("_")[1])
    assert 4 <= saved < 60
    assert main(["train", str(exp)]) == 0  # resume with world size 1
    got = train_losses(run_dir)
    assert len(got) == 60
    assert got == pytest.approx(ref, rel=1e-4)


def test_a_checkpoint_failure_on_rank_0_stops_every_rank_with_its_message(tiny_recipe_path, tmp_path):
    """Rank 0 cannot write the checkpoint (``checkpoints`` is a file); rank 1 does not wait for the
    collective timeout: both exit at once with rank 0's message."""
    exp = exp_file(tmp_path, tiny_recipe_path, 4, 2)
    run_dir = tmp_path / "runs" / "dist-s0"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoints").write_text("not a folder")
    t0 = time.perf_counter()
    r = subprocess.run(torchrun(exp, "train.dist_timeout_s=120"), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert time.perf_counter() - t0 < 100, "a rank waited for the collective timeout"
    msgs = [line for line in r.stderr.splitlines() if line.startswith("error: checkpoint at step 2 failed on rank 0")]
    assert len(msgs) == 2 and msgs[0] == msgs[1] and "FileExistsError" in msgs[0], r.stderr[-3000:]


def test_dist_timeout_bounds_the_wait_for_missing_ranks(tmp_path):
    """``train.dist_timeout_s`` reaches init_process_group: a rank whose peer never comes gives up after it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    code = "from basecap.distributed import init_distributed; init_distributed('cpu', 2)"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Timed out" in r.stderr, r.stderr[-2000:]
    assert time.perf_counter() - t0 < 30


def test_leave_destroys_the_process_group(tmp_path):
    """``basecap train`` closes a torchrun job's process group before exit (a live Gloo group at interpreter
    shutdown can abort a rank that finished); outside torchrun leaving is a no-op. The barrier before the
    destroy needs two ranks: the two-rank tests above exercise it."""
    import torch.distributed as dist

    from basecap.distributed import leave

    leave()  # no group: nothing to do
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    leave()
    assert not dist.is_initialized()
