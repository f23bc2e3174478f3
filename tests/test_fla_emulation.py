"""The fast path (``impl="fast"``) of every fla-backed mixer, run on CPU with fla's kernels emulated.

fla's Triton ops need CUDA, so on CPU the mixer-to-kernel wiring never runs. Here each ``fla.ops``
function that ``basecap.kernels.fla`` imports is stood in (``tests/fla_standins.py``) by a function with
the real op's signature (checked against the installed fla source) that applies the op's documented
defaults and checks, and computes with fla's own pure-PyTorch reference (``fla/ops/*/naive.py``, loaded
file by file; importing fla itself needs Triton). ``KERNEL_DEVICES`` is widened to CPU so that
``resolve_impl`` sends ``impl="fast"`` through the whole real path (the ``fla_import_error`` check, the
adapter, the op).

Each mixer's ``impl="fast"`` is then compared with its ``impl="chunked"`` (itself checked against the
step-by-step oracle by the contract tests), same weights: outputs and every gradient in training
(``state=None``, no state asked from the kernel), and prefill + decode from a non-zero state (state in,
state out, gradients of the initial state). What this proves and does not prove: docs/kernels.md.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from basecap.kernels import fla as fk
from basecap.mixers import build_mixer, mixer_class, parse_mixer_config

from fla_standins import _ACCEPT_FP32, STAND_INS, _real_signature, install_stand_ins

pytestmark = pytest.mark.filterwarnings("error:ChunkDeltaRuleFunction does not support float32")

D_MODEL = 32
# the kernels that take 16-bit q/k/v (the adapter rounds fp32 activations to bf16)
BF16_KERNELS = {"deltanet", "gated_deltanet", "kda", "rwkv7"}
# (output, gradient) relative-error bounds, fast against chunked: fp32 kernels differ by summation order
# only; bf16 kernels by the rounding of q/k/v (and a, b, beta) to bf16; under bf16 autocast every linear
# layer rounds as well. A convention error (layout, scale, decay sign, state layout) gives 1e-1 and more.
# The 16-bit kernels are also run in fp32 ("exact": the adapter keeps fp32, the stand-in accepts it), so
# their mapping is checked as tightly as the fp32 kernels'.
TOL = {"fp32": (1e-5, 1e-5), "bf16": (2e-2, 4e-2), "autocast": (4e-2, 8e-2)}


@pytest.fixture
def emulated_fla(monkeypatch):
    """Installs stand-in ``fla`` / ``fla.ops.*`` modules (``tests/fla_standins.py``) and lets the fast path run
    on CPU; yields the list of calls (op name, ``initial_state is None``, ``output_final_state``)."""
    yield from install_stand_ins(monkeypatch)


def test_stand_ins_have_the_real_signatures():
    """Same parameters, order and defaults as the fla 0.6.0 ops, so the adapters' calls bind as on GPU."""
    for fn, relpath in STAND_INS.values():
        ours = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind == p.VAR_KEYWORD:
                ours.append(("**" + p.name, "var", p.empty))
            else:
                ours.append((p.name, "keyword" if p.kind == p.KEYWORD_ONLY else "positional", p.default))
        assert ours == _real_signature(relpath, fn.__name__), fn.__name__


# ---- every fla-backed mixer: impl="fast" (emulated) against impl="chunked" ------------------------

def fla_mixers() -> list[str]:
    from basecap.mixers import mixer_names

    return [n for n in mixer_names() if mixer_class(n).fast_kernels == "fla"]


KERNEL_OF = {"mamba2": "chunk_simple_gla", "deltanet": "chunk_delta_rule", "gated_deltanet": "chunk_gated_delta_rule", "kda": "chunk_kda",
             "rwkv6": "chunk_rwkv6", "rwkv7": "chunk_rwkv7", "based": "parallel_based",
             "forgetting_attn": "parallel_forgetting_attn", "log_linear_mamba2": "chunk_log_linear_attn"}
# kernels that take no state: with a state (prefill, decode) these mixers run their chunked form, no kernel call
# (log-linear attention's kernel has a state, but of another kind: the raw tokens of its open chunk)
STATELESS_KERNELS = {"based", "forgetting_attn", "log_linear_mamba2"}
# (mixer, test variant, precision): "kernel" runs the adapters' own dtypes, "exact" keeps the 16-bit kernels in fp32
CASES = [(name, i, precision) for name in fla_mixers() for i in range(len(mixer_class(name).test_variants))
         for precision in (("kernel", "exact") if name in BF16_KERNELS else ("kernel",))]
CASE_IDS = ["-".join(map(str, case)) for case in CASES]


def test_every_fla_mixer_is_emulated():
    assert {n for n, *_ in CASES} == set(KERNEL_OF)


def rel(a, b, floor: float = 1e-12) -> float:
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(floor))


