"""Log-linear Mamba-2 (``mixers/log_linear_mamba2.py``) beyond the contract tests.

Independent oracle: fla's own pure-PyTorch reference (``fla/ops/log_linear_attn/naive.py``, the masked form
o = (Q K^T * M_decay * M_H) V with the level masks built its own way), against our step-by-step recurrence
(``ref``) and our chunked form, same inputs in fp64: the level of every (t, s) pair, outputs and the gradient
of every input, from position 0 and from a state. Then what follows from the equations: unit level weights
give Mamba-2 exactly (op and mixer), the level states partition Mamba-2's state and grow as log2 T, levels
past ``n_levels`` weigh 0. Then the fla adapter (``kernels/fla.py``) against fla's reference and its checks,
the parameterisation and config errors, and (``-m gpu``) the real kernel against the chunked form.
"""

from __future__ import annotations

import pytest
import torch

from basecap.config_base import ConfigError
from basecap.kernels import fla as fk
from basecap.mixers import build_mixer, parse_mixer_config
from basecap.mixers.log_linear_mamba2 import levels, log_linear_chunked, log_linear_ref
from basecap.model import LM, ModelConfig
from basecap.ops.ssm import ssd_ref

from fla_oracle import fla_naive
from fla_standins import _real_signature, chunk_log_linear_attn

D = 32


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def problem(B=2, T=37, H=3, P=4, N=5, L=7, seed=0, dtype=torch.float64):
    """Random op inputs X, log_a, Bm, Cm, lam (decays in (e^-1, 1], weights in (0, 2))."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, T, H, P, generator=g, dtype=dtype)
    log_a = -torch.rand(B, T, H, generator=g, dtype=dtype)
    Bm, Cm = torch.randn(B, T, N, generator=g, dtype=dtype), torch.randn(B, T, N, generator=g, dtype=dtype)
    lam = 2 * torch.rand(B, T, H, L, generator=g, dtype=dtype)
    return [X, log_a, Bm, Cm, lam]


def leaves(ts):
    return [t.clone().requires_grad_() for t in ts]


def fla_reference(X, log_a, Bm, Cm, lam):
    """fla's naive log-linear attention with Mamba-2's mapping (q = C, k = B as one shared group, v = X, g = log a);
    lam zero-padded to the levels it indexes (0 .. ceil(log2 T)), as levels past our weights weigh 0."""
    T = X.shape[1]
    lam = torch.nn.functional.pad(lam, (0, max(0, (T - 1).bit_length() + 1 - lam.shape[-1])))
    return fla_naive("log_linear_attn/naive.py").naive_log_linear_attn(Cm[:, :, None], Bm[:, :, None], X, log_a, lam, scale=1.0)


def grads(out, ins, seed=1):
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * w).sum(), ins, allow_unused=True)


# ---- the levels -----------------------------------------------------------------------------------------


def test_levels_are_the_fenwick_levels_of_fla():
    """Our level of each pair, bit_length(t XOR s), is the level fla's reference builds from its own masks."""
    naive = fla_naive("log_linear_attn/naive.py")
    T = 37
    p = torch.arange(T)
    ours = levels(p[:, None], p[None, :])
    ones = torch.ones(8, T)
    for level in range(7):
        theirs = naive.construct_level_mask(level, ones) != 0
        assert torch.equal(theirs, (ours == level) & (p[:, None] >= p[None, :])), level
    # position 5 = 0b101: itself at level 0, token 4 at level 1 (bit 0), tokens 0-3 at level 3 (bit 2)
    assert levels(torch.tensor(5), torch.arange(6)).tolist() == [3, 3, 3, 3, 1, 0]


# ---- the ops against fla's reference ----------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["ref", "chunked"])
@pytest.mark.parametrize("L", [7, 3])
def test_ops_match_fla_reference(impl, L):
    """From position 0, with weights for every level (7 at T = 37) or for levels 0-2 only: outputs and the
    gradients of X, log a, B, C and lambda."""
    inputs = problem(L=L)
    ours, theirs = leaves(inputs), leaves(inputs)
    y = log_linear_ref(*ours)[0] if impl == "ref" else log_linear_chunked(*ours, chunk_size=8, final_state=False)[0]
    y_ref = fla_reference(*theirs)
    assert rel(y, y_ref) < 1e-12
    for i, (a, b) in enumerate(zip(grads(y, ours), grads(y_ref, theirs))):
        assert rel(a, b) < 1e-12, f"gradient of input {i}"


