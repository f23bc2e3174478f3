"""RWKV-5/6/7 beyond the contract test: the WKV ops against each other and against the independent
pure-PyTorch references of flash-linear-attention (loaded file by file, never the Triton
package), numerical stability, the mixers with every parameter live, the channel mix's decode
and state, the backbone wiring and the paper inits."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from basecap.config_base import ConfigError
from basecap.mixers import build_mixer, mlp_class, parse_mixer_config, parse_mlp_config, state_bytes
from basecap.mixers.rwkv7 import _lora_rank
from basecap.model import LM, ModelConfig
from basecap.ops.wkv import token_shift, wkv6_chunked, wkv6_recurrent, wkv7_chunked, wkv7_recurrent

from fla_oracle import fla_naive
from mixer_contract import rel_err as rel



def wkv6_inputs(B=2, T=37, H=3, K=8, V=6, seed=0, dtype=torch.float64, decay_scale=2.0):
    g = torch.Generator().manual_seed(seed)
    r, k = (torch.randn(B, T, H, K, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    log_w = -torch.exp(decay_scale * torch.randn(B, T, H, K, generator=g, dtype=dtype))  # spans ~e^-6 .. e^6
    u = torch.randn(H, K, generator=g, dtype=dtype)
    S0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    return r, k, v, log_w, u, S0


def wkv7_inputs(B=2, T=37, H=3, K=8, V=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r, k = (torch.randn(B, T, H, K, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    log_w = -math.exp(-0.5) * torch.sigmoid(3 * torch.randn(B, T, H, K, generator=g, dtype=dtype))
    kappa = F.normalize(torch.randn(B, T, H, K, generator=g, dtype=dtype), dim=-1)
    lr = torch.rand(B, T, H, K, generator=g, dtype=dtype)
    S0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    return r, log_w, k, v, -kappa, kappa * lr, S0


# ---- the ops ----------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_wkv6_chunked_matches_recurrent_fp64(chunk):
    r, k, v, log_w, u, S0 = wkv6_inputs()
    leaves = [t.clone().requires_grad_() for t in (r, k, v, log_w, u, S0)]
    y_ref, S_ref = wkv6_recurrent(*leaves)
    gy, gS = torch.randn_like(y_ref), torch.randn_like(S_ref)
    grads_ref = torch.autograd.grad((y_ref * gy).sum() + (S_ref * gS).sum(), leaves)
    y, S = wkv6_chunked(*leaves, chunk_size=chunk)
    grads = torch.autograd.grad((y * gy).sum() + (S * gS).sum(), leaves)
    assert rel(y, y_ref) < 1e-12 and rel(S, S_ref) < 1e-12
    for name, a, b in zip("r k v log_w u S0".split(), grads, grads_ref):
        assert rel(a, b) < 1e-10, name


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_wkv7_chunked_matches_recurrent_fp64(chunk):
    inputs = wkv7_inputs()
    leaves = [t.clone().requires_grad_() for t in inputs]
    y_ref, S_ref = wkv7_recurrent(*leaves)
    gy, gS = torch.randn_like(y_ref), torch.randn_like(S_ref)
    grads_ref = torch.autograd.grad((y_ref * gy).sum() + (S_ref * gS).sum(), leaves)
    y, S = wkv7_chunked(*leaves, chunk_size=chunk)
    grads = torch.autograd.grad((y * gy).sum() + (S * gS).sum(), leaves)
    assert rel(y, y_ref) < 1e-11 and rel(S, S_ref) < 1e-11
    for name, a, b in zip("r log_w k v a b S0".split(), grads, grads_ref):
        assert rel(a, b) < 1e-9, name


def test_wkv6_chunked_is_stable_for_extreme_decays():
    """Decays down to exp(-e^12) per step: a factorised e^{+g} would overflow fp32 many times over."""
    r, k, v, log_w, u, S0 = (t.float() for t in wkv6_inputs(T=70, decay_scale=4.0))
    log_w[:, ::7] = -1e4  # hard resets
    y_ref, S_ref = wkv6_recurrent(r, k, v, log_w, u, S0)
    for chunk in (16, 64):
        y, S = wkv6_chunked(r, k, v, log_w, u, S0, chunk_size=chunk)
        assert rel(y, y_ref) < 1e-5 and rel(S, S_ref) < 1e-5


def test_wkv7_chunked_fp32_at_the_fastest_decay():
    """RWKV-7's decay is bounded below by exp(-e^-0.5); at that bound over whole chunks of 64
    the midpoint-referenced factors reach e^{+-19}: still accurate in fp32."""
    r, log_w, k, v, a, b, S0 = (t.float() for t in wkv7_inputs(T=130))
    log_w = torch.full_like(log_w, -math.exp(-0.5))
    y_ref, S_ref = wkv7_recurrent(r, log_w, k, v, a, b, S0)
    y, S = wkv7_chunked(r, log_w, k, v, a, b, S0, chunk_size=64)
    assert rel(y, y_ref) < 1e-5 and rel(S, S_ref) < 1e-5


def test_wkv_state_passing_splits_a_sequence():
    r, k, v, log_w, u, _ = wkv6_inputs(T=40)
    y_full, S_full = wkv6_chunked(r, k, v, log_w, u, chunk_size=16)
    y1, S1 = wkv6_chunked(r[:, :23], k[:, :23], v[:, :23], log_w[:, :23], u, chunk_size=16)
    y2, S2 = wkv6_chunked(r[:, 23:], k[:, 23:], v[:, 23:], log_w[:, 23:], u, S1, chunk_size=16)
    assert rel(torch.cat([y1, y2], 1), y_full) < 1e-12 and rel(S2, S_full) < 1e-12
    r, log_w, k, v, a, b, _ = wkv7_inputs(T=40)
    y_full, S_full = wkv7_chunked(r, log_w, k, v, a, b, chunk_size=16)
    y1, S1 = wkv7_chunked(*(t[:, :23] for t in (r, log_w, k, v, a, b)), chunk_size=16)
    y2, S2 = wkv7_chunked(*(t[:, 23:] for t in (r, log_w, k, v, a, b)), S1, chunk_size=16)
    assert rel(torch.cat([y1, y2], 1), y_full) < 1e-12 and rel(S2, S_full) < 1e-12


def test_wkv6_matches_fla_reference():
    """fla's naive RWKV-6: [B, H, T, K] layout, ``w`` is the log decay, ``scale`` multiplies q."""
    naive = fla_naive("rwkv6/recurrent_naive.py")
    r, k, v, log_w, u, S0 = wkv6_inputs(dtype=torch.float32, decay_scale=1.0)
    heads_first = [t.transpose(1, 2) for t in (r, k, v, log_w)]
    y_fla, S_fla = naive.naive_recurrent_rwkv6(*heads_first, u, scale=1.0, initial_state=S0, output_final_state=True)
    for impl in (wkv6_recurrent, wkv6_chunked):
        y, S = impl(r, k, v, log_w, u, S0)
        assert rel(y.transpose(1, 2), y_fla) < 1e-5 and rel(S, S_fla) < 1e-5


def test_wkv7_matches_fla_reference():
    """fla's naive diagonal-plus-low-rank recurrence (RWKV-7's kernel): S <- S*exp(gk) + k v^T +
    beta (alpha^T S), o = q S; it scales q by K^-0.5, which we undo."""
    naive = fla_naive("generalized_delta_rule/dplr/naive.py")
    r, log_w, k, v, a, b, S0 = wkv7_inputs(dtype=torch.float32)
    K = r.shape[-1]
    hf = lambda t: t.transpose(1, 2).contiguous()  # noqa: E731
    y_fla, S_fla = naive.dplr_recurrence(hf(r) * K**0.5, hf(k), hf(v), hf(a), hf(b), hf(log_w), initial_state=S0.clone())
    for impl in (wkv7_recurrent, wkv7_chunked):
        y, S = impl(r, log_w, k, v, a, b, S0)
        assert rel(y.transpose(1, 2), y_fla) < 1e-5 and rel(S, S_fla) < 1e-5


# ---- the mixers ---------------------------------------------------------------------------------

MIXERS = {
    "rwkv5": {"head_dim": 8},
    "rwkv6": {"head_dim": 8, "mix_lora_rank": 4, "decay_lora_rank": 8},
    "rwkv7": {"head_dim": 8, "decay_lora_rank": 8, "a_lora_rank": 4, "gate_lora_rank": 8},
}


