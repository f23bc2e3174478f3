import ipaddress
import os
import random
import socket
import sys
import tempfile
import warnings
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


# ---- tests cannot silently vanish ---------------------------------------------------------------
# With CI set (scripts/test.sh sets it), a test skipped because a declared test extra is missing (fla's
# oracles, lm-eval, transformers, accelerate, pyarrow, tensorboard, wandb: ``pip install -e '.[test]'``)
# fails instead: ``pytest.importorskip`` and ``pytest.skip("... not installed")`` anywhere in the suite,
# at collection or in a test.
_MISSING_PACKAGE = ("could not import", "not installed", "No module named")


def ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _fail_missing_extra(rep) -> None:
    if not (rep.skipped and ci()):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    if any(m in reason for m in _MISSING_PACKAGE):
        rep.outcome = "failed"
        rep.longrepr = f"CI is set and a declared test extra is missing ({reason}); install them: pip install -e '.[test]'"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_missing_extra(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_missing_extra(outcome.get_result())


# ---- nothing is downloaded at run time ----------------------------------------------------------
# A connection to anything but this machine fails in every test (loopback and AF_UNIX stay open: the
# distributed tests and W&B's service talk over them).
class NetworkBlocked(OSError):
    pass


def _local(family, address) -> bool:
    if family not in (socket.AF_INET, socket.AF_INET6):
        return True
    host = address[0] if isinstance(address, tuple) else address
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:  # a host name other than localhost would need a DNS lookup: remote
        return False


def _guard(connect):
    def guarded(self, address, *a, **k):
        if not _local(self.family, address):
            raise NetworkBlocked(f"tests may not reach the network (connect to {address!r})")
        return connect(self, address, *a, **k)

    return guarded


socket.socket.connect = _guard(socket.socket.connect)
socket.socket.connect_ex = _guard(socket.socket.connect_ex)


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


# ---- the fast tier: tests measured over 1 s are marked slow ---------------------------------------------
# tests/slow_tests.txt lists them (node id, measured seconds); `./scripts/test.sh --fast` runs -m "not slow".
_TESTS = Path(__file__).resolve().parent
_SLOW_LIST = _TESTS / "slow_tests.txt"


def slow_ids(path: Path = _SLOW_LIST) -> set[str]:
    """The node ids of tests/slow_tests.txt (one a line, then its measured seconds; # starts a comment)."""
    ids = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            ids.add(line.split()[0])
    return ids


def _whole_suite(config) -> bool:
    """Whether this session collects every test file (pytest tests, or no path: testpaths), so that an id of the
    list that no test has is a stale line, not a test this session did not ask for."""
    where = config.invocation_params.dir
    paths = [a for a in config.args if not a.startswith("-")]
    return bool(paths) and all("::" not in a and (where / a).resolve() == _TESTS for a in paths)


def stale_slow_ids(listed: set[str], collected: list[str]) -> list[str]:
    """Listed ids no collected test has."""
    return sorted(listed - set(collected))


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the marks must be there when it reads them
def pytest_collection_modifyitems(config, items):
    listed = slow_ids()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
    stale = stale_slow_ids(listed, [item.nodeid for item in items]) if _whole_suite(config) else []
    if stale:  # a renamed slow test runs in the fast tier until its line follows it: worth a warning, not a failure
        warnings.warn(pytest.PytestWarning("tests/slow_tests.txt names tests that no longer exist (renamed or removed?): " + ", ".join(stale)), stacklevel=2)
