"""FoX (``forgetting_attn``) beyond the contract test: its two CPU forms against flash-linear-attention's own
pure-PyTorch reference (``fla/ops/forgetting_attn/naive.py``, an independent oracle), the fla adapter's
convention mapping, the decay's limiting cases, the Pro switch and the config's errors."""

from __future__ import annotations

import ast
import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from basecap.config_base import ConfigError
from basecap.kernels import fla as fk
from basecap.mixers import build_mixer, parse_mixer_config
from basecap.mixers.forgetting_attn import PRUNE_LOG_TOL, forgetting_attn_masked, forgetting_attn_recurrent

from fla_oracle import fla_naive

B, H, D = 2, 3, 8
SCALE = D**-0.5


def rel(a, b) -> float:
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def inputs(T: int, seed: int = 0, strong: bool = False):
    """q, k, v ``[B, H, T, D]`` and log forget gates ``[B, H, T]`` (mostly mild, some strong forgetting)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    log_f = F.logsigmoid(torch.randn(B, H, T, generator=g) * 2 + (0 if strong else 2))
    return [t.requires_grad_() for t in (q, k, v, log_f)]


def empty_cache(T: int = 0):
    return torch.zeros(B, H, T, D), torch.zeros(B, H, T, D), torch.zeros(B, H, T)


def naive(q, k, v, log_f):
    """fla's reference: time-major ``[B, T, H, *]``, per-step log gates ``g [B, T, H]``; back to ``[B, H, T, D]``."""
    ref = fla_naive("forgetting_attn/naive.py").naive_forgetting_attn
    tm = [t.transpose(1, 2) for t in (q, k, v, log_f)]
    return ref(*tm, scale=SCALE).transpose(1, 2)


def grads(out, ins, seed=1):
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out.float() * w).sum(), ins)


def check_against(out, ins, out_ref, ins_ref, tol=1e-5):
    assert rel(out, out_ref) < tol
    for i, (a, b) in enumerate(zip(grads(out, ins), grads(out_ref, ins_ref))):
        assert rel(a, b) < tol, f"gradient of input {i} (q, k, v, log_f): rel err {rel(a, b):.1e}"


# ---- our two CPU forms against fla's reference ----------------------------------------------------


@pytest.mark.parametrize("T,strong", [(1, False), (13, False), (13, True)])
def test_recurrent_oracle_matches_fla_reference(T, strong):
    ins = inputs(T, strong=strong)
    mine = [t.detach().clone().requires_grad_() for t in ins]
    o, _ = forgetting_attn_recurrent(*mine, empty_cache(), SCALE)
    check_against(o, mine, naive(*ins), ins)


@pytest.mark.parametrize("T,strong", [(1, False), (13, False), (13, True)])
def test_masked_form_matches_fla_reference(T, strong):
    ins = inputs(T, strong=strong)
    mine = [t.detach().clone().requires_grad_() for t in ins]
    o, cache = forgetting_attn_masked(*mine, None, SCALE)
    assert cache is None
    check_against(o, mine, naive(*ins), ins)


@pytest.mark.parametrize("form", [forgetting_attn_recurrent, forgetting_attn_masked])
def test_a_cached_prefix_then_the_rest_matches_fla_reference_over_the_whole(form):
    """The cache (k, v and each key's log forget since it) carries exactly what the later tokens need: the
    prefix through the oracle, the rest through ``form`` from that cache, against fla's reference over all."""
    q, k, v, log_f = (t.detach() for t in inputs(11, seed=3))
    _, cache = forgetting_attn_recurrent(q[:, :, :6], k[:, :, :6], v[:, :, :6], log_f[:, :, :6], empty_cache(), SCALE)
    o, new = form(q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], log_f[:, :, 6:], cache, SCALE)
    assert rel(o, naive(q, k, v, log_f)[:, :, 6:]) < 1e-5
    # log_forget of key j after token 10: the sum of log f over j+1 .. 10
    want = torch.stack([log_f[..., j + 1 :].sum(-1) for j in range(11)], dim=-1)
    assert rel(new[2], want) < 1e-6 and torch.equal(new[0], k) and torch.equal(new[1], v)


def test_the_masked_form_drops_only_negligible_keys():
    """Fast forgetting (log f about -2 a step over 64 steps): many keys lie below the masked form's floor, and
    dropping them leaves outputs and gradients as fla's reference computes them with every key."""
    q, k, v, _ = (t.detach() for t in inputs(64, seed=4))
    log_f = torch.full((B, H, 64), -2.0) + 0.1 * torch.randn(B, H, 64, generator=torch.Generator().manual_seed(5))
    c = log_f.cumsum(-1)
    U = SCALE * q.norm(dim=-1) * k.norm(dim=-1).amax(-1, keepdim=True)
    floor = -(2 * U + math.log(64) + PRUNE_LOG_TOL)
    below = ((c[..., :, None] - c[..., None, :]) < floor[..., None]).tril()
    assert below.sum() / (B * H * 64 * 65 / 2) > 0.25  # a quarter of the visible keys lie below the floor
    ins = [t.requires_grad_() for t in (q, k, v, log_f)]
    mine = [t.detach().clone().requires_grad_() for t in ins]
    o, _ = forgetting_attn_masked(*mine, None, SCALE)
    check_against(o, mine, naive(*ins), ins, tol=1e-5)


