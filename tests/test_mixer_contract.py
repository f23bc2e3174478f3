"""The contract test: every registered mixer, every listed variant, every check."""

import pytest
import torch

from basecap.mixers import mixer_class, mixer_names
from basecap.model import LM, ModelConfig

from mixer_contract import check_causal, check_declarations, check_decode, check_impls, check_shapes, check_state_size, make

CASES = [(n, v) for n in mixer_names() for v in mixer_class(n).test_variants]
IDS = [f"{n}-{i}" for n in mixer_names() for i, _ in enumerate(mixer_class(n).test_variants)]


@pytest.fixture(autouse=True)
def _fp32():
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("name,variant", CASES, ids=IDS)
def test_shapes_and_causality(name, variant):
    m = make(name, variant)
    check_shapes(m)
    check_causal(m)


@pytest.mark.parametrize("name,variant", CASES, ids=IDS)
def test_fast_forms_match_reference(name, variant):
    m = make(name, variant)
    sizes = (None,) if "chunk_size" not in type(m.cfg).model_fields else (4, 16, 64)
    check_impls(m, chunk_sizes=sizes)


@pytest.mark.parametrize("name,variant", CASES, ids=IDS)
def test_decode_equals_forward(name, variant):
    m = make(name, variant)
    check_decode(m)


@pytest.mark.parametrize("name,variant", CASES, ids=IDS)
def test_state_size(name, variant):
    check_state_size(make(name, variant))


@pytest.mark.parametrize("name,variant", CASES, ids=IDS)
def test_one_step_lowers_loss(name, variant):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, max_seq_len=64, mixer={"name": name, **variant})
    model = LM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = torch.randint(0, 64, (4, 33), generator=torch.Generator().manual_seed(0))
    before = model.loss(idx[:, :-1], idx[:, 1:])
    before.backward()
    opt.step()
    with torch.no_grad():
        after = model.loss(idx[:, :-1], idx[:, 1:])
    assert after < before


@pytest.mark.parametrize("name", mixer_names())
def test_declarations(name):
    cls = mixer_class(name)
    check_declarations(cls, cls.test_variants)
