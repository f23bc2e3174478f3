"""The interpreter tier: fla's and basecap's real Triton kernels run by Triton's interpreter on CPU.

These tests run only in a process started with ``TRITON_INTERPRET=1`` (``tests/test_triton_interp.py``
starts one; by hand: ``TRITON_INTERPRET=1 python -m pytest tests/interp``). In any other pytest session
the folder is not collected, so the shims (``shims.py``) never touch a process that uses Triton
normally. Inside the tier the fast paths' device gates admit CPU tensors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERP:
    collect_ignore_glob = ["*.py"]
else:
    sys.path.insert(0, str(Path(__file__).parent))
    import shims

    shims.enable()


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.triton_interp)


@pytest.fixture(autouse=True)
def kernels_on_cpu(monkeypatch):
    """The fast paths' device gates admit CPU inside the tier (only here)."""
    from basecap.kernels import fla as fk
    from basecap.kernels import top1_cuda

    monkeypatch.setattr(fk, "KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(top1_cuda, "KERNEL_DEVICES", ("cuda", "cpu"))
    fk.fla_import_error.cache_clear()
    yield
    fk.fla_import_error.cache_clear()


@pytest.fixture
def launches():
    """Counts of Triton kernel launches, ``{"module.kernel": n}``, during the test."""
    with shims.count_launches() as counts:
        yield counts
