"""Archive sources: a pip sdist comes from the index's simple API (no pip, no build backend), its SHA-256
is required and checked before the archive is kept; names that are URLs or paths are refused."""

from __future__ import annotations

import hashlib
import http.server
import io
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from basecap.config_base import ConfigError
from basecap.data import DataError, recipe_from_dict
from basecap.data.sources import prepare_source, read_source

SETUP_PY = "open({marker!r}, 'w').write('the build backend ran')\n"


def sdist_bytes(marker: Path) -> bytes:
    """demo_pkg-1.0.tar.gz: a text member, and a setup.py that leaves ``marker`` if anything runs it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in (("demo_pkg-1.0/README.txt", "A small package of plain words for a corpus.\n"),
                           ("demo_pkg-1.0/setup.py", SETUP_PY.format(marker=str(marker)))):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A PEP 503 simple index on loopback serving demo-pkg 1.0 as an sdist."""
    marker = tmp_path / "code_ran"
    sdist = sdist_bytes(marker)
    pages = {"/simple/demo-pkg/": b'<html><body><a href="../../files/demo_pkg-1.0.tar.gz#sha256=x">demo_pkg-1.0.tar.gz</a>'
             b'<a href="../../files/demo_pkg-1.0-py3-none-any.whl">wheel</a></body></html>',
             "/files/demo_pkg-1.0.tar.gz": sdist}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/simple")

    def no_subprocess(*a, **k):
        raise AssertionError(f"a subprocess ran: {a}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    yield hashlib.sha256(sdist).hexdigest(), marker
    server.shutdown()


def pip_recipe(sha256: str | None, package: str = "demo-pkg", version: str = "1.0"):
    src = {"kind": "pip_sdist", "domain": "prose", "package": package, "version": version, "include": ["*.txt"]}
    if sha256 is not None:
        src["sha256"] = sha256
    return recipe_from_dict({"name": "fetch", "domains": {"prose": {}}, "sources": [src]})


def test_an_sdist_is_fetched_from_the_index_and_nothing_runs(index, tmp_path):
    sha, marker = index
    prep = prepare_source(pip_recipe(sha).sources[0], 0, tmp_path / "home", log=lambda m: None)
    assert prep.archive.name == "demo_pkg-1.0.tar.gz" and prep.fingerprint == sha
    docs = list(read_source(prep))
    assert [d.text for d in docs] == ["A small package of plain words for a corpus.\n"]
    assert not marker.exists()


def test_a_wrong_sha256_is_refused_before_anything_is_kept(index, tmp_path):
    with pytest.raises(DataError, match="the recipe expects 0{64}; nothing was unpacked"):
        prepare_source(pip_recipe("0" * 64).sources[0], 0, tmp_path / "home", log=lambda m: None)
    assert not [p for p in (tmp_path / "home" / "downloads" / "pip").iterdir()]


def test_a_tampered_cached_archive_is_refused(index, tmp_path):
    sha, _ = index
    prep = prepare_source(pip_recipe(sha).sources[0], 0, tmp_path / "home", log=lambda m: None)
    prep.archive.write_bytes(b"swapped")
    with pytest.raises(DataError, match="SHA-256"):
        prepare_source(pip_recipe(sha).sources[0], 0, tmp_path / "home", log=lambda m: None)


@pytest.mark.parametrize("kind", ["pip_sdist", "npm_pack"])
def test_archive_sources_need_a_sha256(kind):
    with pytest.raises(ConfigError, match=r"sources\.0.*sha256"):
        recipe_from_dict({"name": "r", "domains": {"d": {}},
                          "sources": [{"kind": kind, "domain": "d", "package": "abc", "version": "1.0.0"}]})


@pytest.mark.parametrize("kind,package,version", [
    ("pip_sdist", "https://evil.example/x.tar.gz", "1.0"), ("pip_sdist", "../x", "1.0"), ("pip_sdist", "x", "1.0; rm -rf"),
    ("npm_pack", "github:user/repo", "1.0.0"), ("npm_pack", "x", "file:../folder"), ("npm_pack", "x", "1.0.0\n"),
])
def test_archive_specs_that_would_build_are_refused(kind, package, version):
    with pytest.raises(ConfigError, match=r"sources\.0\.\w+\.(package|version)"):
        recipe_from_dict({"name": "r", "domains": {"d": {}},
                          "sources": [{"kind": kind, "domain": "d", "package": package, "version": version, "sha256": "0" * 64}]})


def test_the_default_recipe_pins_every_archive():
    from basecap.data import load_recipe

    assert all(len(s.sha256) == 64 for s in load_recipe("default").sources if s.kind in ("pip_sdist", "npm_pack"))


def test_no_pip_download(tmp_path):
    assert "pip download" not in (Path(__file__).parents[1] / "src" / "basecap" / "data" / "fetch.py").read_text().replace(
        "``pip download`` is not used", "")
