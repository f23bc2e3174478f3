"""Top-1 selection mixers beyond the contract: known answers, ties, estimators, decode cost,
memory shape of the blockwise forms, the CUDA path (and its math on CPU), the benchmark."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from basecap.config_base import ConfigError
from basecap.mixers import build_mixer, parse_mixer_config
from basecap.ops import top1 as T1
from basecap.ops.top1 import ChunkSettings, chunk_ref, element_ref

D_MODEL = 32


def mixer(name, **cfg):
    torch.manual_seed(0)
    return build_mixer(parse_mixer_config({"name": name, "head_dim": 8, **cfg}), D_MODEL, max_seq_len=256)


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def x_in(T, B=2, seed=1):
    return torch.randn(B, T, D_MODEL, generator=torch.Generator().manual_seed(seed))


def qkv(B=1, H=2, T=40, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g) for _ in range(3)]


def chunk_core(q, k, v, impl="chunked", **cfg):
    """Top1Chunk's selection + attention on given q, k, v (no projections)."""
    m = mixer("top1_chunk", **cfg)
    pos = torch.arange(q.shape[2])
    if impl == "ref":
        c = m.cfg
        return chunk_ref(q, k, v, pos, m.scale, c.chunk_len, selection=c.selection, own_chunk=c.own_chunk,
                         selector_grad=c.selector_grad)
    return m._mix(q, k, v, pos, impl, None, None)


# ---- known answers ----------------------------------------------------------------------------
@pytest.mark.parametrize("selection", ["exact", "approx"])
@pytest.mark.parametrize("own", ["candidate", "always"])
@pytest.mark.parametrize("impl", ["ref", "chunked"])
def test_one_chunk_with_own_chunk_is_full_causal_attention(selection, own, impl):
    T = 45
    att = mixer("attention", impl="ref", temperature=0.7)
    top = mixer("top1_chunk", selection=selection, own_chunk=own, chunk_len=64, impl=impl, temperature=0.7, chunk_size=8)
    top.load_state_dict(att.state_dict())
    x = x_in(T)
    assert rel(top(x)[0], att(x)[0]) < 1e-5


@pytest.mark.parametrize("impl", ["ref", "chunked"])
@pytest.mark.parametrize("position", ["rope", "none"])
def test_element_is_value_at_argmax(impl, position):
    m = mixer("top1_element", impl=impl, position=position, chunk_size=16)
    x = x_in(37)
    q, k, v = m._qkv(x, 0)
    s = (q.double() @ k.double().transpose(-1, -2)).masked_fill(torch.ones(37, 37).triu(1).bool(), -math.inf)
    o = v.gather(2, s.argmax(-1, keepdim=True).expand(-1, -1, -1, v.shape[-1]))
    want = m.o_proj(o.transpose(1, 2).reshape(2, 37, -1))
    assert rel(m(x)[0], want) < 1e-6


def test_element_ties_go_to_lowest_index():
    q, k, v = qkv(T=12)
    k[:, :, 3] = k[:, :, 8] = q[:, :, 11] * 5  # two identical best keys for the last query
    pos = torch.arange(12)
    for o in (T1.top1_element(q, k, v, pos, 0.3, 4, "straight_through"), element_ref(q, k, v, pos, 0.3, "straight_through")):
        assert torch.equal(o[:, :, 11], v[:, :, 3])


@pytest.mark.parametrize("selection", ["exact", "approx"])
@pytest.mark.parametrize("impl", ["ref", "chunked", "fast"])
def test_chunk_ties_go_to_lowest_chunk(selection, impl):
    C, T = 4, 12
    q, k, v = qkv(T=T, D=8)
    direction = torch.randn(8)
    q[:] = direction
    k[:, :, 4:8] = k[:, :, 0:4] = direction + 0.1 * torch.randn(4, 8)  # chunks 0 and 1: the same keys
    k[:, :, 8:] = -direction  # the own chunk scores low
    o = chunk_core(q, k, v, impl, selection=selection, chunk_len=C)
    want = torch.softmax((q[:, :, 11:] @ k[:, :, :4].transpose(-1, -2)) / math.sqrt(8), -1) @ v[:, :, :4]
    assert rel(o[:, :, 11:], want) < 1e-5  # chunk 0's values, not chunk 1's


