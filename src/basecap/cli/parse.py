"""Building blocks of the ``basecap`` command parsers (``study``, ``tools``, ``compare``): a command whose --help is its
handler's docstring, and a registry's names as choices read only when argparse needs them."""

from __future__ import annotations

import argparse
import importlib


class Names:
    """A registry's names as argparse choices, read when argparse first needs them (a value to check,
    or --help), so that building the parser does not import the registry's module (and torch).
    Give the argument a ``metavar``: argparse formats the choices of one without it when it is added."""

    def __init__(self, module: str, attr: str, *extra: str):
        self._module, self._attr, self._extra = module, attr, extra
        self._names: list[str] | None = None

    def _load(self) -> list[str]:
        if self._names is None:
            names = getattr(importlib.import_module(self._module), self._attr)
            self._names = [*self._extra, *(names() if callable(names) else names)]
        return self._names

    def __iter__(self):
        return iter(self._load())

    def __contains__(self, name) -> bool:
        return name in self._load()


def command(sub, name: str, fn, summary: str, description: str | None = None) -> argparse.ArgumentParser:
    """The parser of a command whose arguments go to ``fn``; its --help describes it with ``fn``'s docstring."""
    sp = sub.add_parser(name, help=summary, description=description or fn.__doc__)
    sp.set_defaults(fn=fn)
    return sp
