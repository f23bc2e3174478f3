"""The interpreter tier (``tests/interp``): the real Triton kernels of every fast path, run by Triton's
interpreter on CPU in a process of their own (``TRITON_INTERPRET=1`` must be set before Triton is
imported, and the tier's shims must not reach this process). What it proves: docs/kernels.md.

Run alone: ``python -m pytest tests -m triton_interp`` (or ``TRITON_INTERPRET=1 python -m pytest tests/interp``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIER = ROOT / "tests" / "interp"
BUDGET_S = 240  # the tier's CI budget (measured: see docs/kernels.md)

pytestmark = pytest.mark.triton_interp


def _shims_version() -> str:
    return re.search(r'TRITON_VERSION = "([^"]+)"', (TIER / "shims.py").read_text()).group(1)


def test_triton_pin_matches_the_shims():
    """The shims are written against one Triton version: the one the test extra pins."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"triton=={_shims_version()}"' in pyproject
    if importlib.util.find_spec("triton") is not None:
        assert importlib.metadata.version("triton") == _shims_version()


def test_interpreter_tier(tmp_path):
    """Runs ``tests/interp`` in a fresh process with ``TRITON_INTERPRET=1``; fails on any failure, error or
    skip there (a skipped kernel check is an unchecked kernel), and when nothing ran."""
    for module in ("triton", "fla"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    xml = tmp_path / "interp.xml"
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "pytest", str(TIER), "-q", "-rfEs", "-p", "no:cacheprovider", "-o", "addopts=",
           f"--junitxml={xml}", "-W", "ignore::UserWarning"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2 * BUDGET_S)
    wall = time.perf_counter() - t0
    out = (proc.stdout + proc.stderr)[-6000:]
    assert xml.exists(), f"the tier wrote no report (exit {proc.returncode}):\n{out}"
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else next(suite.iter("testsuite"))
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    print(f"interpreter tier: {n['tests']} tests in {wall:.0f} s ({n})")
    assert proc.returncode == 0 and n["tests"] > 0 and not (n["failures"] or n["errors"] or n["skipped"]), out
