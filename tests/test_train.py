import json
import os
import signal
import subprocess
import sys
import time

import pytest

from basecap.checkpoint import CheckpointError, latest_good_checkpoint, list_checkpoints, load_weights
from basecap.config import validate_run
from basecap.model import build_model
from basecap.train import TrainingDiverged, train


def run_cfg(recipe, steps=8, **train_over):
    return validate_run({
        "name": "t", "seed": 0,
        "data": {"recipe": str(recipe), "train_weights": {"prose": 1.0}, "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 2, "max_seq_len": 32, "mixer": {"name": "attention", "head_dim": 8}},
        "train": {"steps": steps, "batch_size": 4, "warmup_steps": 2, "checkpoint_every": 4, "progress": False, "lr": 3e-3, **train_over},
        "eval": {"every": 4, "max_tokens": 1024, "batch_size": 4},
    })


def losses(run_dir):
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if r["kind"] == "train"], [r for r in recs if r["kind"] == "eval"]


def test_train_writes_metrics_checkpoints_and_provenance(tiny_corpus, tiny_recipe_path, tmp_path):
    final = train(run_cfg(tiny_recipe_path), tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    tr, ev = losses(tmp_path / "r")
    assert len(tr) == 8 and tr[-1] < tr[0]
    assert [e["step"] for e in ev] == [4, 8]
    assert set(final["domains"]) == {"prose", "code"} and final["domains"]["code"]["bpb"] > 0
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert {"git_commit", "packages", "device", "params", "flops_per_token", "config"} <= set(info)
    assert [p.name for p in list_checkpoints(tmp_path / "r" / "checkpoints")] == ["step_00000004", "step_00000008"]
    (one,) = info["wall"]["sessions"]  # one process trained it: setup to the last step, in seconds
    assert (one["from_step"], one["to_step"]) == (0, 8) and info["wall"]["seconds"] == one["seconds"] > 0


def test_finished_run_is_skipped(tiny_corpus, tiny_recipe_path, tmp_path):
    cfg = run_cfg(tiny_recipe_path, steps=4)
    final = train(cfg, tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    # done.json does not repeat the final record (metrics.jsonl holds it): its fields but the per-domain results
    done = json.loads((tmp_path / "r" / "done.json").read_text())
    assert done == {"steps": 4, "final": {k: v for k, v in final.items() if k != "domains"}} and losses(tmp_path / "r")[1][-1] == final
    msgs = []
    again = train(cfg, tmp_path / "r", corpus=tiny_corpus, log=msgs.append)
    assert "already finished" in msgs[0] and (tmp_path / "r" / "metrics.jsonl").read_text() == before
    assert again == final  # the whole record, per-domain results included
    (tmp_path / "r" / "done.json").write_text(json.dumps({"steps": 4, "final": final}, indent=1))  # the form before 2026-12-05
    assert train(cfg, tmp_path / "r", corpus=tiny_corpus, log=msgs.append) == final


def test_a_run_goes_on_only_with_the_config_it_started_with(tiny_corpus, tiny_recipe_path, tmp_path):
    from basecap.config_base import ConfigError

    quiet = lambda *_: None  # noqa: E731
    train(run_cfg(tiny_recipe_path, steps=8), tmp_path / "r", corpus=tiny_corpus, log=quiet, stop_at=4)  # a checkpoint at 4
    with pytest.raises(ConfigError, match=r"r: this run was started with another config \(train.lr: 0.003 in the run, 0.004 now\)"):
        train(run_cfg(tiny_recipe_path, steps=8, lr=4e-3), tmp_path / "r", corpus=tiny_corpus, log=quiet)
    with pytest.raises(ConfigError, match=r"train.steps: 8 in the run, 12 now"):  # not a longer run spliced onto this one
        train(run_cfg(tiny_recipe_path, steps=12), tmp_path / "r", corpus=tiny_corpus, log=quiet)
    # what does not change the training may differ: threads, the progress bar, checkpoint spacing
    final = train(run_cfg(tiny_recipe_path, steps=8, threads=1, checkpoint_every=2), tmp_path / "r", corpus=tiny_corpus, log=quiet)
    assert final["step"] == 8
    with pytest.raises(ConfigError, match=r"model.d_model: 32 in the run, 16 now"):  # finished: not skipped as another's result
        cfg = run_cfg(tiny_recipe_path, steps=8)
        cfg.model.d_model = 16
        train(cfg, tmp_path / "r", corpus=tiny_corpus, log=quiet)
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "run.json").write_text((tmp_path / "r" / "run.json").read_text())  # killed before its first checkpoint
    assert train(run_cfg(tiny_recipe_path, steps=4), tmp_path / "fresh", corpus=tiny_corpus, log=quiet)["step"] == 4  # nothing started: free


def test_grad_accumulation_matches_full_batch(tiny_corpus, tiny_recipe_path, tmp_path):
    a, _ = (train(run_cfg(tiny_recipe_path, steps=3), tmp_path / "a", corpus=tiny_corpus, log=lambda *_: None), None)
    b = train(run_cfg(tiny_recipe_path, steps=3, grad_accum=2), tmp_path / "b", corpus=tiny_corpus, log=lambda *_: None)
    assert b["in_domain_loss"] == pytest.approx(a["in_domain_loss"], rel=1e-3)


CHILD = """
import sys, json
from basecap.config import validate_run
from basecap.data import load_corpus
from basecap.train import train
cfg = validate_run(json.loads(sys.argv[1]))
train(cfg, sys.argv[2], corpus=load_corpus(sys.argv[3]), log=lambda *_: None)
"""


def test_kill_and_resume_reproduces_the_uninterrupted_loss_sequence(tiny_corpus, tiny_recipe_path, tmp_path):
    cfg = run_cfg(tiny_recipe_path, steps=40, checkpoint_every=5)
    train(cfg, tmp_path / "straight", corpus=tiny_corpus, log=lambda *_: None)
    ref, ref_ev = losses(tmp_path / "straight")

    run_dir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, cfg.model_dump_json(), str(run_dir), str(tiny_corpus.dir)])
    deadline = time.time() + 120
    while time.time() < deadline and not list_checkpoints(run_dir / "checkpoints"):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list_checkpoints(run_dir / "checkpoints"), "child never checkpointed"
    assert not (run_dir / "done.json").exists(), "child finished before it was killed"
    msgs = []
    train(cfg, run_dir, corpus=tiny_corpus, log=msgs.append)
    assert any("resuming from" in m for m in msgs)
    got, got_ev = losses(run_dir)
    assert got == ref  # exact, every step
    # the wall clock of both sessions: the killed one up to the checkpoint resumed from (what it did after that
    # is done again and counted again), then the resumed one to the end
    start = int(next(m for m in msgs if "resuming from" in m).split("step ")[-1].rstrip(")"))
    wall = json.loads((run_dir / "run.json").read_text())["wall"]
    last = wall["sessions"][-1]
    assert (last["from_step"], last["to_step"]) == (start, 40) and last["seconds"] > 0
    assert all(x["to_step"] <= start for x in wall["sessions"][:-1]) and len(wall["sessions"]) <= 2
    assert wall["seconds"] == pytest.approx(sum(x["seconds"] for x in wall["sessions"]))
    assert [e["domains"] for e in got_ev] == [e["domains"] for e in ref_ev]


