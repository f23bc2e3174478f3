"""The one optimiser step and schedule (basecap.optim) against plain loops written out by hand: MQAR's trainings go
through them bit for bit as a plain loop at the main loop's rates, and the step's parts (groups, accumulation,
clipping, the check before the weights change) do what they say."""

import math

import pytest
import torch

from basecap.data.synthetic import IGNORE
from basecap.eval.recall import MqarTask, MqarTraining, fit_mqar, mqar_training_set
from basecap.model import LM, ModelConfig
from basecap.optim import make_optimizer, optimizer_step


def _mqar_model(seed=3):
    torch.manual_seed(seed)
    return LM(ModelConfig(vocab_size=128, d_model=16, n_layers=1, max_seq_len=16, mixer={"name": "attention"}))


def _main_loop_rate(step, training):
    """The main loop's cosine schedule written out: warmup to lr, then cosine to lr x 0.1."""
    warm = max(1, int(training.warmup_frac * training.steps))
    if step < warm:
        return training.lr * (step + 1) / warm
    progress = (step - warm) / max(1, training.steps - warm)
    return training.lr * (0.1 + (1 - 0.1) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _plain_mqar_loop(model, data, training):
    """MQAR's loop as it was before it trained through basecap.optim, at the main loop's rates (the reference)."""
    inputs, targets = data
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": training.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=training.lr, betas=(0.9, 0.98))
    losses = []
    for step in range(training.steps):
        for g in opt.param_groups:
            g["lr"] = _main_loop_rate(step, training)
        b = training.batch_size
        loss, _ = model(inputs[step * b : (step + 1) * b], targets=targets[step * b : (step + 1) * b], ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


def test_mqar_through_the_shared_step_and_schedule_matches_its_plain_loop_bit_for_bit():
    task, training = MqarTask(seq_len=16, num_test=8, train_kv_pairs=(1, 2)), MqarTraining(steps=12, batch_size=4, warmup_frac=0.25)
    data = mqar_training_set(task, training, 3)
    shared, plain = _mqar_model(), _mqar_model()
    curve, _ = fit_mqar(shared, data, task, training, seed=3, device="cpu", eval_every=0)
    losses = _plain_mqar_loop(plain, data, training)
    assert [loss for _, loss in curve] == [round(losses[0], 4), round(losses[-1], 4)]
    for (name, a), (_, b) in zip(shared.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name


def test_make_optimizer_decays_matrices_only():
    model = _mqar_model()
    opt = make_optimizer(model, MqarTraining(weight_decay=0.3))
    decayed, free = opt.param_groups
    assert decayed["weight_decay"] == 0.3 and free["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in free["params"])
    assert len(decayed["params"]) + len(free["params"]) == len(list(model.parameters()))
    assert opt.param_groups[0]["betas"] == (0.9, 0.98)


def test_accumulated_step_matches_one_batch_and_reports_the_mean_loss():
    x, y = torch.randint(128, (4, 16)), torch.randint(128, (4, 16))
    out = {}
    for parts in (1, 2):
        model = _mqar_model()
        opt = make_optimizer(model, MqarTraining())
        micro = list(zip(x.chunk(parts), y.chunk(parts)))
        loss, gnorm = optimizer_step(model, opt, micro, lr=1e-3, loss_fn=lambda a, b, m=model: m(a, targets=b)[0], grad_clip=0.0)
        out[parts] = (loss, float(gnorm), torch.cat([p.detach().flatten() for p in model.parameters()]))
        assert all(p.grad is None for p in model.parameters())  # cleared for the next step
    assert out[1][0] == pytest.approx(out[2][0], rel=1e-5)
    assert out[1][1] == pytest.approx(out[2][1], rel=1e-4)
    torch.testing.assert_close(out[1][2], out[2][2], rtol=1e-4, atol=1e-6)


def test_check_runs_before_the_weights_change_and_clip_bounds_the_update():
    model = _mqar_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = make_optimizer(model, MqarTraining())

    def stop(loss):
        raise RuntimeError(f"stopped at {loss}")

    with pytest.raises(RuntimeError, match="stopped at nan"):
        optimizer_step(model, opt, [(None, None)], lr=1e-3, loss_fn=lambda a, b: next(model.parameters()).sum() * math.nan, grad_clip=1.0, check=stop)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad(set_to_none=True)  # the stopped step's gradients: a loop that stops never steps again
    x, y = torch.randint(128, (2, 16)), torch.randint(128, (2, 16))
    loss, gnorm = optimizer_step(model, opt, [(x, y)], lr=1e-3, loss_fn=lambda a, b: model(a, targets=b)[0] * 1e4, grad_clip=1.0)
    assert float(gnorm) > 1.0  # the norm before clipping is what the step reports
