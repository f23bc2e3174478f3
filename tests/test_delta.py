"""DeltaNet, Gated DeltaNet and Based beyond the contract test: the ops against the independent
pure-PyTorch references of flash-linear-attention (loaded file by file, never the Triton package),
the feature map, the block-local window attention, state passing and the paper defaults."""

from __future__ import annotations


import pytest
import torch

from basecap.config_base import ConfigError
from basecap.mixers import build_mixer, parse_mixer_config
from basecap.mixers.based import taylor_attn_recurrent, window_attention_blocked, window_attention_dense
from basecap.ops.delta_rule import delta_rule_chunked, delta_rule_recurrent, l2_normalize
from basecap.ops.linear_attn import taylor_features, taylor_kernel, taylor_linear_attn_chunked

from fla_oracle import fla_naive
from mixer_contract import rel_err as rel



def delta_inputs(B=2, H=3, T=37, K=8, V=12, seed=0, gated=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, K, generator=g)
    k = l2_normalize(torch.randn(B, H, T, K, generator=g))
    v = torch.randn(B, H, T, V, generator=g)
    beta = torch.rand(B, H, T, generator=g)
    logd = -torch.rand(B, H, T, generator=g) * 1.5 if gated else None
    S0 = torch.randn(B, H, K, V, generator=g)
    return q, k, v, beta, logd, S0


@pytest.mark.parametrize("chunk", [1, 16, 64])
def test_delta_rule_matches_fla(chunk):
    naive = fla_naive("delta_rule/naive.py")
    q, k, v, beta, _, S0 = delta_inputs()
    leaves = [t.clone().requires_grad_() for t in (q, k, v, beta)]
    o_ref, S_ref = naive.delta_rule_recurrence(*leaves, initial_state=S0)
    go = torch.randn_like(o_ref)
    g_ref = torch.autograd.grad((o_ref * go).sum() + S_ref.sum(), leaves)
    for fn in (delta_rule_recurrent, lambda *a, **kw: delta_rule_chunked(*a, **kw, chunk_size=chunk)):
        mine = [t.clone().requires_grad_() for t in (q, k, v, beta)]
        o, S = fn(*mine, state=S0)
        assert rel(o, o_ref) < 1e-5 and rel(S, S_ref) < 1e-5
        for a, b in zip(torch.autograd.grad((o * go).sum() + S.sum(), mine), g_ref):
            assert rel(a, b) < 1e-4


@pytest.mark.parametrize("chunk", [1, 16, 64])
def test_gated_delta_rule_matches_fla(chunk):
    naive = fla_naive("gated_delta_rule/naive.py")
    q, k, v, beta, logd, S0 = delta_inputs(gated=True, seed=1)
    bthd = lambda t: t.transpose(1, 2)  # noqa: E731  fla takes [B, T, H, D]
    o_ref, S_ref = naive.naive_recurrent_gated_delta_rule(
        bthd(q), bthd(k), bthd(v), bthd(beta), bthd(logd), scale=0.3, initial_state=S0.clone(), output_final_state=True)
    o_ck, _ = naive.naive_chunk_gated_delta_rule(bthd(q), bthd(k), bthd(v), bthd(logd), bthd(beta), chunk_size=16, scale=0.3)
    for fn in (delta_rule_recurrent, lambda *a, **kw: delta_rule_chunked(*a, **kw, chunk_size=chunk)):
        o, S = fn(q, k, v, beta, logd, scale=0.3, state=S0)
        assert rel(bthd(o), o_ref) < 1e-5 and rel(S, S_ref) < 1e-5
        o0, _ = fn(q, k, v, beta, logd, scale=0.3)
        assert rel(bthd(o0), o_ck) < 1e-5


def test_based_linear_attention_matches_fla():
    naive = fla_naive("based/naive.py")
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 3, 50, 16, generator=g), torch.randn(2, 3, 50, 16, generator=g)
    v = torch.randn(2, 3, 50, 8, generator=g)
    o_ref = naive.naive_parallel_based(q, k, v, use_norm=True)  # (1 + s + s^2/2)-weighted average, s = q.k/4
    o_rec, _, _ = taylor_attn_recurrent(q, k, v)
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    o_ch, _ = taylor_linear_attn_chunked(q, k, v1, chunk_size=16)
    assert rel(o_rec, o_ref) < 1e-5
    assert rel(o_ch[..., :8] / o_ch[..., 8:], o_ref) < 1e-5