def test_corrupt_checkpoint_is_detected_and_previous_used(tiny_corpus, tiny_recipe_path, tmp_path):
    cfg = run_cfg(tiny_recipe_path)
    train(cfg, tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    ckpts = list_checkpoints(tmp_path / "r" / "checkpoints")
    w = ckpts[-1] / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])  # truncated
    model = build_model(cfg.model, tiny_corpus.vocab_size)
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt or truncated"):
        load_weights(ckpts[-1], model)
    msgs = []
    with pytest.warns(UserWarning, match="corrupt"):
        good = latest_good_checkpoint(tmp_path / "r" / "checkpoints", log=msgs.append)
    assert good == ckpts[-2] and "falling back" in msgs[0]


def test_nan_loss_stops_naming_the_step_and_keeps_checkpoints(tiny_corpus, tiny_recipe_path, tmp_path, monkeypatch):
    import basecap.train as T

    calls = {"n": 0}
    orig = T._loss

    def flaky(model, x, y):
        calls["n"] += 1
        out = orig(model, x, y)
        return out * float("nan") if calls["n"] == 6 else out

    monkeypatch.setattr(T, "_loss", flaky)
    with pytest.raises(TrainingDiverged, match=r"at step 6; stopped.*latest: step_00000004"):
        train(run_cfg(tiny_recipe_path), tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    assert [p.name for p in list_checkpoints(tmp_path / "r" / "checkpoints")] == ["step_00000004"]


def test_unknown_domain_fails_before_compute(tiny_corpus, tiny_recipe_path, tmp_path):
    from basecap.config_base import ConfigError

    cfg = run_cfg(tiny_recipe_path)
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"train_weights": {"poetry": 1.0}})})
    with pytest.raises(ConfigError, match=r"unknown domain\(s\) \['poetry'\]; the corpus has: "):
        train(cfg, tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_chunked_head_trains_like_the_plain_head(tiny_corpus, tiny_recipe_path, tmp_path, monkeypatch):
    import basecap.ops.linear_ce as linear_ce

    monkeypatch.setattr(linear_ce, "CHUNK_LOGITS", 16 * tiny_corpus.vocab_size)  # 16 tokens per chunk: 8 chunks a step
    base = run_cfg(tiny_recipe_path, steps=4, checkpoint_every=100)
    per_impl = {}
    for impl in ("plain", "chunked"):
        cfg = base.model_copy(update={"model": base.model.model_copy(update={"head_impl": impl})})
        train(cfg, tmp_path / impl, corpus=tiny_corpus, log=lambda *_: None)
        per_impl[impl] = losses(tmp_path / impl)[0]
    assert len(per_impl["plain"]) == 4
    assert per_impl["chunked"] == pytest.approx(per_impl["plain"], rel=1e-4)


def test_a_parameter_without_gradient_does_not_stop_an_exact_resume(tiny_corpus, tiny_recipe_path, tmp_path, monkeypatch):
    """Mamba blocks have no MLP, so their second norm never gets a gradient and has no optimizer state in
    the checkpoint; resuming must still load it and continue exactly."""
    import basecap.train as T

    cfg = validate_run({**json.loads(run_cfg(tiny_recipe_path).model_dump_json()),
                        "model": {"d_model": 32, "n_layers": 2, "max_seq_len": 32, "mixer": {"name": "mamba1", "d_state": 4}}})
    assert cfg.model.mlp.name == "none"
    train(cfg, tmp_path / "straight", corpus=tiny_corpus, log=lambda *_: None)
    ref, ref_ev = losses(tmp_path / "straight")

    orig = T.save_checkpoint

    def save_then_stop(*a, **k):
        orig(*a, **k)
        raise KeyboardInterrupt  # stopped right after the first checkpoint

    monkeypatch.setattr(T, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "stopped", corpus=tiny_corpus, log=lambda *_: None)
    monkeypatch.setattr(T, "save_checkpoint", orig)
    msgs = []
    train(cfg, tmp_path / "stopped", corpus=tiny_corpus, log=msgs.append)
    assert any("resuming from" in m for m in msgs)
    got, got_ev = losses(tmp_path / "stopped")
    assert got == ref  # exact, every step
    assert [e["domains"] for e in got_ev] == [e["domains"] for e in ref_ev]
