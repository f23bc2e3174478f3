"""Checkpoints never unpickle what basecap did not write: a planted pickle is refused and nothing runs."""

import json
import pickle
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from basecap.checkpoint import (
    CheckpointError,
    SafeLoadPlanner,
    SafeReader,
    _sha256,
    latest_good_checkpoint,
    restore,
    save_checkpoint,
)


class Payload:
    """Unpickling this creates ``marker``: the proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def tiny_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), foreach=True)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def rehash(ckpt):
    """What a forger does: rewrite meta.json so the SHA-256 check passes."""
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"] = {name: _sha256(ckpt / name) for name in meta["files"]}
    (ckpt / "meta.json").write_text(json.dumps(meta))


def test_own_checkpoint_round_trips_through_the_safe_loader(tmp_path):
    model, opt = tiny_model()
    ckpt = save_checkpoint(tmp_path, 3, model, opt, {})
    model2, opt2 = tiny_model()
    with torch.no_grad():
        model2[0].weight.zero_()
    assert restore(ckpt, model2, opt2)["step"] == 3
    assert torch.equal(model2[0].weight, model[0].weight)
    assert opt2.param_groups[0]["betas"] == (0.9, 0.95) and opt2.state_dict()["state"][0]["step"] == 1


def test_planted_metadata_pickle_is_refused_and_runs_nothing(tmp_path):
    model, opt = tiny_model()
    ckpt = save_checkpoint(tmp_path / "ckpts", 1, model, opt, {})
    marker = tmp_path / "code_ran"
    (ckpt / "state" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    rehash(ckpt)
    assert latest_good_checkpoint(tmp_path / "ckpts") == ckpt  # the hashes prove integrity, not trust
    with pytest.raises(CheckpointError, match=r"refusing to load .*open.*docs/security.md"):
        restore(ckpt, *tiny_model())
    assert not marker.exists()
    pickle.loads((ckpt / "state" / ".metadata").read_bytes())  # control: the payload is live
    assert marker.exists()


def test_planted_non_tensor_entry_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "code_ran"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"lr": Payload(marker), "w": torch.zeros(2)}, checkpoint_id=str(tmp_path / "state"))
        with pytest.raises(dcp.CheckpointException, match="io.open"):
            dcp.load({"lr": None, "w": torch.ones(2)}, storage_reader=SafeReader(tmp_path / "state"), planner=SafeLoadPlanner())
        assert not marker.exists()
        dcp.load({"lr": None, "w": torch.ones(2)}, checkpoint_id=str(tmp_path / "state"))  # control: the default loader runs it
    assert marker.exists()


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    model, opt = tiny_model()
    first = save_checkpoint(tmp_path, 1, model, opt, {})

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("basecap.checkpoint.save_file", full_disk)
    with pytest.raises(CheckpointError, match="step 2 failed on rank 0: OSError.*No space left"):
        save_checkpoint(tmp_path, 2, model, opt, {})
    assert latest_good_checkpoint(tmp_path) == first and not list(tmp_path.glob(".tmp_step_*"))


def test_resume_refuses_a_planted_checkpoint(tiny_corpus, tiny_recipe_path, tmp_path):
    from test_train import run_cfg

    from basecap.train import train

    train(run_cfg(tiny_recipe_path, steps=8), tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None, stop_at=4)
    ckpt = latest_good_checkpoint(tmp_path / "r" / "checkpoints")
    marker = tmp_path / "code_ran"
    (ckpt / "state" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    rehash(ckpt)
    with pytest.raises(CheckpointError, match="refusing to load"):
        train(run_cfg(tiny_recipe_path, steps=8), tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    assert not marker.exists()
