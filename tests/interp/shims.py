"""Triton's interpreter (``TRITON_INTERPRET=1``) made to run fla's and basecap's real Triton kernels on CPU
tensors, for the interpreter test tier (docs/kernels.md, "Interpreter tier").

Two test-only shims, both written against the Triton version pinned in the ``test`` extra
(``TRITON_VERSION``); :func:`enable` refuses any other version, so an upgrade re-checks them:

1. Autotuning. ``Autotuner.run`` benchmarks every config through the GPU driver, which on a CPU-only
   machine fails with "0 active drivers". ``prune_configs`` is cut to the first config, so the
   autotuner takes its single-config path (no benchmark). Which config runs does not change what the
   interpreter computes: it ignores ``num_warps`` / ``num_stages``; block sizes in configs are honoured.
2. Loop variables. The interpreter rewrites a kernel's AST (``ASTTransformer``) so that assignments
   produce Triton tensors, but leaves the variable of ``for i in range(...)`` / ``tl.range(...)`` a
   Python int, so ``i.to(tl.int64)`` (fla uses it for 64-bit offsets) raises AttributeError. A
   ``visit_For`` converts the loop variable with ``interpreter_semantic.to_tensor`` at the top of each
   iteration, as the compiler sees it. ``tl.static_range`` loops are left alone (their variable is a
   compile-time constant in the compiler too).

Also here: :func:`count_launches`, which counts kernel launches by the module that defines the kernel,
so a test can prove that real Triton kernels ran (a silent fallback to a PyTorch path launches none).
"""

from __future__ import annotations

import ast
import collections
import contextlib
import os
import sys

TRITON_VERSION = "3.9.0"  # the pin in pyproject.toml's test extra; the shims were written against it


def enable() -> None:
    """Sets ``TRITON_INTERPRET=1`` (Triton reads it at import) and installs both shims. Must run before
    anything imports Triton."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    elif os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set; the interpreter tier "
                           "must run in its own process (tests/test_triton_interp.py starts it)")
    import triton
    from triton.runtime import autotuner, interpreter

    if triton.__version__ != TRITON_VERSION:
        raise RuntimeError(f"the interpreter shims were written against triton {TRITON_VERSION}, found "
                           f"{triton.__version__}: re-check tests/interp/shims.py and the pin in pyproject.toml")
    autotuner.Autotuner.prune_configs = _first_config
    interpreter.ASTTransformer.visit_For = _visit_for


def _first_config(self, kwargs):
    """Shim 1: the autotuner's pruning keeps the first config only (no GPU benchmark)."""
    configs = self.configs
    if self.early_config_prune:
        configs = self.early_config_prune(self.configs, self.nargs, **kwargs) or configs
    return configs[:1]


def _is_static_range(it: ast.expr) -> bool:
    return isinstance(it, ast.Call) and getattr(it.func, "attr", getattr(it.func, "id", None)) == "static_range"


def _visit_for(self, node: ast.For):
    """Shim 2: ``for i in range(...)`` -> ``for i in range(...): i = interpreter_semantic.to_tensor(i, False)``."""
    node = self.generic_visit(node)
    if isinstance(node.target, ast.Name) and not _is_static_range(node.iter):
        convert = ast.Assign(
            targets=[ast.Name(id=node.target.id, ctx=ast.Store())],
            value=ast.Call(func=ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()),
                                              attr="to_tensor", ctx=ast.Load()),
                           args=[ast.Name(id=node.target.id, ctx=ast.Load()), ast.Constant(value=False)],
                           keywords=[]))
        node.body.insert(0, ast.copy_location(convert, node))
    return node


@contextlib.contextmanager
def count_launches():
    """Counts interpreted kernel launches as ``{"module.kernel_name": n}`` while the block runs."""
    from triton.runtime.interpreter import InterpretedFunction

    counts: collections.Counter = collections.Counter()
    run = InterpretedFunction.run

    def counted(self, *args, grid, warmup, **kwargs):
        if not warmup:
            counts[f"{self.fn.__module__}.{self.fn.__name__}"] += 1
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = counted
    try:
        yield counts
    finally:
        InterpretedFunction.run = run
