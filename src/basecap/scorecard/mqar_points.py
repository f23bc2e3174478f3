"""``basecap principle mqar``: the MQAR accuracy of each point of the principle, on the protocol that
``experiments/paper/principle.toml`` fixes, written to ``results/principle/mqar.json`` (docs/metrics.md, "The
principle").

Each point's mixer (and MLP) is its run's as trained in its study: the study's experiment file at the study's size,
resolved by the config loader and parameter matching. A fresh model of the protocol's width and depth is trained from
scratch on MQAR (``eval.recall.train_mqar``) per MQAR seed. Resumable and shareable: a point and seed already in the
file is skipped, and each result is merged into the file under a lock, so several processes (one point each, one
thread each) can run beside other jobs.
"""

from __future__ import annotations

import fcntl
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..atomic import atomic_write
from ..config_base import ConfigError
from .claims import ClaimsFile, experiment_path
from .principle import BATCH_SIZE, CURVE_KV_PAIRS, NUM_TEST, POWER_A, VOCAB_SIZE, WEIGHT_DECAY, Principle, PrincipleFile, protocol


def point_model(spec: Principle, label: str, claims: ClaimsFile, root: Path) -> dict:
    """The mixer and MLP configs of a point's run as trained in its study (every config of the run agrees)."""
    from ..config import load_experiment
    from ..matching import resolve

    point = next((p for p in spec.points if p.label == label), None)
    if point is None:
        raise ConfigError(f"--point: no point {label!r}; points: {', '.join(p.label for p in spec.points)}")
    st = claims.studies[point.study]
    exp = load_experiment(experiment_path(root, st), [f"size={st.size}"])
    models = [resolve(rc).model for rc in exp.run_configs() if rc.name.split("@")[0] == point.run]
    if not models:
        raise ConfigError(f"point {label}: no run {point.run} in {st.experiment} at size {st.size}")
    if models[0].layer_mixers:
        raise ConfigError(f"point {label}: a hybrid (layer_mixers); MQAR trains one mixer type")
    configs = {json.dumps([m.mixer.model_dump(), m.mlp.model_dump()], sort_keys=True, default=list) for m in models}
    if len(configs) > 1:
        raise ConfigError(f"point {label}: the configs of run {point.run} have different mixers or MLPs")
    mixer, mlp = json.loads(configs.pop())
    return {"study": point.study, "experiment": st.experiment, "size": st.size, "run": point.run, "mixer": mixer, "mlp": mlp}


def _locked_merge(path: Path, proto: dict, update: Callable[[dict], Any] | None) -> dict:
    """Read ``path`` under an exclusive lock (a sibling .lock file), apply ``update`` to its data and write it back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"protocol": proto, "points": {}}
            if data.get("protocol") != proto:
                raise ConfigError(f"{path}: protocol: measured with {data.get('protocol')}, principle.toml declares {proto}")
            if update is not None:
                update(data)
                atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
            return data
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _insert(data: dict, label: str, seed: int, model: dict, record: dict, out: Path) -> None:
    """Add one seed of a point to mqar.json's data (a seed measured meanwhile by another process is kept)."""
    entry = data["points"].setdefault(label, {k: model[k] for k in ("study", "experiment", "size", "run", "mixer", "mlp")})
    if entry["mixer"] != model["mixer"] or entry["mlp"] != model["mlp"]:
        raise ConfigError(f"{out}: point {label} was measured with another mixer config than its study's now")
    entry.setdefault("seeds", {}).setdefault(str(seed), record)


def measure(
    spec: PrincipleFile,
    claims: ClaimsFile,
    root: Path,
    out: Path,
    points: list[str] | None = None,
    seeds: list[int] | None = None,
    *,
    threads: int | None = None,
    log: Callable[..., Any] = print,
) -> list[dict]:
    """Train and score every (point, seed) asked for that ``out`` does not hold yet; returns the new records."""
    import torch

    from ..eval.recall import MqarTask, MqarTraining, train_mqar
    from ..rundir import git_state

    pr = spec.principle
    proto = protocol(pr)
    labels = points or [p.label for p in pr.points]
    unknown = [x for x in labels if x not in {p.label for p in pr.points}]
    if unknown:
        raise ConfigError(f"--point: no point {', '.join(map(repr, unknown))}; points: {', '.join(p.label for p in pr.points)}")
    bad = [s for s in seeds or [] if s not in pr.mqar.seeds]
    if bad:
        raise ConfigError(f"--seed: the protocol's MQAR seeds are {pr.mqar.seeds}, got {bad}")
    if threads is not None:
        torch.set_num_threads(threads)
    done = _locked_merge(out, proto, None)["points"]
    new = []
    for label in labels:
        model = point_model(pr, label, claims, root)
        for seed in seeds or pr.mqar.seeds:
            if str(seed) in done.get(label, {}).get("seeds", {}):
                log(f"{label} seed {seed}: in {out} already, skipped")
                continue
            t0 = time.perf_counter()
            task = MqarTask(
                vocab_size=VOCAB_SIZE,
                seq_len=pr.mqar.seq_len,
                train_kv_pairs=tuple(pr.mqar.train_kv_pairs),
                test_kv_pairs=CURVE_KV_PAIRS,
                num_test=NUM_TEST,
                power_a=POWER_A,
            )
            training = MqarTraining(steps=pr.mqar.steps, batch_size=BATCH_SIZE, lr=pr.mqar.lr, weight_decay=WEIGHT_DECAY)
            res = train_mqar(model["mixer"], task, training, d_model=pr.mqar.d_model, n_layers=pr.mqar.n_layers, seed=seed, mlp=model["mlp"], log=log)
            commit, dirty = git_state()
            record = {
                "acc_at_score": res["acc"][pr.mqar.score_kv_pairs],
                "acc": {str(k): v for k, v in res["acc"].items()},
                "mean_acc": res["mean_acc"],
                "final_loss": res["final_loss"],
                "loss_curve": res["loss_curve"],
                "params": res["params"],
                "state_bytes": res["state_bytes"],
                "train_seconds": res["train_seconds"],
                "wall_seconds": round(time.perf_counter() - t0, 2),
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "git_commit": commit,
                "git_dirty": dirty,
            }
            _locked_merge(out, proto, functools.partial(_insert, label=label, seed=seed, model=model, record=record, out=out))
            log(f"{label} seed {seed}: accuracy {record['acc_at_score']:.3f} at {pr.mqar.score_kv_pairs} pairs ({record['wall_seconds']:.0f} s)")
            new.append({"label": label, "seed": seed, **record})
    return new