def make(name, layer_idx=0, d_model=32, **over):
    torch.manual_seed(0)
    cfg = parse_mixer_config({"name": name, **MIXERS[name], **over})
    return build_mixer(cfg, d_model, layer_idx=layer_idx, max_seq_len=128)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_chunked_matches_ref_with_every_parameter_live(name):
    """At init the LoRA inputs are zero (data-independent decay etc.); perturb every parameter so
    the data-dependent paths and all their gradients are compared too."""
    m_ref = make(name, layer_idx=3)
    with torch.no_grad():
        for p in m_ref.parameters():
            p.add_(0.3 * torch.randn_like(p))
    m_fast = make(name, layer_idx=3, impl="chunked", chunk_size=16)
    m_fast.load_state_dict(m_ref.state_dict())
    m_ref.cfg = m_ref.cfg.model_copy(update={"impl": "ref"})
    x = torch.randn(2, 45, 32, requires_grad=True)
    y_ref, _ = m_ref(x)
    gy = torch.randn_like(y_ref)
    g_ref = torch.autograd.grad(y_ref, [x, *m_ref.parameters()], gy)
    y, _ = m_fast(x)
    g = torch.autograd.grad(y, [x, *m_fast.parameters()], gy)
    assert rel(y, y_ref) < 1e-4
    for (n, _), a, b in zip([("x", x), *m_ref.named_parameters()], g, g_ref):
        assert b.norm() > 0, f"{n} got no gradient"
        assert rel(a, b) < 1e-4, n


def test_rwkv7_decay_is_bounded_and_value_residual_absent(monkeypatch):
    """Whatever the weights, RWKV-7's per-step log decay stays in [-e^-0.5, 0] (what keeps the
    chunked form's factors bounded)."""
    import basecap.mixers.kit.rwkv as rwkv_kit

    seen = []

    def spy(r, log_w, *rest, **kw):
        seen.append(log_w.detach())
        return wkv7_chunked(r, log_w, *rest, **kw)

    monkeypatch.setattr(rwkv_kit, "wkv7_chunked", spy)
    m = make("rwkv7")
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(30.0)
    m(torch.randn(2, 20, 32) * 10)
    assert seen and (seen[0] >= -math.exp(-0.5) - 1e-6).all() and (seen[0] <= 0).all()
    assert seen[0].min() < -0.5 and seen[0].max() > -0.1  # both ends are reached
    assert not any(n.startswith(("v0", "v1", "v2")) for n, _ in m.named_parameters())


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_head_dim_must_divide_d_model(name):
    with pytest.raises(ValueError, match="head_dim"):
        make(name, d_model=36)
    with pytest.raises(ConfigError, match="unknown key"):
        parse_mixer_config({"name": name, "head_size": 8})  # the old spelling is gone


