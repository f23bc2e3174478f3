"""The mixer declarations basecap reads besides the four contract methods (docs/adding_a_mixer.md, "Declarations"):
a mixer that lacks one is refused with an error naming it, and what is read through them is what the published
runs were built with (the per-mixer checks are tests/test_mixer_contract.py::test_declarations)."""

import math

import pytest
import torch
from torch import nn

from basecap.config_base import ConfigError
from basecap.matching import count_params, resolve
from basecap.mixers import mixer_class
from basecap.mixers.attention import Attention, AttentionConfig
from basecap.mixers.base import LINEAR, Mixer
from basecap.model import LM, ModelConfig
from basecap.plan.gpu import activation_bytes_per_token

# the mixers of the published studies: their initialisation was chosen by module name before the declarations
PUBLISHED = ["attention", "based", "deltanet", "gated_deltanet", "mamba1", "mamba2", "rwkv5", "rwkv6", "rwkv7", "top1_chunk", "top1_element"]


class Undeclared(Mixer):
    config_class = AttentionConfig


def test_a_missing_declaration_is_an_error_naming_the_mixer_and_the_declaration():
    for attr in ("out_projections", "match_field", "compiles"):
        with pytest.raises(ConfigError, match=rf"test_declarations\.Undeclared does not declare {attr} \("):
            getattr(Undeclared, attr)
    m = Undeclared(16, AttentionConfig(head_dim=8))
    with pytest.raises(ConfigError, match="Undeclared does not declare out_projections"):
        _ = m.out_projections  # through the instance too (not nn.Module's bare "has no attribute")


def test_documented_defaults():
    m = Undeclared(16, AttentionConfig(head_dim=8))
    assert m.chunk_size() is None  # the config has no chunk_size field
    assert Undeclared.cost_modes is None
    assert m.cost(2048) == LINEAR  # flops_per_token (0 in the base) does not grow


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_declared_out_projections_are_the_ones_the_name_rule_picked(name):
    """Before the declarations the backbone scaled every nn.Linear whose name ended in o_proj, out_proj or down."""
    variants = mixer_class(name).test_variants
    for variant in variants:
        for mlp in (None, "swiglu") if name.startswith("mamba") else (None,):  # the default MLP, and Mamba with SwiGLU
            extra = {} if mlp is None else {"mlp": {"name": mlp}}
            with torch.device("meta"):
                model = LM(ModelConfig(vocab_size=64, d_model=32, n_layers=2, max_seq_len=64, mixer={"name": name, **variant}, **extra))
            by_name = {n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding)) and n.endswith(("o_proj", "out_proj", "down"))}
            assert model._out_projections() == by_name, (variant, mlp)


def test_the_out_projections_get_the_depth_scaled_init():
    torch.manual_seed(0)
    model = LM(ModelConfig(vocab_size=64, d_model=256, n_layers=8, max_seq_len=64, mixer={"name": "mamba1"}))
    scaled = 0.02 / math.sqrt(2 * 8)
    assert model.blocks[3].mixer.out_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert model.blocks[3].mixer.in_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_a_declared_out_projection_that_is_not_a_linear_is_an_error(monkeypatch):
    monkeypatch.setattr(Attention, "out_projections", ("o_prj",))
    with pytest.raises(
        ConfigError, match=r"attention\.Attention\.out_projections: 'o_prj' is not an nn.Linear of it \(its nn.Linear layers: k_proj, o_proj"
    ):
        LM(ModelConfig(vocab_size=64, d_model=32, n_layers=1, max_seq_len=64, mixer={"name": "attention", "head_dim": 8}))


def test_matching_widens_the_declared_field(monkeypatch):
    cfg = resolve(ModelConfig(preset="tiny", vocab_size=512, mixer={"name": "mamba2"}))
    assert cfg.mlp.name == "none" and cfg.mixer.expand != 2
    target = count_params(ModelConfig(preset="tiny", vocab_size=512, match_params=False))
    assert abs(count_params(cfg) / target - 1) < 0.05
    # a mixer without a width and a model without a feed-forward width: refused, naming the mixer
    with pytest.raises(ConfigError, match=r"model.match_params: mixer 'deltanet' declares match_field = None .* mlp 'none' has no width"):
        resolve(ModelConfig(preset="tiny", vocab_size=512, mixer={"name": "deltanet"}, mlp={"name": "none"}))
    # with the feed-forward block's width, Mamba's own expand stays as configured
    cfg = resolve(ModelConfig(preset="tiny", vocab_size=512, mixer={"name": "mamba2"}, mlp={"name": "swiglu"}))
    assert cfg.mixer.expand == 2 and cfg.mlp.hidden_mult != pytest.approx(8 / 3)
    # the field read is the declared one, not one named "expand"
    monkeypatch.setattr(mixer_class("mamba2"), "match_field", "d_state")
    with pytest.raises(Exception, match="d_state"):
        resolve(ModelConfig(preset="tiny", vocab_size=512, mixer={"name": "mamba2"}))  # d_state is an int: 1.0 does not validate


def test_the_plan_refuses_a_constant_state_without_a_chunk(monkeypatch):
    with torch.device("meta"):
        model = LM(ModelConfig(vocab_size=64, d_model=32, n_layers=1, max_seq_len=64, mixer={"name": "deltanet", "head_dim": 8}))
    before = activation_bytes_per_token(model, 64)["layers"]
    monkeypatch.setattr(mixer_class("deltanet"), "chunk_size", lambda self: 32)
    assert activation_bytes_per_token(model, 64)["layers"] > before  # twice the states per token
    monkeypatch.setattr(mixer_class("deltanet"), "chunk_size", lambda self: None)
    with pytest.raises(ConfigError, match="model.mixer: deltanet keeps a constant-size recurrent state but declares no chunk_size()"):
        activation_bytes_per_token(model, 64)
