"""Makes ``lm_eval --model basecap`` work without importing basecap first.

lm-evaluation-harness 0.4.13 has no plugin discovery for model classes: a model is found only if
its module was imported before lm-eval resolves ``--model``. basecap installs a one-line ``.pth``
file that calls :func:`install` at interpreter start; it adds an import hook that waits for
``lm_eval.models`` (lm-eval's own registrations) to finish loading and then registers the name
``basecap`` as a lazy placeholder for :class:`basecap.eval.harness.BasecapLM`. Nothing is imported
until lm-eval asks for the model, so interpreter start-up is unaffected, and lm-eval's own models
stay registered (registering before them would hide them, see LOG.md).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings

TARGET = "basecap.eval.harness:BasecapLM"


def register() -> None:
    """Register the lazy placeholder with lm-eval's model registry (idempotent)."""
    from lm_eval.api.registry import model_registry

    if "basecap" not in model_registry.keys():
        model_registry.register("basecap", target=TARGET)


def _safe_register() -> None:
    try:
        register()
    except Exception as e:  # noqa: BLE001 - never break lm-eval itself; `import basecap.eval.harness` still works
        warnings.warn(f"basecap could not register its lm-eval model: {e}", stacklevel=2)


class _AfterLmEvalModels(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "lm_eval.models":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _safe_register()

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]  # this spec's loader only: register after lm-eval's models
        return spec


def install() -> None:
    if not any(isinstance(f, _AfterLmEvalModels) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterLmEvalModels())
    if "lm_eval.models" in sys.modules:  # installed late: lm-eval's models are already there
        _safe_register()


PTH_NAME = "basecap-lm-eval.pth"
PTH_LINE = "import basecap.lm_eval_plugin as _basecap_plugin; _basecap_plugin.install()\n"


def write_pth() -> str:
    """Write the ``.pth`` file into this environment's site-packages and return its path.

    A wheel install of basecap ships the file already; an editable install (``pip install -e``) does
    not carry extra files, so ``scripts/setup.sh`` runs :func:`main` after it.
    """
    import sysconfig
    from pathlib import Path

    path = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    if not path.is_file() or path.read_text() != PTH_LINE:
        path.write_text(PTH_LINE)
    return str(path)


def main() -> None:
    print(f"lm-eval plugin: {write_pth()} (lm_eval --model basecap now finds basecap)")
    try:
        from .eval.harness import prepare_task_dir
    except ImportError:  # lm-eval is not installed: nothing more to prepare
        return
    print(f"basecap's lm-eval tasks: lm_eval ... --include_path {prepare_task_dir()}")
