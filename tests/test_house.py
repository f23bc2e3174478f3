"""The house rules of docs/architecture.md ("House rules"), read from the source with ``ast``: module and function
size, the number of parameters, no private name imported across modules, no re-export outside a package's
``__init__``. The layers and import cycles are tests/test_imports.py's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "basecap"
FILES = sorted(SRC.rglob("*.py"))

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_POSITIONAL = 6
MAX_PARAMETERS = 12

# Signatures fixed by someone else's calling convention, each with its reason.
SIGNATURE_EXEMPT = {
    # Triton kernels take one argument per pointer, stride and block size: the launcher passes them positionally.
    "kernels/top1_triton.py": "Triton kernel signatures",
    # transformers calls forward(input_ids, attention_mask, ...) with its own argument order.
    "hf/modeling.py": "the transformers forward signature",
}
# Tensor math takes its operands positionally (q, k, v, the decay, the gate, the state: fla's and torch's own
# convention, and an autograd Function's forward cannot take keyword-only arguments): only the total applies there.
TENSOR_MATH = ("ops/", "kernels/", "mixers/")


def _rel(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _parsed():
    for path in FILES:
        yield path, ast.parse(path.read_text(), str(path))


def test_modules_stay_small():
    long = {_rel(p): n for p in FILES if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {long}"


def test_functions_stay_short():
    long = {
        f"{_rel(p)}:{f.name}": f.end_lineno - f.lineno + 1
        for p, tree in _parsed()
        for f in _functions(tree)
        if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (extract named steps): {long}"


def _counts(f: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    positional = [a.arg for a in f.args.posonlyargs + f.args.args if a.arg not in ("self", "cls")]
    return len(positional), len(positional) + len(f.args.kwonlyargs)


def test_signatures_stay_short():
    bad = {}
    for p, tree in _parsed():
        if _rel(p) in SIGNATURE_EXEMPT:
            continue
        for f in _functions(tree):
            positional, total = _counts(f)
            too_many_positional = positional > MAX_POSITIONAL and not _rel(p).startswith(TENSOR_MATH)
            if too_many_positional or total > MAX_PARAMETERS:
                bad[f"{_rel(p)}:{f.name}"] = (positional, total)
    assert not bad, (
        f"(positional, total) parameters over ({MAX_POSITIONAL}, {MAX_PARAMETERS}): make the rest keyword-only, "
        f"or group settings that travel together in a dataclass: {bad}"
    )


def _is_own(node: ast.ImportFrom) -> bool:
    return bool(node.level) or (node.module or "").split(".")[0] == "basecap"


def test_no_private_name_is_imported_across_modules():
    bad = [
        f"{_rel(p)}: {node.module or '.'}.{a.name}"
        for p, tree in _parsed()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and _is_own(node)
        for a in node.names
        if a.name.startswith("_") and not a.name.startswith("__")
    ]
    assert not bad, f"a private name belongs to its module; make it public where it is defined: {bad}"


def test_only_a_package_re_exports():
    """A module that is not a package's ``__init__`` lists in ``__all__`` only what it defines, and does not
    import a name ``as`` itself: callers import a name from where it lives."""
    bad = []
    for p, tree in _parsed():
        if p.name == "__init__.py":
            continue
        imported = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and _is_own(node):
                for a in node.names:
                    imported[a.asname or a.name] = node.module
                    if a.asname == a.name:
                        bad.append(f"{_rel(p)}: imports {a.name} as itself")
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names = [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
                bad += [f"{_rel(p)}: __all__ lists {n}, imported from {imported[n]}" for n in names if n in imported]
    assert not bad, f"re-exports outside a package's __init__: {bad}"


@pytest.mark.parametrize("rule", [MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_POSITIONAL, MAX_PARAMETERS])
def test_the_rules_are_written_down(rule):
    text = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    assert "## House rules" in text and str(rule) in text.split("## House rules")[1].split("\n## ")[0]