@pytest.mark.parametrize("impl", ["ref", "chunked"])
def test_continuing_from_a_state_matches_fla_reference(impl):
    """Prefill 11 tokens (ref), then the other 26 from that state at absolute positions 11..36: outputs and the
    input gradients equal fla's reference over the whole sequence, read at those positions."""
    inputs = problem()
    _, S = log_linear_ref(*(t[:, :11] for t in inputs))
    assert S.shape[1] == (11).bit_length()
    ours, theirs = leaves([t[:, 11:] for t in inputs]), leaves(inputs)
    if impl == "ref":
        y, _ = log_linear_ref(*ours, S, 11)
    else:
        y, _ = log_linear_chunked(*ours, S, 11, chunk_size=5)
    y_ref = fla_reference(*theirs)[:, 11:]
    assert rel(y, y_ref) < 1e-12
    for i, (a, b) in enumerate(zip(grads(y, ours), grads(y_ref, theirs))):
        assert rel(a, b[:, 11:]) < 1e-12, f"gradient of input {i}"


@pytest.mark.parametrize("pos", [0, 3, 21])
def test_chunked_equals_ref_for_any_chunk_and_position(pos):
    """Outputs, the new level states and the gradients of every input and of the incoming states."""
    inputs = problem(T=23)
    S0 = log_linear_ref(*problem(T=pos, seed=2))[1] if pos else None
    y_ref, S_ref = log_linear_ref(*inputs, S0, pos)
    for chunk in (1, 3, 8, 64) if pos == 3 else (3, 64):
        ins = leaves(inputs + ([S0] if S0 is not None else []))
        ins_ref = leaves(inputs + ([S0] if S0 is not None else []))
        y, S = log_linear_chunked(*ins[:5], ins[5] if pos else None, pos, chunk_size=chunk)
        y_r, S_r = log_linear_ref(*ins_ref[:5], ins_ref[5] if pos else None, pos)
        assert S is not None and S.shape == S_ref.shape == (2, (pos + 23).bit_length(), 3, 4, 5)
        assert rel(y, y_ref) < 1e-12 and rel(S, S_ref) < 1e-12
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)
        g = torch.autograd.grad((y * w).sum() + (S * S_ref).sum(), ins)
        g_ref = torch.autograd.grad((y_r * w).sum() + (S_r * S_ref).sum(), ins_ref)
        for a, b in zip(g, g_ref):
            assert rel(a, b) < 1e-12, chunk


# ---- what follows from the equations -------------------------------------------------------------------


def test_unit_weights_are_mamba2_and_the_levels_partition_its_state():
    """With every level weighted 1 the output is Mamba-2's; whatever the weights, the level states sum to
    Mamba-2's state, and after T tokens level l holds something exactly where bit l-1 of T is set."""
    X, log_a, Bm, Cm, lam = problem()
    y_m2, h_m2 = ssd_ref(X, log_a, Bm, Cm)
    ones = torch.ones_like(lam)
    assert rel(log_linear_ref(X, log_a, Bm, Cm, ones)[0], y_m2) < 1e-12
    assert rel(log_linear_chunked(X, log_a, Bm, Cm, ones, chunk_size=16)[0], y_m2) < 1e-12
    for T in (1, 8, 21, 37):
        _, S = log_linear_ref(X[:, :T], log_a[:, :T], Bm[:, :T], Cm[:, :T], lam[:, :T])
        _, h = ssd_ref(X[:, :T], log_a[:, :T], Bm[:, :T], Cm[:, :T])
        assert rel(S.sum(1), h) < 1e-12
        filled = [bool(S[:, i].abs().sum() > 0) for i in range(S.shape[1])]
        assert filled == [bool(T >> i & 1) for i in range(T.bit_length())], T


