"""Typed, strict configuration base shared by every config in basecap.

Every config is a pydantic model that forbids unknown keys and validates on construction, so a
typo or an impossible value fails before any compute with a message naming the key.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    """Base for all basecap configs: unknown keys are errors, assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class ConfigError(ValueError):
    """A configuration problem, phrased for the user (names the key and the allowed values)."""


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        key = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"  {key}: {msg}" + (f" (got {e['input']!r})" if e["type"] != "extra_forbidden" and "input" in e and not isinstance(e["input"], dict) else ""))
    return "invalid configuration:\n" + "\n".join(lines)
