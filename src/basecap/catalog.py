"""``basecap mixers``: every registered mixer with its switches, parameter count at a preset,
recurrent state bytes per sequence and asymptotic cost (read off its own FLOP accounting)."""

from __future__ import annotations

import typing

import torch

from .matching import resolve
from .mixers import mixer_class, mixer_names
from .model import LM, ModelConfig


def switches(name: str) -> dict[str, str]:
    """Config field -> allowed values (Literal) or type and default."""
    out = {}
    for field, info in mixer_class(name).config_class.model_fields.items():
        if field == "name":
            continue
        args = typing.get_args(info.annotation)
        if typing.get_origin(info.annotation) is typing.Literal:
            out[field] = "|".join(map(str, args)) + f" (default {info.default})"
        else:
            tname = getattr(info.annotation, "__name__", str(info.annotation).replace("typing.", ""))
            out[field] = f"{tname} (default {info.default})"
    return out


def describe(preset: str = "tiny", seq_len: int = 2048, vocab_size: int = 8192) -> list[dict]:
    rows = []
    for name in mixer_names():
        cfg = resolve(ModelConfig(preset=preset, vocab_size=vocab_size, mixer={"name": name}))  # parameter-matched
        with torch.device("meta"):
            model = LM(cfg)
        mixer = model.blocks[0].mixer
        f1, f4 = mixer.flops_per_token(seq_len // 4), mixer.flops_per_token(seq_len)
        growth = f4 / f1 if f1 else 1.0
        cost = "O(T^2) train, O(T) per decoded token" if growth > 1.5 else "O(T) train, O(1) per decoded token"
        if getattr(mixer.cfg, "window", 0) and growth <= 1.5:
            cost = "O(T W) train, O(W) per decoded token"
        state = model.state_size(seq_len)
        rows.append({
            "mixer": name, "mlp": cfg.mlp.name, "params": model.param_counts(), "state_bytes": state,
            "state_grows": state != model.state_size(seq_len // 2), "cost": cost,
            "flops_per_token": model.flops_per_token(seq_len), "switches": switches(name),
            "doc": (mixer_class(name).__module__ and (__import__(mixer_class(name).__module__, fromlist=["_"]).__doc__ or "").strip().splitlines()[0]),
        })
    return rows


def format_table(rows: list[dict], preset: str, seq_len: int) -> str:
    lines = [f"mixers at preset {preset!r} (params matched to Transformer++ via the MLP width), state at T={seq_len}:", "",
             f"{'mixer':<16}{'mlp':<10}{'params':>9}{'non-emb':>9}{'state/seq':>12}  {'cost':<38}paper"]
    for r in rows:
        st = r["state_bytes"]
        st_s = f"{st / 2**20:.2f} MiB" if st >= 2**20 else f"{st / 2**10:.1f} KiB"
        lines.append(f"{r['mixer']:<16}{r['mlp']:<10}{r['params']['total'] / 1e6:>8.2f}M{r['params']['non_embedding'] / 1e6:>8.2f}M"
                     f"{st_s + ('*' if r['state_grows'] else ''):>12}  {r['cost']:<38}{r['doc'][:70]}")
    lines += ["", "* grows with context (KV cache)", "", "switches (config keys under model.mixer):"]
    for r in rows:
        lines.append(f"  {r['mixer']}:")
        lines += [f"    {k} = {v}" for k, v in r["switches"].items()]
    return "\n".join(lines)
