"""The metrics record's schema (basecap.records): what the trainer writes and what the kept records hold match the
TypedDicts field for field; a record that is not one is an error naming its file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from basecap.records import (
    KINDS,
    AnnealRecord,
    DomainEval,
    EvalRecord,
    Stratum,
    TrainRecord,
    annealed_steps,
    anneals,
    check_record,
    eval_at,
    evals,
    points,
    trains,
)
from basecap.rundir import RunDir
from basecap.train import train
from test_train import run_cfg

SCHEMA = {"train": TrainRecord, "eval": EvalRecord, "anneal": AnnealRecord}
RESULTS = Path(__file__).resolve().parents[1] / "results"


def conforms(obj: dict[str, Any], td: Any, where: str) -> None:
    keys = set(obj)
    missing = td.__required_keys__ - keys
    extra = keys - td.__required_keys__ - td.__optional_keys__
    assert not missing and not extra, f"{where}: missing {sorted(missing)}, not in the schema {sorted(extra)}"


def conforms_all(records: list[dict[str, Any]], where: str) -> None:
    for i, r in enumerate(records):
        conforms(r, SCHEMA[r["kind"]], f"{where} record {i}")
        for d, res in r.get("domains", {}).items():
            conforms(res, DomainEval, f"{where} record {i} domain {d}")
            for name, s in res.get("strata", {}).items():
                conforms(s, Stratum, f"{where} record {i} domain {d} stratum {name}")


def test_check_record_names_the_place_and_the_fault():
    assert check_record({"kind": "eval", "step": 3}, "f:1") == {"kind": "eval", "step": 3}
    with pytest.raises(ValueError, match=r"f:2: unknown record kind 'evaluation'"):
        check_record({"kind": "evaluation", "step": 3}, "f:2")
    with pytest.raises(ValueError, match=r"f:3: the train record has no integer 'step'"):
        check_record({"kind": "train", "step": "3"}, "f:3")
    with pytest.raises(ValueError, match=r"f:4: a metrics record is a JSON object, got list"):
        check_record([1], "f:4")
    assert set(KINDS) == set(SCHEMA)


def test_a_record_that_is_not_one_is_an_error_naming_its_line(tmp_path):
    rd = RunDir(tmp_path)
    rd.metrics_path.write_text('{"kind": "train", "step": 1}\n{"kind": "eval", "step": true}\n{"kind": "train", "step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: the eval record has no integer 'step'"):
        rd.read_metrics()


def test_the_readers_select_by_kind():
    recs: list[Any] = [
        {"kind": "train", "step": 1},
        {"kind": "eval", "step": 2},
        {"kind": "anneal", "step": 2},
        {"kind": "eval", "step": 4},
    ]
    assert [r["step"] for r in trains(recs)] == [1]
    assert [r["step"] for r in evals(recs)] == [2, 4]
    assert [r["kind"] for r in points(recs)] == ["eval", "anneal", "eval"]
    assert anneals(recs) == [recs[2]] and annealed_steps(recs) == {2}
    assert eval_at(recs, 4) is recs[3] and eval_at(recs, 3) is None


def test_what_the_trainer_writes_is_the_schema(tiny_corpus, tiny_recipe_path, tmp_path):
    cfg = run_cfg(tiny_recipe_path, steps=12, schedule="wsd", cooldowns=[4], cooldown_fraction=0.5)
    train(cfg, tmp_path / "r", corpus=tiny_corpus, log=lambda *_: None)
    records = RunDir(tmp_path / "r").read_metrics()
    assert {r["kind"] for r in records} == set(KINDS)
    conforms_all([dict(r) for r in records], "a new run")
    assert any("strata" in res for r in evals(records) for res in r["domains"].values())  # the optional fields are written too


def test_the_kept_records_are_the_schema():
    """Archived runs of a published study, forks placed by level among them (the optional ``levels``)."""
    runs = sorted((RESULTS / "architectures_rate_arms" / "runs").glob("mamba2-s0"))
    assert runs, "the published records are part of the repository"
    records = [dict(r) for r in RunDir(runs[0]).read_metrics()]
    conforms_all(records, runs[0].name)
    assert any("levels" in r for r in records) and any("mfu" in r for r in records)
    assert json.loads(json.dumps(records)) == records