# ---- the decay's limits: independent of either form ----------------------------------------------


def test_gates_of_one_give_plain_causal_attention_and_gates_near_zero_attend_to_self():
    q, k, v, _ = (t.detach() for t in inputs(9))
    for form in (forgetting_attn_recurrent, lambda *a: forgetting_attn_masked(*a[:4], None, a[5])):
        o, _ = form(q, k, v, torch.zeros(B, H, 9), empty_cache(), SCALE)
        assert rel(o, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE)) < 1e-6
        o, _ = form(q, k, v, torch.full((B, H, 9), -80.0), empty_cache(), SCALE)
        assert rel(o, v) < 1e-6


# ---- the fla adapter: its mapping, with fla's reference in place of the kernel ------------------------


def reference_op(q, k, v, g, scale=None, window_size=None, cu_seqlens=None):
    """fla's reference behind ``parallel_forgetting_attn``'s signature (time-major in and out)."""
    assert window_size is None and cu_seqlens is None
    return fla_naive("forgetting_attn/naive.py").naive_forgetting_attn(q, k, v, g, scale=scale).to(q.dtype)


def test_adapter_matches_our_oracle():
    ins = inputs(13, seed=5)
    mine = [t.detach().clone().requires_grad_() for t in ins]
    o = fk.forgetting_attn(*mine, SCALE, op=reference_op)
    o_ref, _ = forgetting_attn_recurrent(*ins, empty_cache(), SCALE)
    check_against(o, mine, o_ref, ins)


def test_adapter_passes_only_parameters_of_the_fla_op():
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed")
    src = Path(list(spec.submodule_search_locations)[0]) / "ops" / "forgetting_attn" / "parallel.py"
    fn = next(n for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.FunctionDef) and n.name == "parallel_forgetting_attn")
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    q, k, v, log_f = (t.detach() for t in inputs(2))
    assert set(fk.forgetting_attn_inputs(q, k, v, log_f, SCALE)) <= names


def test_adapter_refuses_head_dims_the_kernel_lacks():
    q = torch.zeros(1, 1, 2, fk.FOX_MAX_HEAD_DIM + 1)
    with pytest.raises(ConfigError, match="forgetting_attn.head_dim"):
        fk.forgetting_attn_inputs(q, q, q, torch.zeros(1, 1, 2), 1.0)


# ---- the mixer: impl selection on CPU, the Pro switch, init, config errors ------------------------------


def mixer(**cfg):
    torch.manual_seed(0)
    return build_mixer(parse_mixer_config({"name": "forgetting_attn", "head_dim": 8, **cfg}), 32)


def test_fast_on_cpu_is_a_clear_error_and_auto_is_the_chunked_form():
    with pytest.raises(ConfigError, match=re.escape("impl='fast' needs CUDA and flash-linear-attention; use 'chunked' on CPU")):
        mixer(impl="fast")(torch.randn(1, 5, 32))
    auto, chunked = mixer(impl="auto"), mixer(impl="chunked")
    x = torch.randn(2, 9, 32)
    assert torch.equal(auto(x)[0], chunked(x)[0])
    s_a, s_c = auto.init_state(2), chunked.init_state(2)
    for part in (x[:, :6], x[:, 6:7], x[:, 7:]):
        (y_a, s_a), (y_c, s_c) = auto(part, s_a), chunked(part, s_c)
        assert torch.equal(y_a, y_c)


def test_forget_gate_starts_with_zero_bias_and_the_pro_switch_adds_its_parts():
    plain, pro = mixer(), mixer(qk_norm_output_gate=True)
    assert torch.equal(plain.f_bias, torch.zeros(4)) and plain.f_proj.out_features == 4 and plain.f_proj.bias is None
    extra = {n for n, _ in pro.named_parameters()} - {n for n, _ in plain.named_parameters()}
    assert extra == {"q_norm_weight", "k_norm_weight", "g_proj.weight"}
    assert pro.q_norm_weight.dim() == 1  # not weight-decayed


def test_qk_norm_makes_the_output_independent_of_the_query_and_key_scale():
    m = mixer(qk_norm_output_gate=True, position="rope")
    x = torch.randn(2, 7, 32)
    y, _ = m(x)
    with torch.no_grad():
        m.q_proj.weight.mul_(3.0)
        m.k_proj.weight.mul_(0.5)
    assert rel(m(x)[0], y) < 1e-5


def test_state_size_grows_with_the_cache():
    m = mixer()
    assert m.state_size(10) == 10 * m.state_size(1) == 10 * 4 * (2 * 8 + 1) * 4


@pytest.mark.parametrize(
    "bad,field", [({"position": "alibi"}, "position"), ({"head_dim": 0}, "head_dim"), ({"rope_theta": -1.0}, "rope_theta"), ({"window": 4}, "window")]
)
def test_bad_config_names_the_field(bad, field):
    with pytest.raises(ConfigError, match=field):
        parse_mixer_config({"name": "forgetting_attn", **bad})
