"""Typed, strict configuration base shared by every config in basecap.

Every config is a pydantic model that forbids unknown keys and validates on construction, so a
typo or an impossible value fails before any compute with a message naming the key. Values are
strict: a boolean is never read as a number (``steps = true`` is an error, not 1) and floats are
finite (``lr = inf`` and nan are errors). Every name a user chooses (runs, suites, experiments,
sizes, domains, recipes) names files and folders, so all of them match one pattern, ``NAME``.
"""

from __future__ import annotations

import copy
import re
import tomllib
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

NAME_MAX = 64
# letters, digits and _ . + -, not starting with . + or - (no hidden files, nothing read as an option),
# no path separator; always matched with re.fullmatch (``$`` would accept a trailing newline)
NAME = rf"[A-Za-z0-9_][A-Za-z0-9_.+-]{{0,{NAME_MAX - 1}}}"
# a swept value as it appears in a run name (0.003, -1, 1e-06, true, a mixer name)
LABEL = r"[A-Za-z0-9_.+-]{1,64}"
# a run of a sweep is named after its point: the run's name, then each swept key's label and value
# (transformer_pp@lr=0.003,d_model=64); "@", "=" and "," appear nowhere else, so the name reads back unambiguously
RUN_NAME = rf"{NAME}(@{LABEL}={LABEL}(,{LABEL}={LABEL})*)?"
RUN_NAME_MAX = 200  # a run folder is <name>-s<seed>: well under the 255 bytes of a file name


class ConfigError(ValueError):
    """A configuration problem, phrased for the user (names the key and the allowed values)."""


def name_problem(value: Any, what: str = "names") -> str | None:
    """Why ``value`` is not a valid user-chosen name (``NAME``), or None when it is one. ``what``: the kind
    of name in the message ("run names")."""
    if not isinstance(value, str):
        return f"expected a name (a string), got {value!r}"
    if re.fullmatch(NAME, value):
        return None
    rule = (
        f"{what} may use letters, digits and _ . + - only, not starting with . + or -, at most {NAME_MAX} "
        "characters (a name becomes a file or folder name)"
    )
    if len(value) > NAME_MAX:
        return f"{value[:20]!r}... is {len(value)} characters long; {rule}"
    bad = "".join(dict.fromkeys(c for c in value if not re.fullmatch(r"[A-Za-z0-9_.+-]", c)))
    if bad:
        return f"{value!r} contains {bad!r}; {rule}"
    return f"{value!r} is empty; {rule}" if not value else f"{value!r} starts with {value[0]!r}; {rule}"


def check_name(value: Any, key: str, what: str = "names") -> str:
    """``value`` when it is a valid name, else a ConfigError naming ``key``."""
    problem = name_problem(value, what)
    if problem:
        raise ConfigError(f"{key}: {problem}")
    return value


def valid_name(value: Any, what: str = "names") -> str:
    """``value`` when it is a valid name, else a ValueError saying why (a field validator's: pydantic adds the key)."""
    problem = name_problem(value, what)
    if problem:
        raise ValueError(problem)
    return value


def run_name_problem(value: Any) -> str | None:
    """Why ``value`` is not a run name (a name, or a sweep point's ``name@label=value,...``), or None."""
    if isinstance(value, str) and "@" in value and len(value) <= RUN_NAME_MAX and re.fullmatch(RUN_NAME, value):
        return None
    problem = name_problem(value.split("@")[0] if isinstance(value, str) else value, "run names")
    if problem is None and isinstance(value, str) and "@" in value:
        return f"{value!r}: a sweep point's name is name@key=value,... (at most {RUN_NAME_MAX} characters)"
    return problem


def key_labels(keys: list[str]) -> dict[str, str]:
    """Each swept key's label in run names: its shortest dotted suffix that no other swept key ends with
    (train.lr -> lr; model.mixer.window -> window), in the order of the sweep."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if not any(o != key and (o == suffix or o.endswith("." + suffix)) for o in keys):
                out[key] = suffix
                break
    return out


def value_label(key: str, value) -> str:
    """A swept value as it appears in run names: booleans true/false, integers as written, floats as Python's
    shortest round-trip repr (0.003, 1e-06), names as they are."""
    if isinstance(value, (bool, int)):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str) and re.fullmatch(LABEL, value):
        return value
    raise ConfigError(
        f"sweep.{key}: {value!r} cannot name a run; swept values are numbers, booleans or names of "
        "at most 64 letters, digits and _ . + - (sweep tables through [[runs]] entries)"
    )


def sweep_name(name: str, point: dict[str, Any], labels: dict[str, str]) -> str:
    """``name@label=value,...`` over the swept keys of ``point`` in the sweep's order; ``name`` for no point."""
    parts = [f"{label}={value_label(key, point[key])}" for key, label in labels.items() if key in point]
    return f"{name}@{','.join(parts)}" if parts else name


