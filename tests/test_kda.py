"""Kimi Delta Attention beyond the contract test: the step-by-step and chunked forms against the independent
pure-PyTorch references of flash-linear-attention (``fla/ops/kda/naive.py``, loaded file by file, never the
Triton package), the reduction to the gated delta rule, strong decays, the fla adapter's mapping, the paper
defaults and strict configs."""

from __future__ import annotations

import inspect

import pytest
import torch

from basecap.config_base import ConfigError
from basecap.kernels import fla as fk
from basecap.mixers import build_mixer, parse_mixer_config
from basecap.mixers.kda import decayed_scores, kda_chunked, kda_recurrent, sub_block
from basecap.ops.delta_rule import delta_rule_chunked, l2_normalize

from fla_oracle import fla_naive
from fla_standins import _real_signature, chunk_kda
from mixer_contract import rel_err as rel


def kda_inputs(B=2, H=3, T=37, K=8, V=6, seed=0, decay=2.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, K, generator=g)
    k = l2_normalize(torch.randn(B, H, T, K, generator=g))
    v = torch.randn(B, H, T, V, generator=g)
    beta = torch.rand(B, H, T, generator=g)
    logd = -torch.rand(B, H, T, K, generator=g) * decay  # per-channel log decay <= 0
    S0 = torch.randn(B, H, K, V, generator=g)
    return q, k, v, beta, logd, S0


def bthd(t):
    return t.transpose(1, 2)  # fla takes [B, T, H, ...]


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_kda_matches_fla_recurrent(chunk):
    """Outputs, final state and the gradients of q, k, v, beta, g and the initial state, with a scale."""
    naive = fla_naive("kda/naive.py")
    tensors = kda_inputs()
    leaves = [t.clone().requires_grad_() for t in tensors]
    q, k, v, beta, g, S0 = leaves
    o_ref, S_ref = naive.naive_recurrent_kda(bthd(q), bthd(k), bthd(v), bthd(g), bthd(beta), scale=0.3, initial_state=S0, output_final_state=True)
    gen = torch.Generator().manual_seed(9)
    go, gS = torch.randn(o_ref.shape, generator=gen), torch.randn(S_ref.shape, generator=gen)
    g_ref = torch.autograd.grad((o_ref * go).sum() + (S_ref * gS).sum(), leaves)
    for fn in (kda_recurrent, lambda *a, **kw: kda_chunked(*a, **kw, chunk_size=chunk)):
        mine = [t.clone().requires_grad_() for t in tensors]
        o, S = fn(*mine[:5], scale=0.3, state=mine[5])
        assert rel(bthd(o), o_ref) < 1e-5 and rel(S, S_ref) < 1e-5
        for name, a, b in zip("q k v beta g S0".split(), torch.autograd.grad((bthd(o) * go).sum() + (S * gS).sum(), mine), g_ref):
            assert rel(a, b) < 1e-4, name


def test_chunked_matches_fla_chunk_reference():
    """fla's own chunked reference (its WY form, chunk 16) as a second oracle, with and without a state."""
    naive = fla_naive("kda/naive.py")
    q, k, v, beta, g, S0 = kda_inputs(T=48, seed=1)
    for state in (None, S0):
        o_ref, S_ref = naive.naive_chunk_kda(
            bthd(q), bthd(k), bthd(v), bthd(g), bthd(beta), initial_state=state, output_final_state=True, chunk_size=16
        )
        o, S = kda_chunked(q, k, v, beta, g, state=state, chunk_size=32)
        assert rel(bthd(o), o_ref) < 1e-5 and rel(S, S_ref) < 1e-5


def test_decayed_scores_equal_the_pairwise_sum():
    """The sub-block references give exactly sum_d a_t b_s exp(G_t - G_s) for s <= t, at chunk lengths that are
    and are not multiples of the sub-block; the sub-block is the power of two nearest below sqrt(C)."""
    gen = torch.Generator().manual_seed(3)
    for C, sub in ((5, 2), (16, 4), (37, 8), (64, 8), (64, 64)):
        a = torch.randn(2, C, 7, 3, generator=gen, dtype=torch.float64)  # three left operands
        b = torch.randn(2, C, 7, generator=gen, dtype=torch.float64)
        G = (-torch.rand(2, C, 7, generator=gen, dtype=torch.float64) * 3).cumsum(1)
        full = torch.einsum("ntkr,nsk,ntsk->ntsr", a, b, (G[:, :, None, :] - G[:, None, :, :]).exp())
        want = full * torch.ones(C, C, dtype=torch.bool).tril()[..., None]
        assert (decayed_scores(a, b, G, sub) - want).abs().max() < 1e-12 * full.abs().max()
    assert [sub_block(C) for C in (1, 4, 15, 16, 32, 63, 64)] == [1, 2, 2, 4, 4, 4, 8]


def test_a_gate_shared_by_the_channels_is_the_gated_delta_rule():
    q, k, v, beta, g, S0 = kda_inputs(seed=2)
    g_head = g[..., 0]  # [B, H, T]
    o, S = kda_chunked(q, k, v, beta, g_head[..., None].expand_as(g), state=S0, chunk_size=16)
    o_gd, S_gd = delta_rule_chunked(q, k, v, beta, g_head, state=S0, chunk_size=16)
    assert rel(o, o_gd) < 1e-5 and rel(S, S_gd) < 1e-5