def _pair(name: str, variant: int):
    """(chunked, fast) mixers with the same weights; all-zero parameters (LoRA inputs) get small random
    values so the data-dependent paths carry gradient."""
    cfg = {"name": name, **mixer_class(name).test_variants[variant]}
    torch.manual_seed(0)
    ref = build_mixer(parse_mixer_config(dict(cfg, impl="chunked")), D_MODEL)
    with torch.no_grad():
        for p in ref.parameters():
            if not p.any():
                p.normal_(0, 0.05)
    fast = build_mixer(parse_mixer_config(dict(cfg, impl="fast")), D_MODEL)
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def _set_precision(monkeypatch, name: str, precision: str) -> tuple[float, float]:
    """Applies ``precision`` and returns its (output, gradient) tolerance."""
    if precision == "exact":
        compute_dtype = fk.compute_dtype
        monkeypatch.setattr(fk, "compute_dtype", lambda x, fp32_ok=True: compute_dtype(x))
        monkeypatch.setitem(_ACCEPT_FP32, "on", True)
    return TOL["bf16" if name in BF16_KERNELS and precision == "kernel" else "fp32"]


def _grads(m, loss, inputs: dict) -> dict:
    names, params = zip(*m.named_parameters())
    got = torch.autograd.grad(loss, [*inputs.values(), *params], allow_unused=True)
    return {k: g for k, g in zip([*inputs, *names], got) if g is not None}


def _grad_errors(g, g_ref) -> dict:
    """Per-tensor relative errors; a gradient that is ~0 in exact arithmetic is measured against 1e-3 of
    the whole gradient instead of itself."""
    assert g.keys() == g_ref.keys()
    floor = 1e-3 * float(torch.cat([t.flatten().double() for t in g_ref.values()]).norm())
    return {f"grad {k}": rel(g[k], g_ref[k], floor) for k in g_ref}


def _check(errs: dict, tol_out: float, tol_grad: float, what: str) -> None:
    bad = {k: e for k, e in errs.items() if e > (tol_grad if k.startswith("grad") else tol_out)}
    assert not bad, f"{what}: " + ", ".join(f"{k} {e:.1e}" for k, e in bad.items())


def training_errors(ref, fast, autocast: bool = False) -> dict:
    """Relative errors of fast against chunked in training (``state=None``): the output and the
    gradients of the input and of every parameter."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 23, D_MODEL, generator=gen)
    w = torch.randn(2, 23, D_MODEL, generator=gen)
    out = {}
    for key, m in (("ref", ref), ("fast", fast)):
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast and m is fast):
            y, state = m(xi)
        assert state is None
        out[key] = (y.float(), _grads(m, (y.float() * w).sum(), {"x": xi}))
    (y_ref, g_ref), (y, g) = out["ref"], out["fast"]
    return {"output": rel(y, y_ref), **_grad_errors(g, g_ref)}


def _start_state(ref, gen) -> dict:
    """A realistic non-zero decode state: the chunked mixer's state after 9 random tokens."""
    with torch.no_grad():
        _, state = ref(torch.randn(2, 9, D_MODEL, generator=gen), ref.init_state(2))
    return state


def _leaves(state: dict) -> dict:
    return {k: v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in state.items()}


def state_errors(ref, fast) -> dict:
    """Relative errors of fast against chunked from a non-zero state: a 13-token prefill (output, new
    state, gradients of the input, of the initial state and of every parameter), then decode steps of
    1, 1 and 7 tokens (outputs and states)."""
    gen = torch.Generator().manual_seed(2)
    start = _start_state(ref, gen)
    x = torch.randn(2, 22, D_MODEL, generator=gen)
    w = torch.randn(2, 13, D_MODEL, generator=gen)
    out = {}
    for key, m in (("ref", ref), ("fast", fast)):
        s0, xi = _leaves(start), x[:, :13].clone().requires_grad_()
        y, s1 = m(xi, s0)
        gen_w = torch.Generator().manual_seed(3)
        loss = (y * w).sum() + sum((v.float() * torch.randn(v.shape, generator=gen_w)).sum()
                                   for v in s1.values() if isinstance(v, torch.Tensor))
        grads = _grads(m, loss, {"x": xi, **{f"state {k}": v for k, v in s0.items()
                                             if isinstance(v, torch.Tensor) and v.requires_grad}})
        ys, state = [y.detach()], s1
        with torch.no_grad():
            for part in (x[:, 13:14], x[:, 14:15], x[:, 15:]):
                y, state = m(part, state)
                ys.append(y)
        out[key] = (torch.cat(ys, 1), s1, state, grads)
    (y_ref, s1_ref, s_ref, g_ref), (y, s1, s, g) = out["ref"], out["fast"]
    errs = {"output": rel(y, y_ref), **_grad_errors(g, g_ref)}
    for label, a, b in (("after prefill", s1, s1_ref), ("final", s, s_ref)):
        assert a.keys() == b.keys()
        for k, v in b.items():
            if isinstance(v, torch.Tensor):
                assert a[k].dtype == v.dtype and a[k].shape == v.shape, (label, k)
                errs[f"state {k} {label}"] = rel(a[k], v)
            else:
                assert a[k] == v, (label, k)
    return errs


