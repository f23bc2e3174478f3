"""Recipe validation: built-ins load, user mistakes fail early with messages naming the key."""

from __future__ import annotations

import pytest
from test_data_helpers import tiny_recipe

from basecap.config_base import ConfigError
from basecap.data import RecipeConfig, builtin_recipes, load_recipe, recipe_from_dict
from basecap.data.recipe import FilesSource, JsonlSource, PipSdistSource
from basecap.data.text import glob_match


def test_default_recipe_loads():
    assert "default" in builtin_recipes()
    r = load_recipe("default")
    assert isinstance(r, RecipeConfig)
    assert r.domains["prose"].role == "train"
    held = {d for d, c in r.domains.items() if c.role == "heldout"}
    assert {"code", "docs"} <= held
    assert r.tokenizer.kind == "bpe" and r.tokenizer.vocab_size == 8192
    kinds = {type(s) for s in r.sources}
    assert PipSdistSource in kinds and FilesSource in kinds
    # everything that needs more than pip and the Python installation is optional
    for s in r.sources:
        needs_more_than_pip = s.kind == "npm_pack" or (s.kind == "files" and s.root != "{stdlib}")
        if needs_more_than_pip:
            assert s.optional, s.name
    assert all(d.max_bytes for d in r.domains.values())


def _err(raw) -> str:
    with pytest.raises(ConfigError) as e:
        recipe_from_dict(raw)
    return str(e.value)


def test_unknown_key_is_named(tmp_path):
    raw = tiny_recipe(tmp_path)
    raw["sources"][0]["incldue"] = ["*.txt"]
    msg = _err(raw)
    assert "sources.0" in msg and "incldue" in msg and "unknown key" in msg
    raw = tiny_recipe(tmp_path)
    raw["splits"]["valdation"] = 0.1
    assert "splits.valdation" in _err(raw)


def test_wrong_type_is_named(tmp_path):
    raw = tiny_recipe(tmp_path)
    raw["tokenizer"]["vocab_size"] = "big"
    msg = _err(raw)
    assert "tokenizer" in msg and "vocab_size" in msg
    raw = tiny_recipe(tmp_path)
    raw["domains"]["prose"]["max_bytes"] = -5
    assert "domains.prose.max_bytes" in _err(raw)


def test_unknown_source_kind(tmp_path):
    raw = tiny_recipe(tmp_path)
    raw["sources"][0]["kind"] = "ftp"
    msg = _err(raw)
    assert "sources.0" in msg and "ftp" in msg and "pip_sdist" in msg


def test_consistency_checks(tmp_path):
    raw = tiny_recipe(tmp_path)
    raw["sources"][0]["domain"] = "poetry"
    assert "unknown domain 'poetry'" in _err(raw)
    raw = tiny_recipe(tmp_path)
    raw["domains"]["math"] = {}
    assert "without any source" in _err(raw)
    raw = tiny_recipe(tmp_path)
    raw["splits"]["validation"] = 0.6
    raw["splits"]["test"] = 0.5
    assert "below 1" in _err(raw)
    raw = tiny_recipe(tmp_path)
    del raw["sources"][1]["domain_map"]
    assert "domain_map" in _err(raw)
    raw = tiny_recipe(tmp_path)
    raw["domains"]["Bad Name"] = raw["domains"].pop("code")
    assert "Bad Name" in _err(raw)


def test_toml_file_paths_relative_to_recipe(tmp_path):
    (tmp_path / "r").mkdir()
    f = tmp_path / "r" / "mine.toml"
    f.write_text(
        'name = "mine"\n[domains.web]\n[[sources]]\nkind = "jsonl"\ndomain = "web"\n'
        'paths = ["shards/*.jsonl.zst"]\n[tokenizer]\npath = "tok/tokenizer.json"\n'
    )
    r = load_recipe(f)
    src = r.sources[0]
    assert isinstance(src, JsonlSource) and src.paths == [str(tmp_path / "r" / "shards/*.jsonl.zst")]
    assert r.tokenizer.kind == "file" and r.tokenizer.path == str(tmp_path / "r" / "tok/tokenizer.json")


def test_bad_toml_and_unknown_names(tmp_path):
    f = tmp_path / "broken.toml"
    f.write_text("name = \n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_recipe(f)
    with pytest.raises(ConfigError, match="unknown recipe 'nope'"):
        load_recipe("nope")
    with pytest.raises(ConfigError, match="not found"):
        load_recipe(tmp_path / "missing.toml")


def test_glob_semantics():
    assert glob_match("docs/ref/models.txt", ["docs/**/*.txt"])
    assert glob_match("docs/index.txt", ["docs/**/*.txt"])
    assert not glob_match("docs/ref/models.txt", ["docs/*.txt"])
    assert glob_match("a/b/test_x.py", ["**/test_*.py"]) and glob_match("test_x.py", ["**/test_*.py"])
