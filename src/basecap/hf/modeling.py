"""basecap models as Hugging Face ``transformers`` models (config, causal LM, generation cache).

``BasecapForCausalLM`` wraps the basecap ``LM`` unchanged: the exported weights are the basecap
state dict under a ``model.`` prefix, and ``config.json`` holds the full basecap ``ModelConfig``.
Generation keeps the mixers' own states (KV caches, recurrent states) in a ``BasecapCache``, so
``generate()`` decodes exactly as ``LM.generate`` does: one prefill, then one token at a time.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from ..model import LM, ModelConfig


def model_config_from_dict(data: dict) -> ModelConfig:
    """The exported dict already holds resolved sizes and the matched MLP width, so presets and
    parameter matching are not applied again."""
    return ModelConfig.model_validate({**data, "preset": None, "match_params": False})


class BasecapConfig(PretrainedConfig):
    """``model_type = "basecap"``; ``basecap`` is the model's full ``ModelConfig`` as JSON."""

    model_type = "basecap"

    def __init__(self, basecap: dict | None = None, **kwargs):
        mc = model_config_from_dict(basecap) if basecap is not None else ModelConfig()
        self.basecap = json.loads(mc.model_dump_json())
        # mirrors of the basecap config under the names HF tools look for; never read back
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "max_position_embeddings"):
            kwargs.pop(k, None)
        self.vocab_size = mc.vocab_size
        self.hidden_size = mc.d_model
        self.num_hidden_layers = mc.n_layers
        self.max_position_embeddings = mc.max_seq_len
        kwargs["tie_word_embeddings"] = mc.tie_embeddings
        kwargs.setdefault("use_cache", True)
        super().__init__(**kwargs)

    def model_config(self) -> ModelConfig:
        return model_config_from_dict(self.basecap)


class BasecapCache:
    """A basecap LM state (per-layer mixer and MLP states, position) carried between ``generate``
    steps. Each forward returns a new cache; the one passed in is never modified."""

    is_compileable = False

    def __init__(self, state: dict):
        self.state = state

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.state["pos"])

    def reorder_cache(self, beam_idx: torch.LongTensor):
        """Beam search: keep the rows ``beam_idx`` of every state tensor (all are batch-first)."""
        self.state = _index_rows(self.state, beam_idx)

    def __repr__(self):
        return f"BasecapCache(pos={self.get_seq_length()})"


def _index_rows(obj: Any, idx: torch.Tensor):
    if isinstance(obj, torch.Tensor):
        return obj.index_select(0, idx.to(obj.device))
    if isinstance(obj, dict):
        return {k: _index_rows(v, idx) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_index_rows(v, idx) for v in obj)
    return obj


# transformers 5.2x renamed the generation cache from ``past_key_values`` to ``cache`` (in forward
# arguments and model outputs); generate() carries the state under whichever name this version uses.
CACHE_NAME = "cache" if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters else "past_key_values"


if CACHE_NAME == "cache":

    @dataclass
    class BasecapCausalLMOutput(ModelOutput):
        loss: torch.FloatTensor | None = None
        logits: torch.FloatTensor | None = None
        cache: BasecapCache | None = None
else:

    @dataclass
    class BasecapCausalLMOutput(ModelOutput):  # type: ignore[no-redef]  # the cache field's name depends on the version
        loss: torch.FloatTensor | None = None
        logits: torch.FloatTensor | None = None
        past_key_values: BasecapCache | None = None


def _check_padding(mask: torch.Tensor | None, caching: bool):
    """Mixers have no padding mask. Right padding is harmless for a causal model without a cache
    (real positions never see the pads); anything else would silently change the outputs."""
    if mask is None or bool(mask.all()):
        return
    if caching:
        raise ValueError(
            "basecap models do not support padded batches with a cache (generation): "
            "generate one prompt at a time (e.g. lm-eval --batch_size 1 for generation tasks)"
        )
    if mask.dim() != 2 or bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise ValueError("basecap models support right padding only (attention_mask rows 1...1 0...0)")


class BasecapForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = BasecapConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _is_stateful = True
    _tied_weights_keys = {"model.head.weight": "model.embed.weight"}

    def __init__(self, config: BasecapConfig, lm: LM | None = None):
        super().__init__(config)
        self.model = lm if lm is not None else LM(config.model_config())
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """Strict: weights that do not match this basecap version's model are an error (transformers would
        otherwise initialise the missing ones at random and carry on)."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = cast(tuple[Any, dict], super().from_pretrained(*args, output_loading_info=True, **kwargs))  # with loading info
        bad = {k: sorted(map(str, v)) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if bad:
            where = Path(str(args[0] if args else kwargs.get("pretrained_model_name_or_path", ""))) / "basecap_export.json"
            made = json.loads(where.read_text()).get("basecap_commit") if where.is_file() else None
            raise ValueError(
                f"{args[0] if args else ''}: the exported weights do not match this basecap version's model "
                f"({'; '.join(f'{k}: {v[:6]}' for k, v in bad.items())}). Exported with basecap commit "
                f"{made or 'unknown'}: re-export the run with this version or use that one."
            )
        return (model, info) if want_info else model

    def _init_weights(self, module):
        """``LM`` initialises its own parameters (including mixer-specific inits) on construction."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is a BasecapCache, created by forward on the prefill

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.head

    def set_output_embeddings(self, value):
        self.model.head = value

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, use_cache=None, **kwargs):
        cache = kwargs.get("cache") or kwargs.get("past_key_values")
        if cache is not None:
            input_ids = input_ids[:, cache.get_seq_length() :]  # the cache has consumed the rest
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": use_cache}
        if cache is not None:
            inputs["cache"] = cache
        return inputs

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        cache: BasecapCache | None = None,
        past_key_values: BasecapCache | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ):
        """``labels`` are the input ids (shifted here, -100 ignored) as in every HF causal LM; their loss goes
        through the model's head loss (``head_impl``), and in training mode with labels ``logits`` is None
        (only the loss is computed). ``use_cache`` defaults to False outside ``generate`` (a plain scoring
        forward keeps no state)."""
        if input_ids is None or inputs_embeds is not None:
            raise ValueError("basecap models take input_ids (inputs_embeds is not supported)")
        if output_hidden_states or output_attentions:
            raise ValueError("basecap models do not return hidden states or attention weights")
        unknown = sorted(k for k, v in kwargs.items() if v is not None and k != "num_items_in_batch")
        if unknown:
            raise TypeError(f"BasecapForCausalLM.forward got unsupported arguments {unknown}")
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, BasecapCache):
            raise TypeError(f"basecap models keep their state in a BasecapCache, got {type(cache).__name__}")
        caching = cache is not None or bool(use_cache)
        _check_padding(attention_mask, caching)
        B, T = input_ids.shape
        offset = cache.get_seq_length() if cache is not None else 0
        if position_ids is not None and not torch.equal(
            position_ids.to(input_ids.device).expand(B, T), torch.arange(offset, offset + T, device=input_ids.device).expand(B, T)
        ):
            raise ValueError("basecap models take consecutive positions only (no packed or shifted position_ids)")

        if caching:
            state = cache.state if cache is not None else self.model.init_state(B, input_ids.device, self.dtype)
            hidden, state = self.model.features(input_ids, state)
            new_cache = BasecapCache(state)
        else:
            hidden, _ = self.model.features(input_ids)
            new_cache = None

        loss = None
        if labels is not None:  # the model's head loss: the logits are never materialised for it
            loss = self.model.head_loss(hidden[:, :-1], labels[:, 1:].to(hidden.device), ignore_index=-100)
        # a training step with labels needs only the loss, so its [B, T, V] logits are skipped
        logits = None if labels is not None and self.training else self.model.head(hidden)
        if return_dict is False:
            return tuple(v for v in (loss, logits, new_cache) if v is not None)
        return BasecapCausalLMOutput(loss=loss, logits=logits, **{CACHE_NAME: new_cache})