@pytest.mark.parametrize("selection", ["exact", "approx"])
@pytest.mark.parametrize("own", ["candidate", "always"])
@pytest.mark.parametrize("T,C,tile", [(37, 8, 3), (50, 16, 8), (23, 64, 4), (64, 16, 64), (33, 5, 7)])
def test_partial_chunks_and_odd_lengths(selection, own, T, C, tile):
    q, k, v = (t.requires_grad_() for t in qkv(T=T, B=2))
    g = torch.randn(2, 2, T, 8)
    outs = []
    for impl in ("ref", "chunked", "fast"):
        o = chunk_core(q, k, v, impl, selection=selection, own_chunk=own, chunk_len=C, chunk_size=tile)
        outs.append((o, torch.autograd.grad(o, (q, k, v), g)))
    (o_ref, g_ref), *others = outs
    for o, grads in others:
        assert rel(o, o_ref) < 1e-5
        for a, b in zip(grads, g_ref):
            assert rel(a, b) < 1e-4


@pytest.mark.parametrize("own,grad", [("candidate", "straight_through"), ("always", "straight_through"),
                                      ("candidate", "none")])
def test_approx_in_float64_matches_reference_and_leaves_q_alone(own, grad):
    """For a float64 q, ``q.to(float64)`` is q itself: the Approx selection once scaled it in place,
    and the tile attention then used the scaled q (fused form and select-then-attend form)."""
    q, k, v = (t.double().requires_grad_() for t in qkv(T=37, B=2))
    q_before = q.detach().clone()
    g = torch.randn(2, 2, 37, 8, dtype=torch.float64)
    outs = []
    for impl in ("ref", "chunked"):
        o = chunk_core(q, k, v, impl, selection="approx", own_chunk=own, selector_grad=grad, chunk_len=8, chunk_size=4)
        assert o.dtype == torch.float64
        outs.append((o, torch.autograd.grad(o, (q, k, v), g)))
        assert torch.equal(q.detach(), q_before)
    (o_ref, g_ref), (o, grads) = outs
    assert rel(o, o_ref) < 1e-5
    for a, b in zip(grads, g_ref):
        assert rel(a, b) < 1e-4


def test_fast_tile_kernel_math_on_cpu():
    """The CUDA path's SDPA tile kernel and the generic gather path, checked on CPU."""
    from basecap.kernels.top1_cuda import sdpa_tile_attention

    q, k, v = (t.requires_grad_() for t in qkv(T=70, B=2))
    pos = torch.arange(70)
    sel = torch.randint(0, 9, (2, 2, 70)).minimum(pos // 8)
    sel[0, 0, :5] = -1
    g, gl = torch.randn(2, 2, 70, 8), torch.randn(2, 2, 70)
    res = []
    for kernel in (None, T1.tile_attention, sdpa_tile_attention):
        o, lse = T1.attend_selected(q, k, v, sel, pos, ChunkSettings(0.3, 8, tile_rows=16, tile_kernel=kernel), True)
        loss = (o * g).sum() + (torch.where(sel >= 0, lse, 0.0) * gl).sum()
        res.append((o, lse, torch.autograd.grad(loss, (q, k, v))))
    for o, lse, grads in res[1:]:
        assert rel(o, res[0][0]) < 1e-5
        assert torch.equal(torch.isinf(lse), torch.isinf(res[0][1]))
        assert rel(lse[sel >= 0], res[0][1][sel >= 0]) < 1e-5
        for a, b in zip(grads, res[0][2]):
            assert rel(a, b) < 1e-4


# ---- gradient estimators ---------------------------------------------------------------------
def test_element_straight_through_has_soft_attention_score_gradients():
    q, k, v = (t.requires_grad_() for t in qkv(T=30))
    pos, g = torch.arange(30), torch.randn(1, 2, 30, 8)
    o = T1.top1_element(q, k, v, pos, 0.35, 8, "straight_through")
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), g)
    soft = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.35)
    sq, sk = torch.autograd.grad(soft, (q, k), g)
    assert rel(dq, sq) < 1e-5 and rel(dk, sk) < 1e-5
    s = (q @ k.transpose(-1, -2)).masked_fill(torch.ones(30, 30).triu(1).bool(), -math.inf)
    onehot = torch.zeros_like(s).scatter(-1, s.argmax(-1, keepdim=True), 1.0)
    assert rel(dv, onehot.transpose(-1, -2) @ g) < 1e-6  # the value gradient is the hard one


def test_element_prob_ratio_gradient():
    q, k, v = (t.requires_grad_() for t in qkv(T=25))
    pos, g = torch.arange(25), torch.randn(1, 2, 25, 8)
    o = T1.top1_element(q, k, v, pos, 0.4, 8, "prob_ratio")
    dq, = torch.autograd.grad(o, (q,), g)
    s = (q @ k.transpose(-1, -2) * 0.4).masked_fill(torch.ones(25, 25).triu(1).bool(), -math.inf)
    i = s.argmax(-1, keepdim=True)
    p = torch.softmax(s, -1)
    gt = (g * v.gather(2, i.expand(-1, -1, -1, 8))).sum(-1, keepdim=True)  # dO . v_i*
    ds = gt * (torch.zeros_like(p).scatter(-1, i, 1.0) - p)
    assert rel(dq, ds @ k * 0.4) < 1e-5


