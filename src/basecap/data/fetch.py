"""Fetching archive sources (pip sdists, npm packages) into the data home, verified before they are kept.

Only ``basecap data build`` / ``basecap run`` on a recipe the user named reach this module; reading a
run directory never does (``home.py``). Nothing fetched is executed:

- a pip sdist is downloaded from the package index's simple API (PEP 691 JSON, or PEP 503 HTML), the
  index pip is configured with (``PIP_INDEX_URL`` or ``pip config``'s ``index-url``, else PyPI).
  ``pip download`` is not used: to read an sdist's metadata it runs the package's build backend, i.e.
  the package's own code, and it has no switch that avoids this;
- an npm package is packed from the registry by ``npm pack --ignore-scripts`` (a name and an exact
  version only: no git, URL or folder spec, which npm would build);
- the archive's SHA-256 must equal the recipe's before the archive enters the cache, and is checked
  again each time the cached archive is used, before anything is unpacked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

from .source_base import DataError, SourceUnavailable

PYPI_SIMPLE = "https://pypi.org/simple"


def run_tool(cmd: list[str], cwd: str, what: str) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    except FileNotFoundError:
        raise SourceUnavailable(f"{cmd[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise SourceUnavailable(f"{what} timed out") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        raise SourceUnavailable(f"{what} failed: {lines[-1] if lines else proc.returncode}")


def index_url() -> str:
    """The simple-API index pip is configured with (``PIP_INDEX_URL``, then ``pip config``), else PyPI."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith(".index-url"):
            return value.strip().strip("'\"")
    return PYPI_SIMPLE


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sdist_url(package: str, version: str, index: str) -> str:
    """The URL of ``package``'s sdist of ``version`` (``.tar.gz`` or ``.zip``) on a simple-API index."""
    page = f"{index.rstrip('/')}/{_norm(package)}/"
    req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            body, ctype = r.read(), r.headers.get("Content-Type", "")
    except OSError as e:
        raise SourceUnavailable(f"package index {page}: {e}") from None
    if "json" in ctype:
        links = [f["url"] for f in json.loads(body).get("files", [])]
    else:
        links = re.findall(r'href\s*=\s*"([^"]+)"', body.decode("utf-8", "replace"))
    want = _norm(f"{package}-{version}")
    for link in links:
        url = urllib.parse.urljoin(page, link.replace("&amp;", "&")).split("#", 1)[0]
        fname = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        for ext in (".tar.gz", ".zip"):
            if fname.endswith(ext) and _norm(fname[: -len(ext)]) == want:
                return url
    raise SourceUnavailable(f"no sdist of {package} {version} on {page}")


def _download(url: str, dest: Path) -> None:
    if urllib.parse.urlparse(url).scheme not in ("https", "http", "file"):
        raise SourceUnavailable(f"refusing to download {url}")
    try:
        with urllib.request.urlopen(url, timeout=300) as r, open(dest, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except OSError as e:
        raise SourceUnavailable(f"download of {url} failed: {e}") from None


def fetch_archive(kind: str, package: str, version: str, sha256: str, home: Path, log: Callable) -> Path:
    """The archive of a pip sdist (``kind="pip"``) or an npm package, downloaded once into
    ``<home>/downloads/<kind>/<package>-<version>/`` and kept only if its SHA-256 is ``sha256``."""
    folder = home / "downloads" / kind / f"{package.replace('/', '_').lstrip('@')}-{version}"
    cached = [p for p in folder.glob("*") if not p.name.startswith(".")] if folder.is_dir() else []
    if len(cached) == 1:
        return cached[0]
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent)
    try:
        if kind == "pip":
            url = sdist_url(package, version, index_url())
            log(f"  downloading {package}=={version} from {url}")
            _download(url, Path(tmp) / urllib.parse.unquote(url.rsplit("/", 1)[-1]))
        else:
            if shutil.which("npm") is None:
                raise SourceUnavailable("npm not found")
            log(f"  downloading {package}@{version} with npm pack")
            run_tool(
                ["npm", "pack", f"{package}@{version}", "--pack-destination", tmp, "--ignore-scripts", "--silent"],
                tmp,
                f"npm download of {package} {version}",
            )
        got = [p for p in Path(tmp).iterdir() if p.is_file()]
        if len(got) != 1:
            raise SourceUnavailable(f"expected one archive from {kind}, got {[p.name for p in got]}")
        check_sha256(got[0], sha256, f"{kind} {package} {version}")
        try:
            os.rename(tmp, folder)
        except OSError:  # another build fetched it meanwhile
            if not folder.is_dir():
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return folder / got[0].name


def check_sha256(path: Path, expected: str, what: str) -> str:
    """``path``'s SHA-256, which must be ``expected`` (DataError naming both otherwise)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != expected:
        raise DataError(
            f"{what}: {path.name} has SHA-256 {digest}, the recipe expects {expected}; "
            "nothing was unpacked (a changed upload, or a wrong sha256 in the recipe)"
        )
    return digest
