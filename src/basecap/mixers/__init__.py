"""Registry of sequence mixers (and feed-forward blocks).

A new mixer is one new file in this package plus one line in ``_MIXERS`` below (or, for a file kept outside the
package, one call of ``register_mixer`` in that file). Modules are imported lazily, so listing or validating configs
never imports optional fast paths.
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import ValidationError

from ..config_base import ConfigError, format_validation_error
from .base import Mixer, MixerConfig, State, state_bytes

# registry name -> "module:MixerClass"
_MIXERS: dict[str, str] = {
    "attention": "attention:Attention",
    "mamba1": "mamba1:Mamba1",
    "mamba2": "mamba2:Mamba2",
    "deltanet": "deltanet:DeltaNet",
    "gated_deltanet": "gated_deltanet:GatedDeltaNet",
    "kda": "kda:KDA",
    "based": "based:Based",
    "top1_element": "top1_element:Top1Element",
    "top1_chunk": "top1_chunk:Top1Chunk",
    "rwkv5": "rwkv5:RWKV5",
    "rwkv6": "rwkv6:RWKV6",
    "rwkv7": "rwkv7:RWKV7",
    "log_linear_mamba2": "log_linear_mamba2:LogLinearMamba2",
    "forgetting_attn": "forgetting_attn:ForgettingAttn",
}

# feed-forward blocks: registry name -> "module:Class"
_MLPS: dict[str, str] = {
    "swiglu": "mlp:SwiGLU",
    "none": "mlp:NoMLP",
    "rwkv_cmix": "rwkv_cmix:RWKVChannelMix",
}


def _load(spec: str):
    mod, cls = spec.split(":")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), cls)


# mixers registered at run time from a file of their own (``register_mixer``; ``basecap compare --mixer-file``)
_REGISTERED: dict[str, type[Mixer]] = {}


def register_mixer(cls: type[Mixer]) -> type[Mixer]:
    """Register a mixer class defined outside this package under its config's ``name`` (its ``Literal`` default), so
    configs, models and every command of this process can use it; returns the class (usable as a decorator). A file
    that defines a mixer calls it at import: ``basecap compare --mixer-file mine.py`` imports the file. Registering a
    built-in name, or another class (another module or qualified name) under a name already registered, is an error."""
    if not (isinstance(cls, type) and issubclass(cls, Mixer)):
        raise ConfigError(f"register_mixer: expected a subclass of basecap.mixers.Mixer, got {cls!r}")
    config_class = getattr(cls, "config_class", None)
    field = config_class.model_fields.get("name") if isinstance(config_class, type) and issubclass(config_class, MixerConfig) else None
    name = field.default if field is not None else None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"register_mixer: {cls.__qualname__}.config_class must be a MixerConfig with name: Literal[\"...\"] = \"...\"")
    if name in _MIXERS:
        raise ConfigError(f"register_mixer: {name!r} is a built-in mixer; give {cls.__qualname__} a name of its own")
    known = _REGISTERED.get(name, cls)
    if (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):  # the same file imported again: replaced
        raise ConfigError(f"register_mixer: {name!r} is registered already, by {known.__module__}.{known.__qualname__}")
    _REGISTERED[name] = cls
    return cls


def mixer_names() -> list[str]:
    return sorted([*_MIXERS, *_REGISTERED])


def mlp_names() -> list[str]:
    return sorted(_MLPS)


def mixer_class(name: str) -> type[Mixer]:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _MIXERS:
        raise ConfigError(f"model.mixer.name: unknown mixer {name!r}; allowed: {', '.join(mixer_names())}")
    return _load(_MIXERS[name])


def mlp_class(name: str):
    if name not in _MLPS:
        raise ConfigError(f"model.mlp.name: unknown mlp {name!r}; allowed: {', '.join(mlp_names())}")
    return _load(_MLPS[name])


def _validate(cls, data: Any, prefix: str):
    if isinstance(data, cls.config_class):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a table with a 'name' key, got {data!r}")
    try:
        return cls.config_class.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, prefix)) from None


def parse_mixer_config(data: Any, prefix: str = "model.mixer") -> MixerConfig:
    name = data.name if isinstance(data, MixerConfig) else (data or {}).get("name")
    if name is None:
        raise ConfigError(f"{prefix}.name: missing; allowed: {', '.join(mixer_names())}")
    return _validate(mixer_class(name), data, prefix)


def parse_mlp_config(data: Any, prefix: str = "model.mlp"):
    name = data.name if hasattr(data, "name") and not isinstance(data, dict) else (data or {}).get("name")
    if name is None:
        raise ConfigError(f"{prefix}.name: missing; allowed: {', '.join(mlp_names())}")
    return _validate(mlp_class(name), data, prefix)


def build_mixer(cfg: MixerConfig, d_model: int, layer_idx: int = 0, max_seq_len: int = 2048) -> Mixer:
    return mixer_class(cfg.name)(d_model, cfg, layer_idx=layer_idx, max_seq_len=max_seq_len)


__all__ = [
    "Mixer",
    "MixerConfig",
    "State",
    "state_bytes",
    "mixer_names",
    "mlp_names",
    "mixer_class",
    "register_mixer",
    "mlp_class",
    "parse_mixer_config",
    "parse_mlp_config",
    "build_mixer",
]
