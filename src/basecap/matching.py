"""Parameter matching: the explicit resolve step that turns a validated model config into the one
that is trained.

Architectures are compared at the same depth and width; because mixers differ in parameters per
layer, ``match_params`` widens or narrows the feed-forward block (or, for architectures without
one, the mixer's ``expand``) so that every model's non-embedding parameter count equals
Transformer++'s at that shape (within 1%; the issue's bar is 5%). Counting builds models on the meta
device, which is why it is a step of its own and never part of validating a config.

What is widened is declared, not guessed: the feed-forward block's ``match_field`` (SwiGLU's and RWKV
channel mixing's ``hidden_mult``), else, for a model without one (``mlp = "none"``), the mixer's
``match_field`` (Mamba's ``expand``). A model where neither declares one cannot be matched: an error
that names the mixer, never a silently unmatched model.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from .config_base import ConfigError
from .mixers import mixer_class, mlp_class, parse_mlp_config
from .model import LM, ModelConfig

REFERENCE_MIXER = {"name": "attention", "position": "rope"}


@lru_cache(maxsize=256)
def _count(cfg_json: str) -> int:
    cfg = ModelConfig.model_validate_json(cfg_json)
    with torch.device("meta"):
        return LM(cfg).param_counts()["non_embedding"]


def count_params(model_cfg: ModelConfig) -> int:
    """Non-embedding parameters of the model ``model_cfg`` describes (as given: no matching applied)."""
    return _count(model_cfg.model_copy(update={"match_params": False}).model_dump_json())


def resolve(cfg):
    """``cfg`` with parameter matching applied where it asks for it (``match_params``, no per-layer
    mixers): a ``ModelConfig``, or any config that holds one as ``.model`` (a run config). Resolving a
    resolved config changes nothing."""
    if not isinstance(cfg, ModelConfig):
        return cfg.model_copy(update={"model": resolve(cfg.model)})
    if not cfg.match_params or cfg.layer_mixers:
        return cfg
    if mlp_class(cfg.mlp.name).match_field is None and mixer_class(cfg.mixer.name).match_field is None:
        raise ConfigError(
            f"model.match_params: mixer {cfg.mixer.name!r} declares match_field = None (it has no width of its own and is "
            f"matched through its feed-forward block), and mlp {cfg.mlp.name!r} has no width either; use an MLP with a "
            "width (e.g. swiglu) or set model.match_params = false"
        )
    cfg = cfg.model_copy(update={"mlp": matched_mlp(cfg)})
    return cfg.model_copy(update={"mixer": matched_mixer(cfg)})


def _matching_target(model_cfg: ModelConfig) -> tuple[dict, int]:
    """(the config as a plain dict with matching switched off, Transformer++'s non-embedding count at the
    same depth and width): what both matchers below solve against."""
    base = model_cfg.model_dump()
    base.update({"match_params": False, "preset": None, "layer_mixers": {}})
    target = _count(ModelConfig.model_validate(dict(base, mixer=REFERENCE_MIXER, mlp={"name": "swiglu"})).model_dump_json())
    return base, target


def matched_mixer(model_cfg: ModelConfig):
    """For architectures without a feed-forward block (Mamba): the mixer config whose ``match_field``
    (``expand``; rounded to 4 decimals; the mixer rounds d_inner to a multiple of 8 or of the head size) brings
    the non-embedding parameters closest to Transformer++ at this depth/width. Unchanged when the feed-forward
    block has a width (it is matched instead) or the mixer declares no field."""
    mixer = model_cfg.mixer
    field = mixer_class(mixer.name).match_field
    if mlp_class(model_cfg.mlp.name).match_field is not None or field is None:
        return mixer
    base, target = _matching_target(model_cfg)

    def count_with(expand):
        return _count(ModelConfig.model_validate(dict(base, mixer=dict(mixer.model_dump(), **{field: expand}))).model_dump_json())

    # parameters are linear in d_inner: solve from two probes, then check the rounding neighbours
    p1, p4 = count_with(1.0), count_with(4.0)
    guess = max(0.25, 1.0 + 3.0 * (target - p1) / max(p4 - p1, 1))
    step = 64 / model_cfg.d_model
    cands = [max(0.25, guess + k * step / 2) for k in range(-2, 3)]
    best = min(cands, key=lambda e: abs(count_with(e) - target))
    return type(mixer).model_validate(dict(mixer.model_dump(), **{field: round(best, 4)}))


def matched_mlp(model_cfg: ModelConfig):
    """The MLP config whose width makes ``model_cfg``'s non-embedding parameters match Transformer++
    at the same d_model / n_layers (solved on the MLP's ``match_field``, ``hidden_mult``). Returns the MLP
    config unchanged when the MLP has no width or the mixer is the reference."""
    mlp = model_cfg.mlp
    if model_cfg.mixer.model_dump(exclude_defaults=True) == {} and model_cfg.mixer.name == REFERENCE_MIXER["name"] and mlp.name == "swiglu":
        return mlp  # Transformer++ itself
    field = mlp_class(mlp.name).match_field
    if field is None:
        return mlp
    base, target = _matching_target(model_cfg)

    def count_with(mult):
        return _count(ModelConfig.model_validate(dict(base, mlp=dict(mlp.model_dump(), **{field: mult}))).model_dump_json())

    # MLP parameters are linear in the width: solve from two probes, then check the rounding neighbours
    p1, p4 = count_with(1.0), count_with(4.0)
    slope = (p4 - p1) / 3.0
    if slope <= 0:
        return mlp
    guess = max(0.05, 1.0 + (target - p1) / slope)
    step = 8 / model_cfg.d_model
    cands = [max(0.05, guess + k * step) for k in (-1, -0.5, 0, 0.5, 1)]
    best = min(cands, key=lambda m: abs(count_with(m) - target))
    return parse_mlp_config(dict(mlp.model_dump(), **{field: round(best, 4)}))