@pytest.mark.parametrize("selection", ["exact", "approx"])
def test_selector_gate_changes_gradients_not_outputs(selection):
    q, k, v = (t.requires_grad_() for t in qkv(T=48))
    g = torch.randn(1, 2, 48, 8)
    res = {}
    for mode in ("straight_through", "none"):
        o = chunk_core(q, k, v, selection=selection, chunk_len=8, selector_grad=mode)
        res[mode] = (o, torch.autograd.grad(o, (q, k), g))
    assert torch.equal(res["straight_through"][0], res["none"][0])
    assert rel(res["none"][1][1], res["straight_through"][1][1]) > 1e-3
    # without the gate, keys of chunks nobody selected get no gradient at all
    settings = ChunkSettings(1 / math.sqrt(8), 8, select_rows=16)
    sel = T1.approx_select(q, k, None, torch.arange(48), settings)[0] if selection == "approx" \
        else T1.exact_select(q, k, torch.arange(48), settings)[0]
    dk = res["none"][1][1]
    for h in range(2):
        unused = set(range(6)) - set(sel[0, h].tolist())
        for j in unused:
            assert dk[0, h, 8 * j : 8 * j + 8].abs().max() == 0


def test_approx_gate_gradient_is_log_softmax_of_chunk_scores():
    q, k = (t.requires_grad_() for t in qkv(T=40)[:2])
    pos, C, scale = torch.arange(40), 8, 0.3
    sel, gate, _ = T1.approx_select(q, k, None, pos, ChunkSettings(scale, C))
    w = torch.randn(1, 2, 40)
    dq, dk = torch.autograd.grad((gate * w).sum(), (q, k))
    # independent dense form of a_tj and log P_t,sel
    kbar = torch.stack([k[:, :, t // C * C : t + 1].mean(2) if j == t // C else k[:, :, j * C : j * C + C].mean(2)
                        for t in range(40) for j in range(5)], 2).view(1, 2, 40, 5, 8)
    n = torch.tensor([[t % C + 1 if j == t // C else C for j in range(5)] for t in range(40)], dtype=torch.float32)
    a = (q[:, :, :, None] * kbar).sum(-1) * scale + n.log()
    a = a.masked_fill(torch.arange(5) > (pos // C)[:, None], -math.inf)
    assert torch.equal(sel, a.argmax(-1))
    log_p = torch.log_softmax(a, -1).gather(-1, sel[..., None])[..., 0]
    wq, wk = torch.autograd.grad((log_p * w).sum(), (q, k))
    assert rel(dq, wq) < 1e-4 and rel(dk, wk) < 1e-4


# ---- configuration --------------------------------------------------------------------------
def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="chunk_len"):
        parse_mixer_config({"name": "top1_chunk", "chunk_len": 0})
    with pytest.raises(ConfigError, match="selectoin"):
        parse_mixer_config({"name": "top1_chunk", "selectoin": "approx"})
    with pytest.raises(ConfigError, match="estimator"):
        parse_mixer_config({"name": "top1_element", "estimator": "gumbel"})
    with pytest.raises(ValueError, match="CUDA"):
        mixer("top1_chunk", impl="fast")(x_in(5))


# ---- decoding ---------------------------------------------------------------------------------
def _decode_flops(m, context):
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad():
        _, state = m(x_in(context, B=1), m.init_state(1))
        with FlopCounterMode(display=False) as fc:
            m(x_in(1, B=1, seed=3), state)
    return fc.get_total_flops()


def test_approx_decode_work_grows_with_chunks_not_tokens():
    m = mixer("top1_chunk", selection="approx", chunk_len=16)
    f_short, f_long = _decode_flops(m, 64), _decode_flops(m, 2048)
    per_token_attention = 4 * m.n_heads * m.head_dim  # what full attention adds per cached token
    assert f_long - f_short < 0.1 * per_token_attention * (2048 - 64)
    assert f_long - f_short <= 2 * 2 * m.n_heads * m.head_dim * (2048 - 64) / 16 + 1  # one q . kbar per chunk


def test_decode_cache_appends_in_place_and_branches_safely():
    m = mixer("top1_chunk", selection="approx", chunk_len=4)
    x = x_in(12, B=1)
    with torch.no_grad():
        _, s = m(x[:, :6], m.init_state(1))
        _, s1 = m(x[:, 6:7], s)
        ptr = s1["k"].data_ptr()
        _, s2 = m(x[:, 7:8], s1)
        assert s2["k"].data_ptr() == ptr  # same buffer: no copy of the cache per token
        y_a, _ = m(x[:, 8:9], s2)
        y_b, s_b = m(x[:, 8:9] + 1.0, s2)  # a second branch from the same state copies
        assert s_b["k"].data_ptr() != ptr
        y_a2, _ = m(x[:, 8:9], s2)
        assert torch.equal(y_a, y_a2)
        full, _ = m(x[:, :9])
        assert rel(y_a[:, 0], full[:, 8]) < 1e-5


# ---- memory shape --------------------------------------------------------------------------------
def _largest_allocation(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.self_cpu_memory_usage for e in prof.events()), default=0)


@pytest.mark.parametrize("name,cfg", [("top1_chunk", {"selection": "exact"}), ("top1_chunk", {"selection": "approx"}),
                                      ("top1_element", {})])
def test_chunked_forms_never_hold_a_T_by_T_matrix(name, cfg):
    T, H = 1024, 1
    q, k, v = (t.requires_grad_() for t in qkv(T=T, H=H, D=16))
    m = build_mixer(parse_mixer_config({"name": name, "head_dim": 16, "chunk_size": 16, **cfg}), 16)

    def run(impl):
        def fn():
            o = m._mix(q, k, v, torch.arange(T), impl, None, None)
            o.sum().backward()
        return fn

    full = T * T * 4 * H
    assert _largest_allocation(run("ref")) >= full  # the oracle does build it: the probe sees it
    assert _largest_allocation(run("chunked")) <= full / 4


# ---- CUDA --------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name,cfg", [
    ("top1_element", {}), ("top1_element", {"estimator": "prob_ratio"}),
    ("top1_chunk", {"selection": "exact", "chunk_len": 16}), ("top1_chunk", {"selection": "approx", "chunk_len": 16}),
    ("top1_chunk", {"selection": "exact", "chunk_len": 16, "own_chunk": "always"}),
    ("top1_chunk", {"selection": "approx", "chunk_len": 64, "own_chunk": "always", "selector_grad": "none"}),
])
def test_fast_cuda_path_matches_reference(name, cfg):
    torch.backends.cuda.matmul.allow_tf32 = False
    for T in (1, 100, 333):
        torch.manual_seed(0)
        ref = build_mixer(parse_mixer_config({"name": name, "impl": "ref", **cfg}), 128).cuda()
        fast = build_mixer(parse_mixer_config({"name": name, "impl": "fast", **cfg}), 128).cuda()
        fast.load_state_dict(ref.state_dict())
        x = torch.randn(2, T, 128, device="cuda", requires_grad=True)
        y_ref, _ = ref(x)
        g = torch.randn_like(y_ref)
        want = torch.autograd.grad(y_ref, [x, *ref.parameters()], g)
        y, _ = fast(x)
        got = torch.autograd.grad(y, [x, *fast.parameters()], g)
        assert rel(y, y_ref) < 1e-4, f"T={T}"
        for a, b in zip(got, want):
            assert rel(a, b) < 1e-4, f"T={T}"
        with torch.no_grad():  # prefill + decode on the device
            state = fast.init_state(2, "cuda")
            pre = max(1, T // 2)
            y_t, state = fast(x[:, :pre], state)
            y_dec = [y_t]
            for t in range(pre, T):
                y_t, state = fast(x[:, t : t + 1], state)
                y_dec.append(y_t)
            assert rel(torch.cat(y_dec, 1), y_ref.detach()) < 1e-4


# ---- benchmark ------------------------------------------------------------------------------------
def test_selection_benchmark_smoke(tmp_path):
    from basecap.bench import selection

    selection.main(["--lengths", "64", "128", "--model-len", "64", "--decode-lens", "32", "64", "--reps", "1", "--warmup", "0",
                    "--d-model", "64", "--heads", "2", "--head-dim", "32", "--vocab", "128", "--chunk-len", "16",
                    "--decode-steps", "2", "--no-memory", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "selection.json").read_text())
    assert {r["variant"] for r in data["layer"]} >= {"sdpa", "top1_chunk_approx", "top1_chunk_exact", "top1_element"}
    assert (tmp_path / "selection.png").exists()


def test_selection_benchmark_memory_probe():
    import argparse

    from basecap.bench import selection

    args = argparse.Namespace(heads=2, head_dim=32, chunk_len=16, threads=1)
    r = selection._peak_memory_cpu("top1_chunk_approx", 512, args)
    assert r["method"] in ("VmHWM", "ru_maxrss") and r["peak_bytes"] > 0