def test_level_weights_none_is_the_mamba2_mixer():
    """``level_weights = "none"``: the whole mixer equals Mamba-2 with the same weights, in training and decoding."""
    cfg = {"head_dim": 16, "d_state": 8}
    torch.manual_seed(0)
    ll = build_mixer(parse_mixer_config({"name": "log_linear_mamba2", "level_weights": "none", **cfg}), D)
    m2 = build_mixer(parse_mixer_config({"name": "mamba2", **cfg}), D)
    m2.load_state_dict({k.replace("o_proj", "out_proj"): v for k, v in ll.state_dict().items()})
    x = torch.randn(2, 21, D)
    assert rel(ll(x)[0], m2(x)[0]) < 1e-6
    s_ll, s_m2 = ll.init_state(2), m2.init_state(2)
    for part in (x[:, :13], x[:, 13:14], x[:, 14:]):
        (y_ll, s_ll), (y_m2, s_m2) = ll(part, s_ll), m2(part, s_m2)
        assert rel(y_ll, y_m2) < 1e-6
    assert rel(s_ll["levels"].sum(1), s_m2["ssm"]) < 1e-6


def test_the_decode_state_grows_as_log2_of_the_length():
    m = build_mixer(parse_mixer_config({"name": "log_linear_mamba2", "head_dim": 16, "d_state": 8}), D)
    per_level, conv = m.d_inner * m.d_state * 4, 3 * (m.d_inner + 2 * m.d_state) * 4
    assert [m.state_size(T) for T in (0, 1, 2, 3, 4, 255, 256, 2048)] == [conv + per_level * n for n in (0, 1, 2, 2, 3, 8, 9, 12)]
    state = m.init_state(1)
    for n in (1, 2, 4):  # 1, 3, 7 tokens: levels 1, 2, 3
        _, state = m(torch.randn(1, n, D), state)
        assert state["levels"].shape[1] == state["pos"].bit_length()


def test_flops_count_the_level_read_out():
    m = build_mixer(parse_mixer_config({"name": "log_linear_mamba2", "chunk_size": 64}), 128)
    E, N = m.d_inner, m.d_state
    at = {T: m.flops_per_token(T) for T in (64, 256, 4096)}
    assert at[64] < at[256] < at[4096]  # the chunks further on read more levels
    # one chunk at T = 64 reads no incoming level; at 256 the chunks start at 0, 64, 128, 192: 0, 7, 8, 8 levels
    assert at[256] - at[64] == pytest.approx(2 * (23 / 4) * (E * N + E))


# ---- parameterisation and config ------------------------------------------------------------------------


def test_level_scale_starts_at_one_and_is_not_decayed():
    """lambda = softplus(L * dl) with L = 1 at init (fla's layer): the backbone's init leaves L alone, and it is
    1-D, so the trainer does not decay it (fla's layer exempts it too)."""
    model = LM(ModelConfig(vocab_size=32, d_model=32, n_layers=2, max_seq_len=16, mixer={"name": "log_linear_mamba2", "head_dim": 16}))
    mixer = model.blocks[0].mixer
    assert mixer.level_scale.dim() == 1 and torch.equal(mixer.level_scale, torch.ones(mixer.n_heads * 15))
    assert mixer.in_proj.out_features == 2 * mixer.d_inner + 2 * 64 + mixer.n_heads * (1 + 15)
    none = LM(ModelConfig(vocab_size=32, d_model=32, n_layers=1, max_seq_len=16, mixer={"name": "log_linear_mamba2", "level_weights": "none"}))
    assert not hasattr(none.blocks[0].mixer, "level_scale")


@pytest.mark.parametrize("bad,field", [({"n_levels": 0}, "n_levels"), ({"level_weights": "static"}, "level_weights"), ({"levels": 3}, "levels")])
def test_bad_config_names_the_field(bad, field):
    with pytest.raises(ConfigError, match=field):
        parse_mixer_config({"name": "log_linear_mamba2", **bad})


# ---- the fla adapter ------------------------------------------------------------------------------------


