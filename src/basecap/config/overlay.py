"""Typed overlays: the part of a run's section that one table of an experiment file sets.

An experiment's ``[data]``, ``[model]``, ``[train]`` and ``[eval]`` tables, the same tables inside a size table
(``[sizes.<s>]``, ``[sizes.<s>.runs.<run>]``) and inside a ``[[runs]]`` entry each hold *some* fields of the run's
``DataConfig``, ``ModelConfig``, ``TrainConfig`` or ``EvalConfig``; the run's section is their merge, in that order.
An overlay is typed by the section it overlays (``DataOverlay`` for ``DataConfig``, ...): every key must be a field
of that section and every value must have the field's type and bounds, checked when the experiment file is loaded,
for every size table, not only the chosen one, and the error names the table (``sizes.small.train.lr: Input should
be greater than 0``). What needs the whole section (a cross-field rule such as ``seq_len <= max_seq_len``, a mixer's
own table) is checked when the run's merged config is validated, still before any compute (``config.run``).

An overlay keeps the values as written (``root``), so the merge, ``experiment.json`` and every run's config are
what the file says; it adds checks, never defaults.
"""

from __future__ import annotations

import difflib
import functools
import types
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin

from pydantic import BaseModel, RootModel, TypeAdapter, ValidationError, model_validator

from ..config_base import Strict, bool_as_number
from ..model import ModelConfig
from .sections import DataConfig, EvalConfig, TrainConfig

__all__ = ["OVERLAYS", "DataOverlay", "EvalOverlay", "ModelOverlay", "SectionOverlay", "TrainOverlay", "check_overlay"]


@functools.cache
def _adapter(section: type[BaseModel], key: str) -> TypeAdapter:
    field = section.model_fields[key]
    annotation: Any = field.annotation
    return TypeAdapter(Annotated[annotation, *field.metadata] if field.metadata else annotation)


def _strict_model(annotation: Any) -> type[Strict] | None:
    """The Strict model of ``annotation`` or of ``X | None`` (a nested table), else None."""
    if get_origin(annotation) in (Union, types.UnionType):
        arms = [a for a in get_args(annotation) if a is not type(None)]
        annotation = arms[0] if len(arms) == 1 else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, Strict) else None


def check_overlay(values: Any, section: type[Strict], where: str) -> None:
    """Raise ValueError, naming ``where`` and the key, unless ``values`` is a table of some of ``section``'s fields,
    each of the field's type (a nested table: some of its own fields, recursively)."""
    if not isinstance(values, dict):
        raise ValueError(f"{where}: expected a table of {section.__name__} fields, got {values!r}")
    for key, value in values.items():
        field = section.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            close = difflib.get_close_matches(str(key), list(section.model_fields), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"{where}.{key}: unknown key ({hint}{section.__name__}'s fields: {', '.join(section.model_fields)})")
        nested = _strict_model(field.annotation)
        if nested is not None and isinstance(value, dict):
            check_overlay(value, nested, f"{where}.{key}")  # a table may set part of a nested one, as of a section
            continue
        if bool_as_number(field.annotation, value):
            raise ValueError(f"{where}.{key}: a boolean is not a number")
        try:
            _adapter(section, key).validate_python(value)
        except ValidationError as e:
            first = e.errors()[0]
            sub = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"] if not str(p).startswith("function-"))
            raise ValueError(f"{where}.{key}{sub}: {first['msg'].removeprefix('Value error, ')} (got {first.get('input', value)!r})") from None


class SectionOverlay(RootModel[dict[str, Any]]):
    """Some fields of one run section (``section``), as written in one table of an experiment file."""

    section: ClassVar[type[Strict]]
    table: ClassVar[str]

    @model_validator(mode="after")
    def _check(self):
        check_overlay(self.root, type(self).section, type(self).table)
        return self

    def __bool__(self) -> bool:
        return bool(self.root)


class DataOverlay(SectionOverlay):
    section = DataConfig
    table = "data"


class ModelOverlay(SectionOverlay):
    section = ModelConfig
    table = "model"


class TrainOverlay(SectionOverlay):
    section = TrainConfig
    table = "train"


class EvalOverlay(SectionOverlay):
    section = EvalConfig
    table = "eval"


OVERLAYS: dict[str, type[SectionOverlay]] = {o.table: o for o in (DataOverlay, ModelOverlay, TrainOverlay, EvalOverlay)}
