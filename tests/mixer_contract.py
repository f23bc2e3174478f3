"""Reusable checks of the mixer contract (see src/basecap/mixers/base.py and DESIGN.md)."""

from __future__ import annotations

import torch

from basecap.mixers import build_mixer, mixer_class, parse_mixer_config, state_bytes

D_MODEL = 32
MAX_LEN = 128


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all(), "NaN/inf in the tested output"
    assert torch.isfinite(b).all(), "NaN/inf in the reference output"
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def make(name: str, variant: dict, **over):
    cfg = parse_mixer_config({"name": name, **variant, **over})
    torch.manual_seed(0)
    return build_mixer(cfg, D_MODEL, layer_idx=0, max_seq_len=MAX_LEN)


def clone_with(m, **over):
    """Same weights, different config fields (e.g. impl or chunk size)."""
    cfg = m.cfg.model_copy(update=over)
    cfg = parse_mixer_config(cfg.model_dump())
    m2 = build_mixer(cfg, D_MODEL, layer_idx=0, max_seq_len=MAX_LEN)
    m2.load_state_dict(m.state_dict())
    return m2


def inputs(B=2, T=17, seed=1, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D_MODEL, generator=g)
    return x.requires_grad_(requires_grad)


def check_shapes(m):
    for T in (1, 7, 33):
        y, s = m(inputs(T=T))
        assert y.shape == (2, T, D_MODEL) and s is None
        assert torch.isfinite(y).all()


def check_causal(m):
    x = inputs(T=24)
    y, _ = m(x)
    x2 = x.clone()
    x2[:, 13] += 1.0
    y2, _ = m(x2)
    assert torch.allclose(y[:, :13], y2[:, :13], atol=1e-6), "output before t changed when token t changed"
    assert not torch.allclose(y[:, 13:], y2[:, 13:]), "output did not depend on its own input"


def check_impls(m, chunk_sizes=(None,), lengths=(1, 63, 100), tol=1e-4):
    impls = mixer_class(m.cfg.name).impls
    oracle = clone_with(m, impl=impls[0])
    for other in impls[1:]:
        for cs in chunk_sizes:
            over = {"impl": other} | ({"chunk_size": cs} if cs is not None else {})
            fast = clone_with(m, **over)
            for T in lengths:
                x = inputs(B=2, T=T, requires_grad=True)
                y_ref, _ = oracle(x)
                g = torch.randn_like(y_ref)
                gx_ref, *gp_ref = torch.autograd.grad(y_ref, [x, *oracle.parameters()], g, allow_unused=True)
                y, _ = fast(x)
                gx, *gp = torch.autograd.grad(y, [x, *fast.parameters()], g, allow_unused=True)
                assert rel_err(y, y_ref) <= tol, f"{other} cs={cs} T={T}: output rel err {rel_err(y, y_ref):.2e}"
                assert rel_err(gx, gx_ref) <= tol, f"{other} cs={cs} T={T}: input grad rel err {rel_err(gx, gx_ref):.2e}"
                for (n, _), a, b in zip(oracle.named_parameters(), gp, gp_ref):
                    if b is None or b.norm() == 0:
                        continue
                    assert a is not None, f"{other}: no gradient for {n}"
                    assert rel_err(a, b) <= tol, f"{other} cs={cs} T={T}: grad {n} rel err {rel_err(a, b):.2e}"


def check_decode(m, T=21, prefill=8, tol=1e-4):
    x = inputs(B=2, T=T)
    y_full, _ = m(x)
    state = m.init_state(2)
    y_pre, state = m(x[:, :prefill], state)
    outs = [y_pre]
    for t in range(prefill, T):
        old = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
        y_t, new = m(x[:, t : t + 1], state)
        for k, v in old.items():  # state is returned, never mutated in place
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, state[k]), f"state[{k!r}] was mutated in place"
        outs.append(y_t)
        state = new
    y_dec = torch.cat(outs, dim=1)
    assert rel_err(y_dec, y_full) <= tol, f"decode != forward, rel err {rel_err(y_dec, y_full):.2e}"
    return state


def check_state_size(m):
    for T in (1, 9, 40):
        state = m.init_state(2)
        _, state = m(inputs(B=2, T=T), state)
        assert state_bytes(state) == m.state_size(T), f"T={T}: state tensors hold {state_bytes(state)} B, state_size says {m.state_size(T)}"


def check_declarations(cls, variants):
    """The declarations basecap reads besides the four methods (docs/adding_a_mixer.md, "Declarations"): each
    out-projection is an nn.Linear of every variant; match_field is a float field of the config that moves the
    parameter count, or None; compiles is True or a reason; chunk_size() is a positive int or None, and not None
    for a constant-size state; cost() parses, and cost_modes covers every value of its switch."""
    from typing import Literal, get_args, get_origin

    from torch import nn

    from basecap.catalog import cost_exponent

    fields = cls.config_class.model_fields
    assert isinstance(cls.out_projections, tuple) and all(isinstance(p, str) for p in cls.out_projections), cls.out_projections
    assert cls.compiles is True or (isinstance(cls.compiles, str) and cls.compiles), cls.compiles
    field = cls.match_field
    assert field is None or (field in fields and fields[field].annotation is float), f"match_field {field!r}: not a float config field"
    if cls.cost_modes is not None:
        switch, costs = cls.cost_modes
        ann = fields[switch].annotation
        assert get_origin(ann) is Literal and set(get_args(ann)) == set(costs), f"cost_modes {switch!r}: {sorted(costs)} != {get_args(ann)}"
    for variant in variants:
        m = make(cls.config_class.model_fields["name"].default, variant)
        linears = {n for n, mod in m.named_modules() if isinstance(mod, nn.Linear)}
        missing = set(cls.out_projections) - linears
        assert not missing, f"out_projections {sorted(missing)} are not nn.Linear layers of the mixer ({sorted(linears)})"
        chunk = m.chunk_size()
        assert chunk is None or (isinstance(chunk, int) and chunk > 0), chunk
        s = m.state_size(256)
        if s > 0 and s == m.state_size(128):
            assert chunk, "a constant-size state needs chunk_size() (plan: one state per chunk in the backward pass)"
        for T in (256, 2048):
            cost = m.cost(T)
            cost_exponent(cost, T // 4, T)
            cost_exponent(cost, T // 4, T, part="decode")