def test_strong_decay_stays_finite():
    """Log decays down to -40 per step (a chunk's cumulative decay far below exp's range): every exponent the
    chunked form takes is <= 0, so it stays finite, gradients included, and equals the recurrence."""
    q, k, v, beta, g, S0 = kda_inputs(T=70, seed=4, decay=40.0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, beta, g)]
    o, S = kda_chunked(*leaves, state=S0, chunk_size=64)
    o_ref, S_ref = kda_recurrent(q, k, v, beta, g, state=S0)
    assert rel(o, o_ref) < 1e-5 and rel(S, S_ref) < 1e-5
    grads = torch.autograd.grad(o.sum() + S.sum(), leaves)
    assert all(torch.isfinite(t).all() for t in grads)


@pytest.mark.parametrize("with_state", [False, True])
def test_fla_adapter_maps_onto_chunk_kda(monkeypatch, with_state):
    """``kernels.fla.kda`` with the chunk_kda stand-in (fla's naive recurrence) equals our oracle: exactly in fp32,
    within bf16 rounding with the adapter's own 16-bit q/k/v; the state comes back only when one went in."""
    naive = fla_naive("kda/naive.py")  # skips without fla
    assert naive is not None
    q, k, v, beta, g, S0 = kda_inputs(seed=5)
    state = S0 if with_state else None
    o_ref, S_ref = kda_recurrent(q, k, v, beta, g, state=state)
    o16, S16 = fk.kda(q, k, v, beta, g, state=state, op=chunk_kda)
    compute_dtype = fk.compute_dtype
    monkeypatch.setattr(fk, "compute_dtype", lambda x, fp32_ok=True: compute_dtype(x))
    o32, S32 = fk.kda(q, k, v, beta, g, state=state, op=chunk_kda)
    assert o16.dtype == o32.dtype == torch.float32
    assert rel(o32, o_ref) < 1e-5 and rel(o16, o_ref) < 2e-2
    if with_state:
        assert S32.dtype == S16.dtype == torch.float32 and rel(S32, S_ref) < 1e-5 and rel(S16, S_ref) < 2e-2
    else:
        assert S32 is None and S16 is None


def test_adapter_passes_only_parameters_of_the_real_op():
    kw = fk.kda_inputs(*kda_inputs(seed=6))
    names = {n for n, kind, _ in _real_signature("kda/chunk.py", "chunk_kda") if kind != "var"}
    assert set(kw) <= names
    assert set(inspect.signature(chunk_kda).parameters) - {"kwargs"} == names
    with pytest.raises(ConfigError, match="kda.head_dim"):
        fk.kda_inputs(*kda_inputs(K=264, seed=6))


def test_paper_defaults_at_basecaps_size():
    m = build_mixer(parse_mixer_config({"name": "kda"}), 128)
    assert (m.n_heads, m.head_k, m.head_v) == (2, 64, 64)
    assert m.f_a_proj.out_features == m.g_a_proj.out_features == 64  # rank = the value head dim
    assert m.f_b_proj.out_features == 2 * 64 and m.g_b_proj.out_features == 2 * 64
    assert m.A_log.shape == (2,) and m.dt_bias.shape == (2 * 64,)
    A = m.A_log.exp()
    dt = torch.nn.functional.softplus(m.dt_bias)
    assert ((A >= 1) & (A <= 16)).all() and ((dt >= 1e-3 * 0.999) & (dt <= 0.1 * 1.001)).all()
    assert m.conv is not None and m.conv.kernel_size == 4 and m.cfg.chunk_size == 16
    assert all(mod.bias is None for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    assert m.state_size(1) == m.state_size(4096) == 4 * (2 * 64 * 64 + 3 * 2 * (2 * 64 + 64))


@pytest.mark.parametrize(
    "over,field",
    [
        ({"head_dim": 8, "expand_v": 1.3}, "expand_v"),
        ({"dt_min": 0.2}, "dt_min"),
        ({"A_init_range": (4.0, 2.0)}, "A_init_range"),
        ({"gate_rank": 0}, "gate_rank"),
        ({"head_size": 8}, "head_size"),
    ],
)
def test_bad_config_names_the_field(over, field):
    with pytest.raises(ConfigError, match=field):
        parse_mixer_config({"name": "kda", **over})


def test_fast_on_cpu_is_a_config_error_and_auto_is_chunked():
    m = build_mixer(parse_mixer_config({"name": "kda", "head_dim": 8, "impl": "fast"}), 16)
    with pytest.raises(ConfigError, match="kda.impl: impl='fast' needs CUDA"):
        m(torch.randn(1, 3, 16))
    torch.manual_seed(0)
    auto = build_mixer(parse_mixer_config({"name": "kda", "head_dim": 8}), 16)
    chunked = build_mixer(parse_mixer_config({"name": "kda", "head_dim": 8, "impl": "chunked"}), 16)
    chunked.load_state_dict(auto.state_dict())
    x = torch.randn(2, 21, 16)
    (y_a, _), (y_c, _) = auto(x), chunked(x)
    (d_a, s_a), (d_c, s_c) = auto(x, auto.init_state(2)), chunked(x, chunked.init_state(2))
    assert torch.equal(y_a, y_c) and torch.equal(d_a, d_c) and all(torch.equal(s_a[key], s_c[key]) for key in s_c)
