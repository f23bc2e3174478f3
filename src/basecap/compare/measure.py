"""What the row measures besides the gap: MQAR accuracy, decoding state, speed and the asymptotic cost.

- MQAR: the principle's protocol (``experiments/paper/principle.toml``, ``[principle] mqar``; docs/metrics.md, "The
  principle"): a fresh model of its width and depth with the architecture's mixer and MLP as trained in the study,
  trained from scratch by ``eval.recall.train_mqar`` (whose defaults are the rest of the protocol) per MQAR seed,
  scored at the protocol's pair count, so the number stands beside the published points.
- State: ``LM.state_size`` of the study's model (bytes of one sequence's decoding state, fp32) at T and at T / 2.
- Speed: ``basecap bench mixers``' measurement, one mixer layer at its width (d_model 192, batch 1, fp32): the median
  forward+backward time of the training form at each length, as tokens per second, beside the reference mixer's
  measured in the same process.
- Cost: the mixer's declared ``cost()`` (docs/adding_a_mixer.md, "Declarations").
Results are kept in the output folder (``mqar.json``, ``speed.json``) and measured again only when what decides them
changes.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import torch

from ..atomic import write_json
from ..model import LM, ModelConfig

PRINCIPLE_FILE = Path("experiments/paper/principle.toml")


def curve_kv_pairs(score: int) -> tuple[int, ...]:
    """The pair counts of the accuracy curve, as the principle's (1, 2, 4, 8, 16 for 8): powers of two up to twice
    the scored count."""
    return tuple(2**i for i in range((2 * score).bit_length()) if 2**i <= 2 * score)


def mqar_protocol(path: Path, steps: int | None = None, seeds: list[int] | None = None) -> dict:
    """The principle's MQAR protocol (``steps`` / ``seeds`` replaced for a quick check; the row says so)."""
    try:
        proto = dict(tomllib.loads(Path(path).read_text(encoding="utf-8"))["principle"]["mqar"])
    except (OSError, KeyError, ValueError) as e:
        from ..config_base import ConfigError

        raise ConfigError(f"{path}: no [principle] mqar protocol ({e})") from None
    if steps is not None:
        proto["steps"] = steps
    if seeds is not None:
        proto["seeds"] = list(seeds)
    return proto


def _stored(path: Path, key: dict) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if data.get("key") == json.loads(json.dumps(key)) else None


def mqar(model: ModelConfig, proto: dict, out: Path, log=print) -> dict:
    """MQAR accuracy at the protocol's scored pair count, per seed and its mean (kept in ``out``)."""
    from ..eval.recall import MqarTask, MqarTraining, train_mqar

    mixer, mlp = model.mixer.model_dump(), model.mlp.model_dump()
    key = {"protocol": proto, "mixer": mixer, "mlp": mlp}
    path = out / "mqar.json"
    got = _stored(path, key)
    if got is None:
        runs = {}
        for seed in proto["seeds"]:
            res = train_mqar(
                mixer,
                MqarTask(
                    seq_len=proto["seq_len"], train_kv_pairs=tuple(proto["train_kv_pairs"]), test_kv_pairs=curve_kv_pairs(proto["score_kv_pairs"])
                ),
                MqarTraining(steps=proto["steps"], lr=proto["lr"]),
                d_model=proto["d_model"],
                n_layers=proto["n_layers"],
                seed=seed,
                mlp=mlp,
                log=log,
            )
            runs[str(seed)] = {"acc": res["acc"], "acc_at_score": res["acc"][proto["score_kv_pairs"]], "train_seconds": res["train_seconds"]}
        got = {"key": key, "seeds": runs}
        write_json(path, got)
    values = [got["seeds"][str(s)]["acc_at_score"] for s in proto["seeds"]]
    return {"score_kv_pairs": proto["score_kv_pairs"], "values": values, "mean": sum(values) / len(values), "protocol": proto}


def state(model: ModelConfig, at: int = 2048) -> dict:
    """Bytes of one sequence's decoding state (fp32) at ``at`` tokens, and whether it grows with the context."""
    with torch.device("meta"):
        lm = LM(model)
    s = lm.state_size(at)
    return {"state_bytes": s, "state_at": at, "state_grows": s != lm.state_size(at // 2)}


def cost(model: ModelConfig, at: int = 2048) -> str:
    """The mixer's declared asymptotic cost."""
    from ..mixers import build_mixer

    with torch.device("meta"):
        return build_mixer(model.mixer, model.d_model, 0, model.max_seq_len).cost(at)


def speed(mixer: dict, reference: dict, lengths: list[int], out: Path, reps: int = 3, log=print) -> dict:
    """Forward+backward tokens per second of one layer of ``mixer`` and of ``reference`` at each length (kept in
    ``out``), as ``basecap bench mixers`` times them; {T: {seconds, tokens_per_s, reference_seconds, x_reference}}."""
    from ..bench.common import fwd_bwd, median_time
    from ..bench.mixers import D_MODEL
    from ..mixers import build_mixer, parse_mixer_config

    key = {"mixer": mixer, "reference": reference, "lengths": lengths, "reps": reps, "d_model": D_MODEL, "threads": torch.get_num_threads()}
    path = out / "speed.json"
    got = _stored(path, key)
    if got is None:
        times: dict[str, dict[int, float]] = {}
        for side, cfg in (("mixer", mixer), ("reference", reference)):
            torch.manual_seed(0)
            m = build_mixer(parse_mixer_config(dict(cfg)), D_MODEL, max_seq_len=max(lengths) + 64)
            times[side] = {T: median_time(fwd_bwd(m, torch.randn(1, T, D_MODEL, requires_grad=True)), reps=reps, budget_s=300) for T in lengths}
            log(f"speed {cfg['name']}: " + ", ".join(f"T={T} {t:.3f} s" for T, t in times[side].items()))
        got = {
            "key": key,
            "by_length": {
                str(T): {
                    "seconds": times["mixer"][T],
                    "tokens_per_s": T / times["mixer"][T],
                    "reference_seconds": times["reference"][T],
                    "x_reference": times["reference"][T] / times["mixer"][T],
                }
                for T in lengths
            },
        }
        write_json(path, got)
    return got["by_length"]
