"""The experiment file's section tables are typed overlays (config.overlay): every key a field of its run section and
every value of the field's type, checked at load for every table, the size tables not chosen included; the values
are kept as written."""

import pytest

from basecap.config import load_experiment
from basecap.config.overlay import DataOverlay, TrainOverlay, check_overlay
from basecap.config.sections import TrainConfig
from basecap.config_base import ConfigError

EXP = """
name = "t"
size = "small"
[data]
train_weights = {prose = 1.0}
seq_len = 32
[model]
d_model = 32
n_layers = 2
max_seq_len = 64
[train]
steps = 10
warmup_steps = 2
[[runs]]
name = "a"
[sizes.small]
train = { lr = 3e-3 }
[sizes.big]
train = { steps = 100 }
"""


def load(tmp_path, text):
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return load_experiment(p)


def test_sections_are_typed_and_keep_what_the_file_says(tmp_path):
    exp = load(tmp_path, EXP)
    assert isinstance(exp.train, TrainOverlay) and isinstance(exp.data, DataOverlay)
    assert exp.train.root == {"steps": 10, "warmup_steps": 2}  # as written: no defaults added
    assert exp.model_dump()["train"] == {"steps": 10, "warmup_steps": 2}  # experiment.json unchanged
    (rc,) = exp.resolve()
    assert (rc.train.steps, rc.train.lr) == (10, 3e-3)


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("train = { steps = 100 }", 'train = { steps = "many" }', r"sizes\.big\.train\.steps: Input should be a valid integer"),
        ("train = { steps = 100 }", "train = { lr = -1.0 }", r"sizes\.big\.train\.lr: Input should be greater than 0"),
        ("train = { steps = 100 }", "train = { lr = true }", r"sizes\.big\.train\.lr: a boolean is not a number"),
        ("train = { steps = 100 }", "train = { setps = 100 }", r"sizes\.big\.train\.setps: unknown key \(did you mean 'steps'\?"),
        ('name = "a"', 'name = "a"\ntrain.schedule = "linear"', r"runs\[0\] \(a\)\.train\.schedule: Input should be 'cosine' or 'wsd'"),
        ("seq_len = 32", "seq_len = 32\nretrieval = { fraction = 2.0 }", r"data\.retrieval\.fraction: Input should be less than or equal to 1"),
        ("train = { steps = 100 }", "train = { steps = 100 }\n[sizes.big.runs.a]\neval = { every = 0 }", r"sizes\.big\.runs\.a\.eval\.every"),
    ],
)
def test_a_bad_value_in_any_table_is_named_at_load(tmp_path, old, new, message):
    """The size `big` is not the one chosen: its tables are still checked, before anything else happens."""
    assert old in EXP
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, EXP.replace(old, new))


def test_a_nested_table_may_be_set_in_part():
    """`retrieval.fraction` alone in one table (its other fields in another, or their defaults) is an overlay."""
    check_overlay({"retrieval": {"haystack_domain": "prose"}}, DataOverlay.section, "data")
    check_overlay({"cooldowns": [30, 60], "betas": [0.9, 0.95]}, TrainConfig, "train")
    with pytest.raises(ValueError, match=r"train\.betas\[1\]: Input should be less than 1"):
        check_overlay({"betas": [0.9, 1.5]}, TrainConfig, "train")
