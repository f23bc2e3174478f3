"""A recipe that extends a built-in one: tables merge, lists replace, one level only."""

from __future__ import annotations

import pytest

from basecap.config_base import ConfigError
from basecap.data import load_recipe


def test_small_vocab_is_default_with_another_tokenizer():
    small, default = load_recipe("small-vocab"), load_recipe("default")
    assert small.name == "small-vocab" and small.tokenizer.vocab_size == 2048
    assert small.sources == default.sources and small.domains == default.domains and small.splits == default.splits
    assert small.tokenizer.model_copy(update={"vocab_size": 8192}) == default.tokenizer


def test_extends_from_a_file(tmp_path):
    p = tmp_path / "mine.toml"
    p.write_text('extends = "default"\nname = "mine"\n[splits]\nvalidation = 0.1\n')
    r = load_recipe(p)
    assert r.name == "mine" and r.splits.validation == 0.1 and r.splits.test == load_recipe("default").splits.test


@pytest.mark.parametrize("parent", ["nope", 3])
def test_extends_needs_a_builtin_recipe(tmp_path, parent):
    p = tmp_path / "bad.toml"
    p.write_text(f"extends = {parent!r}\nname = 'bad'\n".replace("'", '"'))
    with pytest.raises(ConfigError, match="extends"):
        load_recipe(p)
