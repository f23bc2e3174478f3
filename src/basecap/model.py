"""The shared backbone: only the sequence mixer (and, where the architecture demands it, the
feed-forward block) differs between architectures, so comparisons are matched by construction.

embedding (+ learned absolute positions if the mixer asks) -> N x [RMSNorm, mixer, residual,
RMSNorm, mlp, residual] -> RMSNorm -> LM head. No biases anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from pydantic import Field, field_validator, model_validator
from torch import nn

from .config_base import ConfigError, Strict
from .kernels.linear_ce import IMPLS as HEAD_IMPLS
from .kernels.linear_ce import lm_head_loss
from .mixers import MixerConfig, build_mixer, mlp_class, parse_mixer_config, parse_mlp_config
from .mixers.attention import AttentionConfig
from .ops.norm import RMSNorm
from .presets import PRESETS

if TYPE_CHECKING:  # Literals built at runtime from the registries (pydantic checks them); a type checker sees str
    PresetName = str
    HeadImpl = str
else:
    PresetName = Literal[tuple(PRESETS)]
    HeadImpl = Literal[HEAD_IMPLS]


class ModelConfig(Strict):
    """The model's shape and parts. Validating it builds nothing; ``match_params`` is applied by the
    explicit resolve step (``basecap.matching.resolve``)."""

    preset: PresetName | None = Field(
        None, description="size preset: fills d_model, n_layers, max_seq_len (explicit values win) and turns on match_params"
    )
    match_params: bool = Field(
        False, description="resize the MLP so non-embedding params match Transformer++ at this depth/width (applied when the config is resolved)"
    )
    vocab_size: int = Field(8192, gt=0, description="set from the tokenizer when data is built")
    d_model: int = Field(192, gt=0)
    n_layers: int = Field(4, gt=0)
    max_seq_len: int = Field(512, gt=0)
    mixer: Any = Field(default_factory=lambda: AttentionConfig())
    mlp: Any = None  # default: the mixer's own default (SwiGLU for most)
    layer_mixers: dict[int, Any] = Field(default_factory=dict, description="per-layer mixer overrides (hybrids)")
    tie_embeddings: bool = False
    head_impl: HeadImpl = Field(
        "auto",
        description="the LM head's loss: 'chunked' never materialises the [tokens, vocab] logits (gradients folded "
        "chunk by chunk), 'fast' is fla's fused kernel (CUDA training loss), 'auto' the fast one where "
        "it runs and chunked elsewhere, 'plain' the whole logits and F.cross_entropy (the reference)",
    )
    norm_eps: float = Field(1e-5, gt=0)
    init_std: float = Field(0.02, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data):
        if isinstance(data, dict) and data.get("preset") is not None:
            if data["preset"] not in PRESETS:
                return data  # the Literal check reports it
            data = {**PRESETS[data["preset"]], "match_params": True, **data}
        return data

    @field_validator("mixer", mode="before")
    @classmethod
    def _mixer(cls, v):
        if isinstance(v, dict) and "name" not in v:
            v = {"name": "attention", **v}
        return parse_mixer_config(v, "model.mixer")

    @field_validator("layer_mixers", mode="before")
    @classmethod
    def _layer_mixers(cls, v):
        return {int(k): parse_mixer_config(m, f"model.layer_mixers.{k}") for k, m in (v or {}).items()}

    @model_validator(mode="after")
    def _default_mlp(self):
        if self.mlp is None or isinstance(self.mlp, dict):
            data = self.mlp if isinstance(self.mlp, dict) else {"name": self.mixer.default_mlp()}
            object.__setattr__(self, "mlp", parse_mlp_config(data, "model.mlp"))
        bad = [i for i in self.layer_mixers if not 0 <= i < self.n_layers]
        if bad:
            raise ValueError(f"layer_mixers: layer indices {bad} outside 0..{self.n_layers - 1}")
        return self

    def mixer_for(self, layer: int) -> MixerConfig:
        return self.layer_mixers.get(layer, self.mixer)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mixer = build_mixer(cfg.mixer_for(layer_idx), cfg.d_model, layer_idx, cfg.max_seq_len)
        self.norm2 = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = mlp_class(cfg.mlp.name)(cfg.d_model, cfg.mlp, layer_idx, cfg.max_seq_len)

    def forward(self, x, state=None):
        ms, fs = (None, None) if state is None else state
        h, ms = self.mixer(self.norm1(x), ms)
        x = x + h
        h, fs = self.mlp(self.norm2(x), fs)
        return x + h, (None if state is None else (ms, fs))


class LM(nn.Module):
    """Decoder-only language model over a registered mixer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.abs_pos = None
        if any(cfg.mixer_for(i).wants_absolute_positions() for i in range(cfg.n_layers)):
            self.abs_pos = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def _init_weights(self):
        """GPT-2 style: N(0, std) for embeddings and projections unless a mixer initialised its
        own parameters specially (mixers mark those with ``_no_reinit``); the residual output
        projections each mixer and feed-forward block declares (``out_projections``) scaled by 1/sqrt(2 N)."""
        std = self.cfg.init_std
        residual = self._out_projections()
        for name, mod in self.named_modules():
            if getattr(mod, "_no_reinit", False):
                continue
            if isinstance(mod, (nn.Linear, nn.Embedding)) and not getattr(mod.weight, "_no_reinit", False) and not mod.weight.is_meta:
                s = std / math.sqrt(2 * self.cfg.n_layers) if name in residual else std
                nn.init.normal_(mod.weight, 0.0, s)

    def _out_projections(self) -> set[str]:
        """Full module names of the layers that write into the residual stream, as each block's mixer and
        feed-forward block declare them; a declared name that is not an nn.Linear of that part is an error."""
        names = set()
        for i, blk in enumerate(self._blocks()):
            for part in (blk.mixer, blk.mlp):
                linears = {n for n, m in part.named_modules() if isinstance(m, nn.Linear)}
                for proj in type(part).out_projections:
                    if proj not in linears:
                        raise ConfigError(
                            f"{type(part).__module__}.{type(part).__qualname__}.out_projections: {proj!r} is not an nn.Linear of it "
                            f"(its nn.Linear layers: {', '.join(sorted(linears)) or 'none'})"
                        )
                    names.add(f"blocks.{i}.{'mixer' if part is blk.mixer else 'mlp'}.{proj}")
        return names

    def forward(self, idx: torch.Tensor, state=None, *, targets: torch.Tensor | None = None, reduction: str = "mean", ignore_index: int = -100):
        """idx [B, T] -> (logits [B, T, V], new state). With ``targets`` [B, T] -> (loss, new state): the
        cross-entropy through the head of ``cfg.head_impl`` (by default the logits never exist whole), a
        scalar for ``reduction`` "mean" (over non-ignored targets) or "sum", fp32 per-token losses [B, T]
        for "none". The new state is None unless ``state`` (from ``init_state``) is given."""
        x, new_state = self.features(idx, state)
        if targets is None:
            return self.head(x), new_state
        return self.head_loss(x, targets, reduction=reduction, ignore_index=ignore_index), new_state

    def features(self, idx: torch.Tensor, state=None):
        """The normalised last hidden states [B, T, D] the head reads, and the new state (None without one)."""
        T = idx.shape[1]
        x = self.embed(idx)
        if self.abs_pos is not None:
            offset = 0 if state is None else state["pos"]
            if offset + T > self.cfg.max_seq_len:
                raise ValueError(f"absolute positions are learned up to max_seq_len={self.cfg.max_seq_len}; got position {offset + T - 1}")
            x = x + self.abs_pos(torch.arange(offset, offset + T, device=idx.device))
        new_layers = []
        for i, blk in enumerate(self.blocks):
            x, s = blk(x, None if state is None else state["layers"][i])
            new_layers.append(s)
        x = self.norm(x)
        return x, (None if state is None else {"layers": new_layers, "pos": state["pos"] + T})

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean", ignore_index: int = -100) -> torch.Tensor:
        """Cross-entropy of the head over hidden states ``x`` [..., D] (from :meth:`features`) against ``targets`` [...]."""
        return lm_head_loss(x, self.head.weight, targets, impl=self.cfg.head_impl, ignore_index=ignore_index, reduction=reduction)

    def init_state(self, batch: int, device="cpu", dtype=torch.float32):
        return {
            "layers": [(b.mixer.init_state(batch, device, dtype), b.mlp.init_state(batch, device, dtype)) for b in self._blocks()],
            "pos": 0,
        }

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Next-token cross-entropy of ``idx`` [B, T] against ``targets`` [B, T] (see :meth:`forward`)."""
        return self(idx, targets=targets, reduction=reduction)[0]

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.0, stop: set[int] | None = None) -> torch.Tensor:
        """Stateful decoding: prefill once, then one token at a time (greedy when temperature=0)."""
        state = self.init_state(idx.shape[0], idx.device)
        logits, state = self(idx, state)
        out = []
        for _ in range(max_new_tokens):
            last = logits[:, -1].float()
            nxt = last.argmax(-1, keepdim=True) if temperature == 0 else torch.multinomial(torch.softmax(last / temperature, -1), 1)
            out.append(nxt)
            if stop is not None and idx.shape[0] == 1 and int(nxt) in stop:
                break
            logits, state = self(nxt, state)
        return torch.cat(out, dim=1) if out else idx[:, :0]

    # ---- accounting --------------------------------------------------------------------
    def param_counts(self) -> dict[str, int]:
        total = sum(p.numel() for p in self.parameters())
        emb = self.embed.weight.numel() + (self.abs_pos.weight.numel() if self.abs_pos is not None else 0)
        head = 0 if self.cfg.tie_embeddings else self.head.weight.numel()
        return {"total": total, "non_embedding": total - emb - head, "embedding": emb + head}

    def flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token: 2 x matmul parameters (incl. LM head) + mixer-specific terms
        (attention scores, scans). Training is ~3x this."""
        matmul = sum(p.numel() for n, p in self.named_parameters() if p.dim() >= 2 and not n.startswith(("embed", "abs_pos")))
        if self.cfg.tie_embeddings:
            matmul += self.embed.weight.numel()
        return 2.0 * matmul + sum(b.mixer.flops_per_token(seq_len) for b in self._blocks())

    def state_size(self, seq_len: int) -> int:
        return sum(b.mixer.state_size(seq_len) + b.mlp.state_size(seq_len) for b in self._blocks())

    def _blocks(self) -> Iterable[Block]:
        return cast("Iterable[Block]", self.blocks)  # nn.ModuleList types its items as Module


def build_model(model_cfg: ModelConfig, vocab_size: int | None = None) -> LM:
    """The LM of a (resolved) model config, with the corpus's vocabulary when given."""
    return LM(model_cfg if vocab_size is None else model_cfg.model_copy(update={"vocab_size": vocab_size}))