def bool_as_number(annotation: Any, value: Any) -> bool:
    """Whether ``value`` holds a boolean where ``annotation`` admits only numbers (pydantic reads True as 1)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return bool_as_number(args[0], value)
    if origin in (Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        return bool(arms) and all(bool_as_number(a, value) for a in arms)
    if isinstance(value, bool):
        return annotation in (int, float)
    if isinstance(value, (list, tuple)) and origin in (list, tuple, set, frozenset) and args:
        if origin is tuple and args[-1] is not Ellipsis:
            return any(bool_as_number(a, v) for a, v in zip(args, value))
        return any(bool_as_number(args[0], v) for v in value)
    if isinstance(value, dict) and origin is dict and len(args) == 2:
        return any(bool_as_number(args[1], v) for v in value.values())
    return False


class Strict(BaseModel):
    """Base for all basecap configs: unknown keys are errors, assignments are re-validated, a boolean is
    never a number and floats are finite."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_as_number(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key) if isinstance(key, str) else None
                if field is not None and bool_as_number(field.annotation, value):
                    raise PydanticCustomError("bool_as_number", "a boolean is not a number", {"field": key, "value": value})
        return data


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    lines = []
    for e in err.errors():
        parts = [str(p) for p in e["loc"] if not str(p).startswith("function-")]
        value, got = e.get("input"), e["type"] != "extra_forbidden" and "input" in e
        if e["type"] == "bool_as_number":  # raised for the whole table: the field and its value are in the context
            parts, value, got = parts + [e["ctx"]["field"]], e["ctx"]["value"], True
        loc = ".".join(parts)
        key = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        if loc and msg.startswith(loc + "."):  # a check that names its own key's path (config.overlay)
            key, got = prefix, False
        got = got and not isinstance(value, dict)
        lines.append(f"  {key + ': ' if key else ''}{msg}" + (f" (got {value!r})" if got else ""))
    return "invalid configuration:\n" + "\n".join(lines)


def flatten_keys(table: dict, prefix: str = "") -> dict[str, Any]:
    """``train.lr = [...]`` in a TOML table reads as {"train": {"lr": [...]}}: the same as {"train.lr": [...]}."""
    out = {}
    for k, v in table.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten_keys(v, key) if isinstance(v, dict) else {key: v})
    return out


def deep_merge(base: dict, over: dict) -> dict:
    """Recursive merge. A table whose ``name`` changes (e.g. a different mixer) replaces the base table
    instead of merging, so one mixer's knobs never leak into another's config."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not ("name" in v and v["name"] != out[k].get("name")):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def set_key(data: dict, key: str, value: Any, what: str = "sweep") -> dict:
    """``data`` (copied) with the dotted ``key`` set to ``value``."""
    out = copy.deepcopy(data)
    node = out
    for part in key.split(".")[:-1]:
        if not isinstance(node.setdefault(part, {}), dict):
            raise ConfigError(f"{what}: {key!r}: {part!r} is not a table")
        node = node[part]
    node[key.split(".")[-1]] = value
    return out


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value); the value is parsed as a TOML value, else kept as a string."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. train.steps=100")
    key, raw = item.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"--set {item!r}: {key.strip()!r} is not a config key (e.g. train.steps)")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def apply_size_sweep(data: dict) -> dict:
    """An experiment's raw tables with the chosen size's ``sweep`` grid over the file's (for the keys it names):
    a learning-rate grid for a CPU size is not one for a GPU size."""
    sizes = data.get("sizes")
    grid = sizes.get(data.get("size"), {}).get("sweep") if isinstance(sizes, dict) and isinstance(sizes.get(data.get("size")), dict) else None
    if isinstance(grid, dict) and isinstance(data.get("sweep", {}), dict):
        data = {**data, "sweep": {**flatten_keys(data.get("sweep", {})), **flatten_keys(grid)}}
    chosen = sizes.get(data.get("size")) if isinstance(sizes, dict) else None
    if isinstance(chosen, dict) and "compare" in chosen:  # a band in nats is a property of one scale
        data = {**data, "compare": chosen["compare"]}
    return data