def test_adapter_matches_fla_reference():
    """``kernels.fla.log_linear_attn`` with fla's reference behind the real op's checks (the stand-in) equals our
    chunked form, outputs and every input gradient (fp32), with every padding at work: d_state 5 -> 64, head_dim
    12 -> 16, 3 weighted levels -> 7 (T = 37; past 64 tokens, every level of the sequence)."""
    for T in (37, 70):
        inputs = problem(T=T, P=12, L=3, dtype=torch.float32)
        ours, theirs = leaves(inputs), leaves(inputs)
        y = fk.log_linear_attn(*ours, op=chunk_log_linear_attn)
        y_ref, _ = log_linear_chunked(*theirs, chunk_size=16, final_state=False)
        assert y.shape == y_ref.shape and rel(y, y_ref) < 1e-5
        for i, (a, b) in enumerate(zip(grads(y, ours), grads(y_ref, theirs))):
            assert rel(a, b) < 1e-5, f"T={T}: gradient of input {i}"


def test_adapter_arguments_are_the_ops():
    kw = fk.log_linear_attn_inputs(*problem(T=3, dtype=torch.float32))
    names = [p for p, *_ in _real_signature("log_linear_attn/chunk.py", "chunk_log_linear_attn")]
    assert set(kw) <= set(names) and kw["scale"] == 1.0 and kw["level_scales"].shape[-1] == 7
    assert kw["q"].shape == (2, 3, 1, 64) and kw["v"].shape == (2, 3, 3, 16)


def test_adapter_refuses_lengths_the_kernel_lacks():
    X = torch.zeros(1, fk.LOG_LINEAR_MAX_LEN, 1, 1)
    with pytest.raises(ConfigError, match="log_linear_mamba2.impl"):
        fk.log_linear_attn_inputs(X, X[..., 0], X[:, :, 0], X[:, :, 0], X)


def test_fast_on_cpu_is_a_clear_error():
    m = build_mixer(parse_mixer_config({"name": "log_linear_mamba2", "impl": "fast"}), D)
    with pytest.raises(ConfigError, match="impl='fast' needs CUDA"):
        m(torch.randn(1, 5, D))


# ---- GPU: fla's kernel against the chunked form ---------------------------------------------------------

GPU_CFG = {"name": "log_linear_mamba2", "head_dim": 64, "d_state": 64}


def _gpu_pair():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    err = fk.fla_import_error()
    if err is not None:
        pytest.fail(f"CUDA is available but flash-linear-attention does not import: {err}")
    torch.manual_seed(0)
    ref = build_mixer(parse_mixer_config(dict(GPU_CFG, impl="chunked")), 256)
    fast = build_mixer(parse_mixer_config(dict(GPU_CFG, impl="fast")), 256)
    fast.load_state_dict(ref.state_dict())
    return ref.cuda(), fast.cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("autocast", [False, True])
def test_fast_matches_chunked_on_gpu(autocast):
    """Output, input gradient and all parameter gradients (as one vector) at T = 1, 63, 100, 2048; bounds as
    for the other fp32 kernels (tests/test_kernels_fla.py): 5e-3 / 2e-2, under bf16 autocast 4e-2 / 8e-2."""
    ref, fast = _gpu_pair()
    tol_out, tol_grad = (4e-2, 8e-2) if autocast else (5e-3, 2e-2)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for T in (1, 63, 100, 2048):
        x = torch.randn(2, T, 256, device="cuda", generator=gen)
        w = torch.randn(2, T, 256, device="cuda", generator=gen)
        res = []
        for m, ac in ((ref, False), (fast, autocast)):
            xi = x.clone().requires_grad_()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ac):
                y, _ = m(xi)
            g = torch.autograd.grad((y.float() * w).sum(), [xi, *m.parameters()])
            res.append((y.float(), g[0], torch.cat([p.flatten() for p in g[1:]])))
        (y_ref, gx_ref, gp_ref), (y, gx, gp) = res
        assert rel(y, y_ref) < tol_out, T
        assert rel(gx, gx_ref) < tol_grad and rel(gp, gp_ref) < tol_grad, T


@pytest.mark.gpu
def test_fast_prefill_and_decode_on_gpu():
    """With a state the fast mixer runs the chunked form: prefill 37 tokens, decode 4 == one forward."""
    ref, fast = _gpu_pair()
    x = torch.randn(2, 41, 256, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    with torch.no_grad():
        y_ref, _ = fast(x)
        state, ys = fast.init_state(2, device="cuda"), []
        for part in (x[:, :37], *x[:, 37:].split(1, dim=1)):
            y, state = fast(part, state)
            ys.append(y)
    assert rel(torch.cat(ys, 1), y_ref) < 5e-3
