"""Registry of sequence mixers (and feed-forward blocks).

A new mixer is one new file in this package plus one line in ``_MIXERS`` below. Modules are
imported lazily, so listing or validating configs never imports optional fast paths.
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


def mixer_names() -> list[str]:
    return sorted(_MIXERS)


def mlp_names() -> list[str]:
    return sorted(_MLPS)


def mixer_class(name: str) -> type[Mixer]:
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
    "mlp_class",
    "parse_mixer_config",
    "parse_mlp_config",
    "build_mixer",
]
