"""Parallel tokenisation: the corpus does not depend on the worker count; an interrupted build resumes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_data_helpers import interrupt_after, make_tiny_data, tiny_recipe

from basecap.data import build_corpus, recipe_from_dict
from basecap.data import tokenize as tokenize_mod
from basecap.data.tokenize import plan_units


def _recipe(data: Path):
    raw = tiny_recipe(data)
    raw["build"] = {"unit_bytes": 8000}  # about a dozen units
    return recipe_from_dict(raw)


def _files(corpus) -> dict[str, bytes]:
    return {p.relative_to(corpus.dir).as_posix(): p.read_bytes() for p in sorted(corpus.dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("par")
    data = make_tiny_data(root / "data")
    msgs = []
    corpus = build_corpus(_recipe(data), home=root / "home1", log=msgs.append, workers=1)
    return data, corpus, msgs


def test_worker_count_does_not_change_the_corpus(one_worker, tmp_path):
    data, corpus, msgs = one_worker
    assert any("units" in m and "1 worker" in m for m in msgs)
    msgs2 = []
    two = build_corpus(_recipe(data), home=tmp_path / "home2", log=msgs2.append, workers=2)
    assert any("2 workers" in m for m in msgs2)
    assert two.dir.name == corpus.dir.name
    assert _files(two) == _files(corpus)  # shards, tokenizer, documents.tsv and manifest, byte for byte
    assert not (two.dir / "work").exists()
    raw = tiny_recipe(data)
    raw["build"] = {"workers": 2, "unit_bytes": 50_000}  # build settings are not part of the cache key
    assert recipe_from_dict(raw).build.workers == 2
    again = []
    assert build_corpus(recipe_from_dict(raw), home=tmp_path / "home2", log=again.append).dir == two.dir
    assert any("up to date" in m for m in again)


def test_interrupted_build_resumes_from_committed_units(one_worker, tmp_path, monkeypatch):
    data, corpus, _ = one_worker
    calls = []
    monkeypatch.setattr(tokenize_mod, "_committed", interrupt_after(3, calls))
    msgs = []
    with pytest.raises(KeyboardInterrupt):
        build_corpus(_recipe(data), home=tmp_path / "home", log=msgs.append, workers=2)
    assert any("finished work is kept" in m for m in msgs)
    work = next((tmp_path / "home" / "corpora").glob(".tmp-*")) / "work"
    committed = sorted(p.name for p in (work / "units").glob("*.npz"))
    assert len(committed) >= 3 and (work / "tokenizer.json").is_file()

    calls.clear()
    monkeypatch.setattr(tokenize_mod, "_committed", lambda unit: calls.append(unit.file))
    msgs = []
    resumed = build_corpus(_recipe(data), home=tmp_path / "home", log=msgs.append, workers=2)
    assert any("resuming an interrupted build" in m for m in msgs)
    assert any("tokenizer: reusing" in m for m in msgs)
    line = next(m for m in msgs if "already committed (resumed)" in m)
    assert f"{len(committed)} already committed" in line
    assert not set(calls) & set(committed)  # finished units were not tokenised again
    n_units = int(line.split("tokenising: ")[1].split(" units")[0])
    assert len(calls) == n_units - len(committed)
    assert _files(resumed) == _files(corpus)
    assert not list((tmp_path / "home" / "corpora").glob(".tmp-*"))


def test_units_cover_documents_in_order():
    rng = np.random.default_rng(0)
    nbytes = rng.integers(1, 100, size=50)
    order = rng.permutation(50)
    digests = [bytes([i]) * 16 for i in range(50)]
    units = plan_units("d", digests, nbytes, order, "tok", unit_bytes=300)
    assert [i for u in units for i in u.docs] == order.tolist()
    assert all(u.nbytes >= 300 for u in units[:-1]) and all(u.nbytes - nbytes[u.docs[-1]] < 300 for u in units)
    assert len({u.file for u in units}) == len(units)
    other = plan_units("d", digests, nbytes, order, "another tokenizer", unit_bytes=300)
    assert all(a.key != b.key for a, b in zip(units, other))  # a new tokenizer never reuses old units