@pytest.mark.parametrize("name,variant,precision", CASES, ids=CASE_IDS)
def test_fast_training_branch_matches_chunked(emulated_fla, monkeypatch, name, variant, precision):
    """state=None: outputs and every gradient; the kernel is called once and asked for no state."""
    tol = _set_precision(monkeypatch, name, precision)
    ref, fast = _pair(name, variant)
    _check(training_errors(ref, fast), *tol, f"{name} variant {variant} {precision}")
    uses_kernel = not (name == "based" and fast.cfg.branches == "window")
    assert emulated_fla == ([(KERNEL_OF[name], True, False)] if uses_kernel else []), emulated_fla


@pytest.mark.parametrize("name,variant,precision", CASES, ids=CASE_IDS)
def test_fast_state_branch_matches_chunked(emulated_fla, monkeypatch, name, variant, precision):
    """Prefill + decode from a non-zero state: the kernel gets the state and returns the new one at every
    call. Based's linear branch and FoX run their chunked form whenever a state is passed (no kernel call)."""
    tol = _set_precision(monkeypatch, name, precision)
    ref, fast = _pair(name, variant)
    _check(state_errors(ref, fast), *tol, f"{name} variant {variant} {precision}")
    assert emulated_fla == ([] if name in STATELESS_KERNELS else [(KERNEL_OF[name], False, True)] * 4), emulated_fla


@pytest.mark.parametrize("name", sorted(KERNEL_OF))
def test_fast_under_autocast_matches_chunked(emulated_fla, name):
    """bf16 autocast (the GPU training setting): fast under autocast against chunked in fp32."""
    ref, fast = _pair(name, 0)
    _check(training_errors(ref, fast, autocast=True), *TOL["autocast"], f"{name} autocast")
    assert emulated_fla


# ---- the emulation catches convention errors ----------------------------------------------------

def _wrong(inputs_fn, change):
    @functools.wraps(inputs_fn)
    def wrapped(*args, **kwargs):
        kw = inputs_fn(*args, **kwargs)
        change(kw)
        return kw
    return wrapped


def _drop_scale(kw):
    del kw["scale"]  # the op's default K^-1/2 instead of ours


def _kda_gate_channels_reversed(kw):
    kw["g"] = kw["g"].flip(-1)  # each key channel gets another channel's decay


def _state_transposed(kw):
    if kw["initial_state"] is not None:
        kw["initial_state"] = kw["initial_state"].transpose(-1, -2).contiguous()


def _a_b_swapped(kw):
    kw["a"], kw["b"] = kw["b"], kw["a"]


def _based_scale_one(kw):
    kw["scale"] = 1.0


def _fox_gates_summed(kw):
    kw["g"] = kw["g"].cumsum(1)  # the cumulative log forget instead of the per-step gates the op sums itself


def _levels_shifted(kw):
    kw["level_scales"] = kw["level_scales"].roll(-1, dims=-1)  # level l weighed with lambda^(l+1): the level index off by one


MUTATIONS = {  # mixer -> (adapter input builder, change, branch)
    "mamba2": ("ssd_inputs", _drop_scale, "training"),
    "deltanet": ("delta_rule_inputs", _state_transposed, "state"),
    "kda": ("kda_inputs", _kda_gate_channels_reversed, "training"),
    "rwkv6": ("wkv6_inputs", _drop_scale, "training"),
    "rwkv7": ("wkv7_inputs", _a_b_swapped, "training"),
    "based": ("based_inputs", _based_scale_one, "training"),
    "forgetting_attn": ("forgetting_attn_inputs", _fox_gates_summed, "training"),
    "log_linear_mamba2": ("log_linear_attn_inputs", _levels_shifted, "training"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_emulation_catches_a_convention_error(emulated_fla, monkeypatch, name):
    """A deliberately wrong mapping (scale, state layout, DPLR a/b) fails the comparison by far."""
    builder, change, branch = MUTATIONS[name]
    tol_out, _ = _set_precision(monkeypatch, name, "exact")
    monkeypatch.setattr(fk, builder, _wrong(getattr(fk, builder), change))
    ref, fast = _pair(name, 0)
    err = (training_errors if branch == "training" else state_errors)(ref, fast)["output"]
    assert err > 100 * tol_out, f"{name}: rel err {err:.1e} (tolerance {tol_out:.0e})"
