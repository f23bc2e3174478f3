import os
import random
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

# Tests never touch the user's data home.
_HOME = tempfile.mkdtemp(prefix="basecap-test-home-")
os.environ["BASECAP_HOME"] = _HOME
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Test shapes are tiny: one intra-op thread is faster than two and leaves a core for subprocesses.
torch.set_num_threads(1)


def _write_domain(root: Path, name: str, words: list[str], n_files: int, seed: int):
    rng = random.Random(seed)
    d = root / name
    d.mkdir(parents=True)
    for i in range(n_files):
        sents = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 14))).capitalize() + "." for _ in range(40)]
        (d / f"doc{i:03d}.txt").write_text(" ".join(sents) + "\n")


@pytest.fixture(scope="session")
def tiny_recipe_path(tmp_path_factory) -> Path:
    """A two-domain recipe over generated text (prose-like words vs code-like tokens); ~0.5 MB."""
    root = tmp_path_factory.mktemp("tiny_sources")
    prose = "the a of and to in was he she it that his her with for as had on not be at by but said".split() + \
        "king queen sea ship whale night love death heart hand eye day time man god".split()
    code = "def return self if else for in import class None True False print len range x y i".split() + \
        "( ) : = == + - [ ] , . lambda yield try except with as".split()
    _write_domain(root, "prose", prose, 60, 1)
    _write_domain(root, "code", code, 60, 2)
    recipe = root / "tiny.toml"
    recipe.write_text(f"""
name = "tiny"
[domains.prose]
[domains.code]
role = "heldout"
[splits]
validation = 0.1
test = 0.1
min_validation_tokens = 4000
min_test_tokens = 4000
[tokenizer]
vocab_size = 384
sample_bytes_per_domain = 200000
[[sources]]
kind = "files"
domain = "prose"
root = "{root / 'prose'}"
include = ["*.txt"]
[[sources]]
kind = "files"
domain = "code"
root = "{root / 'code'}"
include = ["*.txt"]
""")
    return recipe


@pytest.fixture(scope="session")
def tiny_corpus(tiny_recipe_path):
    from basecap.data import build_corpus, load_recipe

    return build_corpus(load_recipe(str(tiny_recipe_path)), log=lambda *_: None)
