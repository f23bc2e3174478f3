"""``basecap mixers``: every registered mixer with its switches, parameter count at a preset,
recurrent state bytes per sequence and asymptotic cost: each mixer's own ``cost()``, read off its FLOP
accounting unless it names its form (a window) or declares one cost per value of a switch that changes the
algorithm (``cost_modes``: Top-1 Chunk's Exact and Approx selection). Every cost string's training term is
checked against a scaling exponent measured by ``basecap bench mixers`` (``cost_exponent``, tests/test_catalog.py)."""

from __future__ import annotations

import math
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


def mixer_cost(mixer, seq_len: int) -> str:
    """The asymptotic cost of a built mixer with its config's switches (its declared ``cost()``)."""
    return mixer.cost(seq_len)


def _term_value(term: str, T: float, C: float, W: float) -> float:
    value, divide = 1.0, False
    for tok in term.replace("/", " / ").split():
        if tok == "/":
            divide = True
            continue
        f = {"T^2": T * T, "T": T, "C": C, "W": W, "1": 1.0}[tok]
        value, divide = (value / f if divide else value * f), False
    return value


def cost_exponent(cost: str, t1: int, t2: int, chunk: int = 128, window: int = 1, part: str = "train") -> float:
    """The scaling exponent a cost string predicts between lengths t1 and t2: the slope of log cost against
    log T for its ``train`` (or ``decode``) term, a sum of products of T, T^2, C, W and 1 (e.g. "T^2/C + T C")."""
    train, decode = (x.strip() for x in cost.split(","))
    expr = train if part == "train" else decode
    inner = expr[expr.index("O(") + 2 : expr.rindex(")")]
    value = lambda T: sum(_term_value(t, T, chunk, window) for t in inner.split(" + "))  # noqa: E731
    return math.log(value(t2) / value(t1)) / math.log(t2 / t1)


def describe(preset: str = "tiny", seq_len: int = 2048, vocab_size: int = 8192) -> list[dict]:
    rows = []
    for name in mixer_names():
        cfg = resolve(ModelConfig(preset=preset, vocab_size=vocab_size, mixer={"name": name}))  # parameter-matched
        with torch.device("meta"):
            model = LM(cfg)
        mixer = model.blocks[0].mixer
        state = model.state_size(seq_len)
        cost_modes = mixer_class(name).cost_modes
        rows.append(
            {
                "mixer": name,
                "mlp": cfg.mlp.name,
                "params": model.param_counts(),
                "state_bytes": state,
                "state_grows": state != model.state_size(seq_len // 2),
                "cost": mixer_cost(mixer, seq_len),
                "cost_switch": cost_modes[0] if cost_modes else None,
                "cost_by_mode": dict(cost_modes[1]) if cost_modes else None,
                "flops_per_token": model.flops_per_token(seq_len),
                "switches": switches(name),
                "doc": (
                    mixer_class(name).__module__ and (__import__(mixer_class(name).__module__, fromlist=["_"]).__doc__ or "").strip().splitlines()[0]
                ),
            }
        )
    return rows


def _cost_cell(row: dict) -> str:
    return f"by {row['cost_switch']} (below)" if row.get("cost_by_mode") else row["cost"]


def format_table(rows: list[dict], preset: str, seq_len: int) -> str:
    lines = [
        f"mixers at preset {preset!r} (params matched to Transformer++ via the MLP width), state at T={seq_len}:",
        "",
        f"{'mixer':<16}{'mlp':<10}{'params':>9}{'non-emb':>9}{'state/seq':>12}  {'cost':<38}paper",
    ]
    for r in rows:
        st = r["state_bytes"]
        st_s = f"{st / 2**20:.2f} MiB" if st >= 2**20 else f"{st / 2**10:.1f} KiB"
        lines.append(
            f"{r['mixer']:<16}{r['mlp']:<10}{r['params']['total'] / 1e6:>8.2f}M{r['params']['non_embedding'] / 1e6:>8.2f}M"
            f"{st_s + ('*' if r['state_grows'] else ''):>12}  {_cost_cell(r):<38}{r['doc'][:70]}"
        )
    lines += ["", "* grows with context (KV cache)"]
    for r in rows:
        if r.get("cost_by_mode"):
            lines += ["", f"{r['mixer']}: cost by model.mixer.{r['cost_switch']} (C = chunk length):"]
            lines += [f"  {r['mixer']} {mode}: {cost}" for mode, cost in r["cost_by_mode"].items()]
    lines += ["", "switches (config keys under model.mixer):"]
    for r in rows:
        lines.append(f"  {r['mixer']}:")
        lines += [f"    {k} = {v}" for k, v in r["switches"].items()]
    return "\n".join(lines)
