import pytest

from basecap.cli import main
from basecap.mixers import mixer_names
from basecap.model import ModelConfig
from basecap.matching import count_params, resolve


def test_preset_fills_shape_and_explicit_values_win():
    cfg = ModelConfig(preset="tiny")
    assert (cfg.d_model, cfg.n_layers, cfg.match_params) == (192, 4, True)
    assert ModelConfig(preset="tiny", n_layers=2).n_layers == 2


@pytest.mark.parametrize("name", mixer_names())
def test_tiny_preset_matches_transformer_pp_within_5_percent(name):
    ref = count_params(resolve(ModelConfig(preset="tiny", mixer={"name": "attention"})))
    got = count_params(resolve(ModelConfig(preset="tiny", mixer={"name": name})))
    assert abs(got - ref) / ref <= 0.05, f"{name}: {got} non-embedding params vs Transformer++ {ref}"


def test_mixers_command_lists_every_mixer(capsys):
    assert main(["mixers"]) == 0
    out = capsys.readouterr().out
    for name in mixer_names():
        assert name in out
