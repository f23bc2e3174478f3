import pytest
import torch

from basecap.mixers import mixer_class, mixer_names
from basecap.model import LM, ModelConfig


def tiny(mixer=None, **kw):
    torch.manual_seed(0)
    return LM(ModelConfig(vocab_size=50, d_model=32, n_layers=2, max_seq_len=64, mixer=mixer or {"name": "attention", "head_dim": 8}, **kw))


@pytest.mark.parametrize("position", ["rope", "absolute", "none", "alibi"])
def test_model_is_causal(position):
    m = tiny({"name": "attention", "head_dim": 8, "position": position})
    idx = torch.randint(0, 50, (2, 20))
    a, _ = m(idx)
    idx2 = idx.clone()
    idx2[:, 11] = (idx2[:, 11] + 1) % 50
    b, _ = m(idx2)
    assert torch.allclose(a[:, :11], b[:, :11], atol=1e-6)
    assert not torch.allclose(a[:, 11:], b[:, 11:])


def test_absolute_positions_only_when_asked():
    assert tiny({"name": "attention", "head_dim": 8, "position": "absolute"}).abs_pos is not None
    assert tiny().abs_pos is None


def test_generate_matches_argmax_of_full_forward():
    m = tiny()
    prompt = torch.randint(0, 50, (1, 7))
    out = m.generate(prompt, 6)
    seq = prompt
    for _ in range(6):
        logits, _ = m(seq)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq[:, 7:])


def test_param_counts_and_flops():
    m = tiny()
    c = m.param_counts()
    assert c["total"] == sum(p.numel() for p in m.parameters())
    assert c["embedding"] == 2 * 50 * 32
    assert c["non_embedding"] == c["total"] - c["embedding"]
    assert m.flops_per_token(64) > 2 * c["non_embedding"]
    tied = tiny(tie_embeddings=True)
    assert tied.param_counts()["embedding"] == 50 * 32


def test_no_biases_anywhere():
    for name in mixer_names():
        m = tiny({"name": name, **mixer_class(name).test_variants[0]})
        for n, mod in m.named_modules():
            if isinstance(mod, torch.nn.Linear):
                assert mod.bias is None, f"{name}: {n} has a bias"


def test_hybrid_layer_override():
    m = tiny(layer_mixers={1: {"name": "attention", "head_dim": 8, "window": 4}})
    assert m.blocks[1].mixer.cfg.window == 4 and m.blocks[0].mixer.cfg.window == 0
    with pytest.raises(ValueError, match="outside"):
        tiny(layer_mixers={5: {"name": "attention"}})


def _loss_and_grads(m, idx, targets, **kw):
    m.zero_grad(set_to_none=True)
    loss = m.loss(idx, targets, **kw)
    loss.sum().backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


def _rel(a, b):
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_head_loss_and_every_gradient_equal_the_plain_head(tie, reduction, monkeypatch):
    import basecap.ops.linear_ce as linear_ce

    monkeypatch.setattr(linear_ce, "CHUNK_LOGITS", 7 * 50)  # 7 tokens per chunk: several chunks and a partial one
    idx = torch.randint(0, 50, (3, 20))
    targets = torch.randint(0, 50, (3, 20))
    targets[0, :5] = -100  # ignored positions
    out = {}
    for impl in ("plain", "chunked", "auto"):
        out[impl] = _loss_and_grads(tiny(tie_embeddings=tie, head_impl=impl), idx, targets, reduction=reduction)
    ref_loss, ref_grads = out["plain"]
    assert ref_loss.shape == (() if reduction != "none" else (3, 20))
    for impl in ("chunked", "auto"):  # auto is chunked on CPU
        loss, grads = out[impl]
        assert _rel(loss, ref_loss) < 1e-5
        assert grads.keys() == ref_grads.keys()
        for name, g in grads.items():
            assert _rel(g, ref_grads[name]) < 1e-5, name
    if tie:
        assert "head.weight" not in ref_grads  # one shared tensor, both uses in its gradient


def test_forward_with_targets_returns_the_state_and_matches_logits():
    m = tiny({"name": "attention", "head_dim": 8, "position": "absolute"})
    idx = torch.randint(0, 50, (2, 12))
    targets = torch.randint(0, 50, (2, 12))
    logits, _ = m(idx)
    with torch.no_grad():
        per_token, _ = m(idx, targets=targets, reduction="none")
        want = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        assert _rel(per_token, want) < 1e-5
        state = m.init_state(2)
        _, state = m(idx[:, :5], state)
        loss, state = m(idx[:, 5:], state, targets=targets[:, 5:], reduction="sum")
        assert state["pos"] == 12
        assert float(loss) == pytest.approx(float(want[:, 5:].sum()), rel=1e-5)
    with pytest.raises(ValueError, match="reduction"):
        m(idx, targets=targets, reduction="max")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_matches_torch(dtype):
    from basecap.ops.norm import RMSNorm

    torch.manual_seed(0)
    ours, ref = RMSNorm(24, eps=1e-5).to(dtype), torch.nn.RMSNorm(24, eps=1e-5).to(dtype)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ref.weight.copy_(ours.weight)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(3, 7, 24, dtype=dtype) * 3
    grad = torch.randn(3, 7, 24, dtype=dtype)
    out = []
    for norm in (ours, ref):
        xi = x.clone().requires_grad_()
        y = norm(xi)
        y.backward(grad)
        out.append((y.detach(), xi.grad, norm.weight.grad))
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    for a, b in zip(*out):
        assert _rel(a, b) < tol


@pytest.mark.parametrize("name", ["mamba2", "deltanet", "gated_deltanet"])
def test_mixer_output_norms_use_the_cpu_rms_norm(name):
    """The mixers' output norms are the hand-written CPU RMSNorm (a subclass of nn.RMSNorm: same state dict)."""
    from basecap.ops.norm import RMSNorm

    m = LM(ModelConfig(vocab_size=32, d_model=64, n_layers=1, max_seq_len=16, mixer={"name": name}))
    norms = [mod for mod in m.blocks[0].mixer.modules() if isinstance(mod, torch.nn.RMSNorm)]
    assert norms and all(type(mod) is RMSNorm for mod in norms)


def test_a_masked_attention_gives_sdpa_a_4d_mask(monkeypatch):
    """SDPA's fused CPU kernel takes 2-D or 4-D masks only; a 3-D one falls back to the unfused math path (ALiBi's
    1k-context runs took 2-2.6x as long with it, LOG.md round 13)."""
    import torch.nn.functional as F

    seen, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append(None if attn_mask is None else attn_mask.dim())
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    for mixer in ({"position": "alibi"}, {"window": 16}):
        tiny({"name": "attention", "head_dim": 8, **mixer})(torch.randint(0, 50, (2, 20)))
    assert seen and set(seen) == {4}
