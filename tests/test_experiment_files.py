"""Every committed experiment file validates at every size it defines, before anyone trains it: a study's size that
only a user running it would find broken (an unknown key, a bad value, a run that does not resolve) fails here."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from basecap.experiment import resolve_experiment

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for p in (ROOT / "experiments").rglob("*.toml") if p.name not in ("claims.toml", "principle.toml"))


def _sizes(path: Path) -> list[str | None]:
    return list(tomllib.loads(path.read_text(encoding="utf-8")).get("sizes") or {}) or [None]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_size_of_every_experiment_file_resolves(path):
    for size in _sizes(path):
        exp, runs = resolve_experiment(path, [f"size={size}"] if size else [])
        assert runs, f"{path.name} at size {size}: no runs"
        assert len({rc.name + str(rc.seed) for rc in runs}) == len(runs), f"{path.name} at size {size}: a run twice"


def test_small_studies_share_their_base_runs_with_the_headline():
    """The small CPU studies fork at the same steps as architectures_annealed, so a base run there is the same config
    as its counterpart (what --reuse needs); a change to one file's schedule shows up here."""
    from basecap.reuse import _key

    def configs(name: str) -> dict[tuple[str, int], str]:
        _, runs = resolve_experiment(ROOT / "experiments/paper" / name, ["size=small"])
        return {(rc.name, rc.seed): _key(rc.model_dump(mode="json")) for rc in runs}

    head = configs("architectures_annealed.toml")
    for study, run, twin in [
        ("ablation_temperature.toml", "temp_1.0", "transformer_pp"),
        ("ablation_mamba_decay.toml", "mamba2_data_dependent", "mamba2"),
        ("ablation_mamba_decay.toml", "mamba1_data_dependent", "mamba1"),
        ("ablation_mamba2_norm.toml", "mamba2_norm_on", "mamba2"),
        ("limited_vs_mixed_annealed.toml", "mamba2", "mamba2"),
    ]:
        mine = configs(study)
        assert mine[(run, 0)] == head[(twin, 0)], f"{study}: {run} is no longer architectures_annealed's {twin}"