@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_taylor_linear_attention_matches_fla_recurrent(chunk):
    """Unnormalised, with an initial state, gradients included: fla's plain linear-attention
    recurrence on explicit Taylor features is the oracle for the feature-free chunked form."""
    naive = fla_naive("linear_attn/naive.py")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 41, d, generator=g) for d in (4, 4, 5))
    S0 = torch.randn(2, 2, 1 + 4 + 16, 5, generator=g)
    go = torch.randn(2, 2, 41, 5, generator=g)
    bthd = lambda t: t.transpose(1, 2)  # noqa: E731  fla takes [B, T, H, D]

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, S0)]
        o, S = fn(*leaves)
        grads = torch.autograd.grad((o * go).sum() + (S * S).sum(), leaves)
        return o, S, grads

    def ref(q, k, v, S0):
        o, S = naive.naive_recurrent_linear_attn(bthd(taylor_features(q)), bthd(taylor_features(k)), bthd(v), scale=1.0,
                                                 initial_state=S0, output_final_state=True)
        return bthd(o), S

    o_ref, S_ref, g_ref = run(ref)
    o, S, grads = run(lambda q, k, v, S0: taylor_linear_attn_chunked(q, k, v, chunk_size=chunk, state=S0))
    assert rel(o, o_ref) < 1e-5 and rel(S, S_ref) < 1e-5
    for a, b in zip(grads, g_ref):
        assert rel(a, b) < 1e-5


def test_taylor_features_inner_product():
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(5, 16, generator=g), torch.randn(7, 16, generator=g)
    s = q @ k.T / 4.0
    assert taylor_features(q).shape[-1] == 1 + 16 + 16 * 16
    assert rel(taylor_features(q) @ taylor_features(k).T, 1 + s + s * s / 2) < 1e-6
    assert rel(taylor_kernel(q, k), 1 + s + s * s / 2) < 1e-6


@pytest.mark.parametrize("T,P", [(1, 0), (10, 0), (23, 3), (23, 6), (1, 6)])
def test_window_blocked_matches_dense(T, P):
    g = torch.Generator().manual_seed(5)
    W = 7
    q, k, v = (torch.randn(2, 2, T, 4, generator=g) for _ in range(3))
    kp, vp = (torch.randn(2, 2, P, 4, generator=g) for _ in range(2)) if P else (None, None)
    assert rel(window_attention_blocked(q, k, v, W, kp, vp), window_attention_dense(q, k, v, W, kp, vp)) < 1e-5


@pytest.mark.parametrize("gated", [False, True])
def test_chunked_state_passing(gated):
    q, k, v, beta, logd, _ = delta_inputs(T=50, gated=gated, seed=6)
    o_full, S_full = delta_rule_chunked(q, k, v, beta, logd, chunk_size=16)
    o1, S1 = delta_rule_chunked(q[:, :, :21], k[:, :, :21], v[:, :, :21], beta[:, :, :21],
                                None if logd is None else logd[:, :, :21], chunk_size=16)
    o2, S2 = delta_rule_chunked(q[:, :, 21:], k[:, :, 21:], v[:, :, 21:], beta[:, :, 21:],
                                None if logd is None else logd[:, :, 21:], chunk_size=16, state=S1)
    assert rel(torch.cat([o1, o2], dim=2), o_full) < 1e-5 and rel(S2, S_full) < 1e-5


def test_strong_decay_stays_finite():
    q, k, v, beta, _, S0 = delta_inputs(T=100, seed=7)
    logd = -torch.rand(q.shape[:3]) * 40  # decays down to exp(-40) per step: whole-chunk products underflow
    o_ref, S_ref = delta_rule_recurrent(q, k, v, beta, logd, state=S0)
    o, S = delta_rule_chunked(q, k, v, beta, logd, state=S0, chunk_size=64)
    assert rel(o, o_ref) < 1e-5 and rel(S, S_ref) < 1e-4


def test_defaults_follow_papers():
    gdn = build_mixer(parse_mixer_config({"name": "gated_deltanet"}), 2048)
    assert (gdn.n_heads, gdn.head_k, gdn.head_v) == (6, 256, 512)  # Gated DeltaNet 1.3B setting
    n_params = sum(p.numel() for p in gdn.parameters() if p.dim() == 2)
    assert abs(n_params / 2048**2 - 6.0) < 0.01  # ~6 d^2 per layer, as in the paper
    dn = build_mixer(parse_mixer_config({"name": "deltanet"}), 192)
    assert (dn.n_heads, dn.head_dim) == (3, 64)
    based = build_mixer(parse_mixer_config({"name": "based"}), 1024)
    assert (based.n_heads, based.feature_dim, based.value_dim, based.n_features) == (16, 16, 64, 273)
    assert based.cfg.window == 64 and based.w_heads == 16


def test_configs_are_strict():
    for name in ("deltanet", "gated_deltanet", "based"):
        with pytest.raises(ConfigError, match="unknown key"):
            parse_mixer_config({"name": name, "hedd_dim": 3})
    with pytest.raises(ConfigError, match="branches"):
        parse_mixer_config({"name": "based", "branches": "alternate"})
    with pytest.raises(ConfigError, match="head_dim"):
        parse_mixer_config({"name": "based", "head_dim": 7})
    with pytest.raises(ValueError, match="divisible"):
        build_mixer(parse_mixer_config({"name": "based", "n_heads": 5}), 32)


def test_based_single_key_gives_its_value():
    """With one visible key the normalised linear attention returns exactly that key's value."""
    m = build_mixer(parse_mixer_config({"name": "based", "n_heads": 4, "feature_dim": 4, "branches": "linear", "impl": "ref"}), 32)
    x = torch.randn(2, 1, 32)
    v = m.v_proj(x)
    assert torch.allclose(m(x)[0], m.o_proj(v), atol=1e-6)
