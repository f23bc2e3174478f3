"""The trust model of docs/security.md: reading a run directory builds, fetches and runs nothing; the test
suite reaches no network and cannot lose a test to a missing extra when CI is set."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from basecap.cli import main
from basecap.data.home import CorpusMissing, open_built_corpus, run_corpus


@pytest.fixture(scope="module")
def trained_run(tiny_corpus, tiny_recipe_path, tmp_path_factory):
    from test_train import run_cfg

    from basecap.train import train

    run_dir = tmp_path_factory.mktemp("sec") / "r"
    train(run_cfg(tiny_recipe_path, steps=2, checkpoint_every=2, warmup_steps=1), run_dir, corpus=tiny_corpus, log=lambda *_: None)
    return run_dir


@pytest.fixture
def nothing_builds(monkeypatch):
    """Any corpus build, source fetch or subprocess fails the test."""
    def forbidden(*a, **k):
        raise AssertionError("reading a run directory built, fetched or ran something")

    monkeypatch.setattr("basecap.data.build.build_corpus", forbidden)
    monkeypatch.setattr("basecap.data.build.prepare_source", forbidden)
    monkeypatch.setattr("basecap.data.sources.prepare_source", forbidden)
    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)


def test_eval_opens_the_recorded_corpus_by_key(trained_run, tiny_corpus, nothing_builds):
    corpus = run_corpus(json.loads((trained_run / "run.json").read_text()))
    assert corpus.dir == tiny_corpus.dir


def test_eval_without_the_corpus_names_the_build_command(trained_run, tiny_recipe_path, tmp_path, monkeypatch, capsys, nothing_builds):
    monkeypatch.setenv("BASECAP_HOME", str(tmp_path / "empty_home"))
    assert main(["eval", str(trained_run)]) == 2
    err = capsys.readouterr().err
    assert f"basecap data build {tiny_recipe_path}" in err and "never builds" in err
    assert not (tmp_path / "empty_home").exists()


@pytest.mark.parametrize("name", ["../../../etc", "tiny-0123456789abcdef/../x", "/abs/path", None, "tiny-0123456789abcdef\n"])
def test_a_forged_corpus_name_is_refused(name, tmp_path):
    with pytest.raises(CorpusMissing, match="no valid corpus folder"):
        open_built_corpus(name, "default", tmp_path)


def test_export_and_the_lm_eval_subject_open_the_corpus_by_key(trained_run, tmp_path, monkeypatch, nothing_builds):
    from basecap.eval.suites import load_subject

    assert load_subject(trained_run, log=lambda *_: None).corpus.name.startswith("tiny-")
    monkeypatch.setenv("BASECAP_HOME", str(tmp_path / "empty_home"))
    with pytest.raises(CorpusMissing, match="basecap data build"):
        load_subject(trained_run, log=lambda *_: None)


# ---- the test harness ---------------------------------------------------------------------------
def test_the_suite_reaches_no_network():
    # The guard's class is matched by name, not looked up as a module: tests/interp has a conftest.py of
    # its own, and which of the two holds the name "conftest" in sys.modules depends on collection order.
    with socket.socket() as s, pytest.raises(OSError, match="may not reach the network.*192.0.2.1") as blocked:
        s.connect(("192.0.2.1", 80))  # TEST-NET-1: would hang or fail slowly, not raise at once
    assert type(blocked.value).__name__ == "NetworkBlocked"
    with socket.socket() as s, pytest.raises(OSError, match="may not reach the network") as blocked:
        s.connect_ex(("example.com", 443))
    assert type(blocked.value).__name__ == "NetworkBlocked"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=5):
            pass


MISSING_EXTRA = """
import pytest

def test_needs_an_extra():
    pytest.importorskip("basecap_no_such_package")

def test_needs_cuda():
    pytest.skip("needs a CUDA device")
"""


@pytest.mark.parametrize("ci", ["", "1"])
def test_a_missing_extra_fails_under_ci(ci, tmp_path):
    (tmp_path / "test_extra.py").write_text(MISSING_EXTRA)
    env = {**os.environ, "CI": ci, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "-rs", str(tmp_path / "test_extra.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    if ci:
        assert r.returncode == 1 and "1 failed, 1 skipped" in r.stdout and "declared test extra is missing" in r.stdout, r.stdout[-2000:]
    else:
        assert r.returncode == 0 and "2 skipped" in r.stdout, r.stdout[-2000:]


def test_ci_script_sets_ci():
    root = Path(__file__).resolve().parents[1]
    assert "CI" in (root / "scripts" / "test.sh").read_text()
    assert shutil.which("bash") is None or "scripts/test.sh" in (root / ".ci" / "run").read_text()
