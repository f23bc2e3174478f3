"""The shape of the house, read from the source with ``ast``: no import cycle between modules of
basecap (imports inside functions count), no module importing a layer above its own (docs/architecture.md),
and no mixer module importing another mixer module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = "basecap"


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its __init__.py)."""
    out = {}
    for path in sorted((SRC / PKG).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    """The module of the package that ``name`` denotes: itself, else its longest existing prefix."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every module of the package that ``module`` imports, at top level or inside functions; relative
    imports resolved, ``from pkg import name`` counted as an import of the submodule ``pkg.name`` when it is one."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        found |= {t for n in names if n.split(".")[0] == PKG and (t := _target(n)) and t != module}
    return found


def import_graph() -> dict[str, set[str]]:
    return {m: imports_of(m) for m in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# the layers of docs/architecture.md, bottom first: a module may import its own layer and the ones below
LAYERS = [
    ["config_base", "atomic", "records", "ops", "kernels", "distributed", "presets"],
    ["data", "mixers", "tracking"],
    ["model", "matching", "config"],
    ["rundir", "checkpoint", "peak", "optim"],
    ["train", "cooldown", "replay", "eval", "report", "reuse", "compile"],
    ["experiment", "bench", "hf", "catalog", "plan", "sweep", "tune", "scorecard", "compare", "leaderboard"],
    ["cli", "__main__", "lm_eval_plugin"],
]


def layer_of(module: str) -> int | None:
    """The layer of a module: that of the longest listed name it is (or lies under); the package root is 0."""
    if module == PKG:
        return 0
    best = None
    for i, names in enumerate(LAYERS):
        for name in names:
            full = f"{PKG}.{name}"
            if (module == full or module.startswith(full + ".")) and (best is None or len(full) > best[1]):
                best = (i, len(full))
    return None if best is None else best[0]


def registered_mixer_modules() -> set[str]:
    """Modules named in the registries ``_MIXERS`` and ``_MLPS`` of basecap.mixers (read, not imported)."""
    tree = ast.parse(MODULES[f"{PKG}.mixers"].read_text())
    mods = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id in ("_MIXERS", "_MLPS") for t in targets) and isinstance(node.value, ast.Dict):
            mods |= {f"{PKG}.mixers.{v.value.split(':')[0]}" for v in node.value.values if isinstance(v, ast.Constant)}
    return mods


def test_the_reader_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert f"{PKG}.config_base" in graph[f"{PKG}.config.run"]  # top-level, relative, two levels up
    assert f"{PKG}.eval.ood" in graph[f"{PKG}.train"]  # relative into a subpackage
    assert f"{PKG}.data" in graph[f"{PKG}.train"]  # inside a function
    assert f"{PKG}.mixers.attention" in registered_mixer_modules()


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles between modules of basecap:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("mixer", sorted(registered_mixer_modules()))
def test_no_mixer_imports_another_mixer(mixer):
    if mixer not in MODULES:
        pytest.skip(f"{mixer} is registered but has no file")
    others = (imports_of(mixer) & registered_mixer_modules()) - {mixer}
    assert not others, f"{mixer} imports other mixer module(s) {sorted(others)}; shared parts belong in the mixer kit"


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if layer_of(m) is None)
    assert not missing, f"modules with no layer in tests/test_imports.py LAYERS (and docs/architecture.md): {missing}"


def test_no_import_points_up_the_layers():
    up = [f"{m} (layer {layer_of(m) + 1}) imports {d} (layer {layer_of(d) + 1})"
          for m, deps in sorted(import_graph().items()) for d in sorted(deps)
          if layer_of(m) is not None and layer_of(d) is not None and layer_of(d) > layer_of(m)]
    assert not up, "imports that point up the layers of docs/architecture.md:\n" + "\n".join(up)