def test_paper_inits_and_ramps():
    """Decay ramps from slow to fast channels; deeper layers mix less of the previous token;
    RWKV-5's bonus starts at 0 +- zigzag in the first layer."""
    first, last = make("rwkv6", layer_idx=0), make("rwkv6", layer_idx=11)
    w = -first.time_decay.detach().exp()
    assert w[0] > w[-1] and torch.allclose(first.time_decay[0], torch.tensor(-6.0))
    assert first.mix_x.mean() > last.mix_x.mean()  # mix = share of x_{t-1}: 1 - ddd**ratio shrinks with depth
    b5 = make("rwkv5", layer_idx=0).bonus.detach().flatten()
    assert set((b5 * 10).round().tolist()) == {-1.0, 0.0, 1.0} and torch.allclose(b5 * 10, (b5 * 10).round())
    assert (_lora_rank(768, 2.5), _lora_rank(768, 5.0)) == (64, 128)  # the paper's 0.1B model
    r7 = make("rwkv7", d_model=64, head_dim=16, decay_lora_rank=None, a_lora_rank=None, gate_lora_rank=None)
    assert r7.w1.shape == (64, 32) and r7.a1.shape == (64, 32) and r7.g1.shape == (64, 32)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_backbone_keeps_special_inits(name):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, max_seq_len=64, mixer={"name": name, **MIXERS[name]})
    torch.manual_seed(0)
    model = LM(cfg)
    mixer = model.blocks[1].mixer
    fresh = build_mixer(cfg.mixer, 32, layer_idx=1, max_seq_len=64)
    for n, p in fresh.named_parameters():
        if getattr(p, "_no_reinit", False) and not n.endswith("_proj.weight") and "lora_b" not in n and n not in ("w2", "a2", "g2"):
            assert torch.equal(p, dict(mixer.named_parameters())[n]), f"{n} was re-initialised"
    assert cfg.mlp.name == "rwkv_cmix"


# ---- channel mixing -------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [5, 6, 7])
def test_channel_mix_decode_and_state(version):
    cfg = parse_mlp_config({"name": "rwkv_cmix", "version": version})
    torch.manual_seed(0)
    ffn = mlp_class("rwkv_cmix")(32, cfg, layer_idx=2)
    with torch.no_grad():
        for p in ffn.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 21, 32)
    y_full, none = ffn(x)
    assert none is None and y_full.shape == x.shape
    state = ffn.init_state(2)
    y_pre, state = ffn(x[:, :8], state)
    outs = [y_pre]
    for t in range(8, 21):
        old = state["shift"].clone()
        y_t, new = ffn(x[:, t : t + 1], state)
        assert torch.equal(old, state["shift"]), "state mutated in place"
        outs.append(y_t)
        state = new
    assert rel(torch.cat(outs, 1), y_full) < 1e-6
    assert state_bytes(state) == ffn.state_size(21) == 32 * 4
    hidden = ffn.up.out_features
    assert hidden == (128 if version == 7 else 112)
    assert (ffn.receptance is None) == (version == 7)


def test_channel_mix_is_causal_and_shifts_one_token():
    ffn = mlp_class("rwkv_cmix")(32, parse_mlp_config({"name": "rwkv_cmix"}))
    x = torch.randn(1, 10, 32)
    x2 = x.clone()
    x2[:, 4] += 1
    y, _ = ffn(x)
    y2, _ = ffn(x2)
    changed = (y - y2).abs().amax(-1)[0] > 0
    assert changed.tolist() == [False] * 4 + [True, True] + [False] * 4
    prev, last = token_shift(x, None)
    assert torch.equal(prev[:, 0], torch.zeros(1, 32)) and torch.equal(prev[:, 1:], x[:, :-1]) and torch.equal(last, x[:, -1])


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_lm_prefill_then_decode_equals_forward(name):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, max_seq_len=64, mixer={"name": name, **MIXERS[name]})
    torch.manual_seed(0)
    model = LM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    idx = torch.randint(0, 64, (2, 19), generator=torch.Generator().manual_seed(1))
    logits, _ = model(idx)
    state = model.init_state(2)
    out, state = model(idx[:, :7], state)
    outs = [out]
    for t in range(7, 19):
        out, state = model(idx[:, t : t + 1], state)
        outs.append(out)
    assert rel(torch.cat(outs, 1), logits) < 1e-4
    assert model.state_size(19) == sum(state_bytes(m) + state_bytes(f) for m, f in state["layers"])
