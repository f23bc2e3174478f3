"""The wsd schedule, cooldown branches (annealed points) and the OOD loss by training frequency of the target."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from basecap.checkpoint import list_checkpoints
from basecap.config_base import ConfigError
from basecap.eval.ood import STRATA, strata_losses, target_strata
from basecap.optim import decay_factor, lr_at
from basecap.train import train
from test_train import CHILD, losses, run_cfg


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def quiet(*_):
    pass


def test_decay_shapes_known_values():
    assert decay_factor(0.0, "1-sqrt") == 1.0 and decay_factor(1.0, "1-sqrt") == 0.0
    assert decay_factor(0.25, "1-sqrt") == pytest.approx(0.5)
    assert decay_factor(0.25, "linear") == pytest.approx(0.75)
    assert decay_factor(0.5, "cosine") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="allowed linear"):
        decay_factor(0.5, "step")


def test_wsd_schedule_warms_up_holds_and_decays_to_the_floor(tiny_recipe_path):
    tc = run_cfg(tiny_recipe_path, steps=20, schedule="wsd", decay_fraction=0.2, decay_shape="linear", min_lr_ratio=0.1).train
    lrs = [lr_at(s, tc) for s in range(20)]
    assert lrs[0] == pytest.approx(3e-3 / 2) and lrs[1] == pytest.approx(3e-3)  # 2 warmup steps
    assert lrs[2:16] == [3e-3] * 14  # stable until the last 20% (4 steps)
    assert lrs[16:] == pytest.approx([3e-4 + 2.7e-3 * f for f in (0.75, 0.5, 0.25, 0.0)])
    cos = run_cfg(tiny_recipe_path, steps=20).train  # the default stays cosine, unchanged
    assert lr_at(19, cos) == pytest.approx(3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 17 / 18))))


def test_cooldown_config_is_validated(tiny_recipe_path):
    with pytest.raises(ConfigError, match="inside"):
        run_cfg(tiny_recipe_path, steps=8, cooldowns=[8])
    with pytest.raises(ConfigError, match="no step of decay"):
        run_cfg(tiny_recipe_path, steps=8, cooldowns=[2], cooldown_fraction=0.1)
    assert run_cfg(tiny_recipe_path, steps=40, cooldowns=[10], cooldown_fraction=0.25).train.cooldown_steps(10) == 2  # round(2.5)


def test_branches_leave_the_main_run_bit_identical_and_record_annealed_points(tiny_corpus, tiny_recipe_path, tmp_path):
    plain = run_cfg(tiny_recipe_path, steps=16, schedule="wsd", checkpoint_every=8)
    forked = run_cfg(tiny_recipe_path, steps=16, schedule="wsd", checkpoint_every=8, cooldowns=[6, 12], cooldown_fraction=0.5,
                     keep_cooldown_weights=True)
    train(plain, tmp_path / "plain", corpus=tiny_corpus, log=quiet)
    train(forked, tmp_path / "forked", corpus=tiny_corpus, log=quiet)
    a, b = records(tmp_path / "plain"), records(tmp_path / "forked")
    main_b = [r for r in b if r["kind"] != "anneal"]
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "mfu")} for r in rs]  # noqa: E731 - timings
    assert strip(main_b) == strip(a)  # every loss, rate, gradient norm and evaluation, bit for bit
    points = [r for r in b if r["kind"] == "anneal"]
    assert [(p["step"], p["end_step"], p["cooldown_steps"]) for p in points] == [(6, 9, 3), (12, 18, 6)]
    assert points[0]["start_lr"] == pytest.approx(3e-3) and points[0]["end_lr"] == pytest.approx(3e-4)
    assert "strata" in points[0]["domains"]["code"]
    assert (tmp_path / "forked" / "annealed" / "step_00000006" / "model.safetensors").is_file()
    assert not (tmp_path / "forked" / "cooldown").exists() or not any((tmp_path / "forked" / "cooldown").iterdir())


def test_an_annealed_point_at_the_decay_start_equals_a_plain_wsd_run_end(tiny_corpus, tiny_recipe_path, tmp_path):
    # wsd over 20 steps decays over the last 4; a longer wsd run forking at 16 with a 4-step branch (0.25 x 16)
    # trains the same steps on the same batches at the same rates
    short = run_cfg(tiny_recipe_path, steps=20, schedule="wsd", decay_fraction=0.2, checkpoint_every=10)
    long = run_cfg(tiny_recipe_path, steps=30, schedule="wsd", decay_fraction=0.2, checkpoint_every=10, cooldowns=[16],
                   cooldown_fraction=0.25)
    end = train(short, tmp_path / "short", corpus=tiny_corpus, log=quiet)
    train(long, tmp_path / "long", corpus=tiny_corpus, log=quiet)
    point = next(r for r in records(tmp_path / "long") if r["kind"] == "anneal")
    assert point["end_step"] == 20
    assert point["in_domain_loss"] == end["in_domain_loss"]
    assert point["domains"] == end["domains"]


def test_a_branch_killed_midway_resumes_exactly(tiny_corpus, tiny_recipe_path, tmp_path):
    cfg = run_cfg(tiny_recipe_path, steps=24, schedule="wsd", checkpoint_every=2, cooldowns=[12], cooldown_fraction=1.0)
    train(cfg, tmp_path / "straight", corpus=tiny_corpus, log=quiet)
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, cfg.model_dump_json(), str(run_dir), str(tiny_corpus.dir)])
    deadline = time.time() + 120
    while time.time() < deadline and len(list_checkpoints(run_dir / "cooldown" / "step_00000012")) == 0:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list_checkpoints(run_dir / "cooldown" / "step_00000012"), "the branch never checkpointed"
    msgs = []
    train(cfg, run_dir, corpus=tiny_corpus, log=msgs.append)
    assert any("cooldown branch at step 12: resuming" in m for m in msgs)
    ref, got = records(tmp_path / "straight"), records(run_dir)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "mfu")} for r in rs]  # noqa: E731
    assert strip(got) == strip(ref)


def test_strata_known_answer():
    counts = torch.tensor([0, 3, 10, 50])  # ids 0: unseen, 1: rare, 2 and 3: seen (threshold 10)
    strata = target_strata(counts.numpy(), 10)
    assert strata.tolist() == [2, 1, 0, 0]
    losses = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    targets = torch.tensor([[0, 1, 2, 3, 0]])
    sums, n = strata_losses(losses, targets, strata)
    assert dict(zip(STRATA, n.tolist())) == {"seen": 2, "rare": 1, "unseen": 2}
    assert dict(zip(STRATA, sums.tolist())) == {"seen": 7.0, "rare": 2.0, "unseen": 6.0}


def test_every_evaluation_records_the_loss_per_stratum(tiny_corpus, tiny_recipe_path, tmp_path):
    final = train(run_cfg(tiny_recipe_path, steps=4), tmp_path / "r", corpus=tiny_corpus, log=quiet)
    for res in final["domains"].values():
        st = res["strata"]
        assert sum(s["tokens"] for s in st.values()) == res["tokens"]
        total = sum(s["loss"] * s["tokens"] for s in st.values() if s["tokens"])
        assert total / res["tokens"] == pytest.approx(res["loss"], rel=1e-9)
    # the prose-trained model has seen every prose target it is scored on at least once
    assert final["domains"]["prose"]["strata"]["unseen"]["tokens"] == 0
    _, ev = losses(tmp_path / "r")
    assert all("strata" in e["domains"]["code"] for e in ev)


def test_plan_counts_the_branches(tiny_recipe_path):
    from basecap.plan import plan_run

    cfg = run_cfg(tiny_recipe_path, steps=40, cooldowns=[10, 20, 30], cooldown_fraction=0.2)
    row = plan_run(cfg, gpus=1, gpu="H100")
    assert row["branch_steps"] == 2 + 4 + 6
    assert row["total_tokens"] == (40 + 12) * 4 * 32


def test_a_branch_of_a_model_with_parameters_that_get_no_gradient(tiny_corpus, tiny_recipe_path, tmp_path):
    """Mamba-2 blocks have no MLP, so a norm never gets a gradient and has no optimizer state: restoring the live run
    after a branch must accept that, as resuming does."""
    cfg = run_cfg(tiny_recipe_path, steps=8, schedule="wsd", checkpoint_every=4, cooldowns=[4], cooldown_fraction=0.5)
    from basecap.mixers import parse_mixer_config, parse_mlp_config

    model = cfg.model.model_copy(update={"mixer": parse_mixer_config({"name": "mamba2"}), "mlp": parse_mlp_config({"name": "none"})})
    cfg = cfg.model_copy(update={"model": model})
    train(cfg, tmp_path / "r", corpus=tiny_corpus, log=quiet)
    assert [r["step"] for r in records(tmp_path / "r") if r["kind"] == "anneal"] == [4]
