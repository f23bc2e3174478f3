"""flash-linear-attention's pure-PyTorch reference files as an independent oracle (test dependency only)."""

import importlib.util
from pathlib import Path

import pytest


def fla_naive(relpath: str):
    """Load ``fla/ops/<relpath>`` as a standalone module (importing ``fla`` itself needs Triton)."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed: no independent oracle")
    pytest.importorskip("einops")  # the fla reference files import einops
    path = Path(list(spec.submodule_search_locations)[0]) / "ops" / relpath
    mod_spec = importlib.util.spec_from_file_location("fla_naive_" + relpath.replace("/", "_")[:-3], path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod
