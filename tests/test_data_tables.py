"""Columnar sources (parquet, arrow, hf_disk) and streaming reads: same documents as jsonl, bounded memory."""

from __future__ import annotations

import json
import random
import tracemalloc
import warnings
from pathlib import Path

import pytest
from test_data_helpers import (
    WORDS,
    records_table,
    slimpajama_records,
    write_hf_disk,
    write_jsonl_zst,
)

from basecap.data import (
    DataError,
    MalformedRecordWarning,
    build_corpus,
    recipe_from_dict,
)
from basecap.data.recipe import source_id
from basecap.data.sources import prepare_source, read_source
from basecap.data.tables import _batches

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SET_MAP = {"RedPajamaC4": "web", "RedPajamaGithub": "code"}


def _src(kind: str, paths: list[Path], **kw) -> dict:
    return {"kind": kind, "name": kind, "paths": [str(p) for p in paths], "domain_field": "meta.redpajama_set_name",
            "domain_map": SET_MAP, **kw}


def _recipe(src: dict):
    domains = {"web": {}, "code": {}} if "domain_map" in src else {src["domain"]: {}}
    return recipe_from_dict({"name": "t", "domains": domains, "sources": [src]})


def _read(src: dict, home: Path):
    recipe = _recipe(src)
    prep = prepare_source(recipe.sources[0], 0, home, log=lambda m: None)
    assert prep.status == "ok", prep.reason
    docs = [(d.domain, d.text) for d in read_source(prep)]
    return docs, prep


@pytest.fixture(scope="module")
def records():
    return slimpajama_records(60, seed=5)


def test_every_format_reads_the_same_documents(records, tmp_path):
    table = records_table(records)
    want, _ = _read(_src("jsonl", [write_jsonl_zst(tmp_path / "a.jsonl.zst", records)]), tmp_path)
    assert {d for d, _ in want} == {"web", "code"} and len(want) == sum(r["meta"]["redpajama_set_name"] in SET_MAP for r in records)

    (tmp_path / "pq" / "sub").mkdir(parents=True)
    pq.write_table(table.slice(0, 25), tmp_path / "pq" / "part-0.parquet")
    pq.write_table(table.slice(25), tmp_path / "pq" / "sub" / "part-1.parquet")
    got, prep = _read(_src("parquet", [tmp_path / "pq"], batch_rows=8), tmp_path)  # a folder: every *.parquet under it
    assert got == want and prep.stats["files"] == 2

    with pa.OSFile(str(tmp_path / "t.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        for b in table.to_batches(max_chunksize=9):
            w.write_batch(b)
    assert _read(_src("arrow", [tmp_path / "t.arrow"]), tmp_path)[0] == want  # IPC file format

    (tmp_path / "s").mkdir()
    with pa.OSFile(str(tmp_path / "s" / "t.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)  # one batch of 60 rows, read in slices of batch_rows
    assert _read(_src("arrow", [tmp_path / "s"], batch_rows=16), tmp_path)[0] == want  # stream, folder

    write_hf_disk(tmp_path / "hf", [table.slice(0, 30), table.slice(30)])
    got, prep = _read(_src("hf_disk", [tmp_path / "hf"]), tmp_path)
    assert got == want and prep.stats["files"] == 2 and prep.unmapped["RedPajamaBook"] > 0


def test_hf_disk_dataset_dict_splits(records, tmp_path):
    table = records_table(records)
    write_hf_disk(tmp_path / "dd" / "train", [table.slice(0, 40)])
    write_hf_disk(tmp_path / "dd" / "test", [table.slice(40)])
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    everything, _ = _read(_src("hf_disk", [tmp_path / "dd"]), tmp_path)
    train, _ = _read(_src("hf_disk", [tmp_path / "dd"], splits=["train"]), tmp_path)
    assert 0 < len(train) < len(everything)
    with pytest.raises(DataError, match=r"no split\(s\) \['validation'\]"):
        _read(_src("hf_disk", [tmp_path / "dd"], splits=["validation"]), tmp_path)
    (tmp_path / "junk").mkdir()
    with pytest.raises(DataError, match="not a save_to_disk folder"):
        _read(_src("hf_disk", [tmp_path / "junk"]), tmp_path)


def test_malformed_rows_are_named_and_counted(tmp_path):
    rows = {"text": ["good one", None, "good two", None], "domain_label": ["a", "a", "a", "a"]}
    pq.write_table(pa.table(rows), tmp_path / "x.parquet")
    pq.write_table(pa.table({"body": ["no text column", "here"]}), tmp_path / "y.parquet")
    src = {"kind": "parquet", "name": "p", "paths": [str(tmp_path / "*.parquet")], "domain": "web"}
    with pytest.warns(MalformedRecordWarning) as rec:
        docs, prep = _read(src, tmp_path)
    msgs = [str(w.message) for w in rec]
    assert any("x.parquet row 1: malformed record skipped (no string field 'text')" in m for m in msgs)
    assert any("x.parquet row 3: malformed" in m for m in msgs) and any("y.parquet row 0: malformed" in m for m in msgs)
    assert [t for _, t in docs] == ["good one", "good two"] and prep.stats["malformed"] == 4


def test_domain_field_as_struct_flat_column_or_json_string(tmp_path):
    texts = ["alpha doc", "beta doc", "gamma doc"]
    labels = ["RedPajamaC4", None, "RedPajamaGithub"]
    variants = {
        "struct": pa.table({"text": texts, "meta": pa.array([{"redpajama_set_name": x} if x else None for x in labels])}),
        "flat": pa.table({"text": texts, "meta.redpajama_set_name": labels}),
        "json": pa.table({"text": texts, "meta": [json.dumps({"redpajama_set_name": x}) if x else None for x in labels]}),
    }
    for name, table in variants.items():
        pq.write_table(table, tmp_path / f"{name}.parquet")
        docs, prep = _read(_src("parquet", [tmp_path / f"{name}.parquet"]), tmp_path)
        assert docs == [("web", "alpha doc"), ("code", "gamma doc")], name
        assert prep.unmapped == {"<missing>": 1}, name


def test_unreadable_table_file_warns_and_build_goes_on(records, tmp_path):
    pq.write_table(records_table(records), tmp_path / "good.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.warns(MalformedRecordWarning, match=r"bad\.parquet row 0: file unreadable"):
        docs, prep = _read(_src("parquet", [tmp_path / "*.parquet"]), tmp_path)
    assert prep.stats["unreadable_files"] == 1 and len(docs) > 0


def test_missing_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    raw = {"name": "t", "domains": {"web": {}}, "sources": [{"kind": "parquet", "paths": ["x.parquet"], "domain": "web"}]}
    with pytest.raises(DataError, match="pyarrow is not installed"):
        prepare_source(recipe_from_dict(raw).sources[0], 0, tmp_path, log=lambda m: None)
    raw["sources"][0]["optional"] = True
    assert prepare_source(recipe_from_dict(raw).sources[0], 0, tmp_path, log=lambda m: None).status == "skipped"
    assert source_id(recipe_from_dict(raw).sources[0], 0) == "0-parquet"


def _peak_while_reading(src: dict, home: Path) -> tuple[int, int]:
    prep = prepare_source(_recipe(src).sources[0], 0, home, log=lambda m: None)
    tracemalloc.start()
    n = 0
    for doc in read_source(prep):
        n += len(doc.text)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, n


def test_large_shards_are_streamed_not_loaded(tmp_path):
    """Reading a shard holds about one decompressed chunk (jsonl) or one record batch (parquet) at a time."""
    rng = random.Random(0)
    recs = [{"text": " ".join(rng.choices(WORDS, k=250)), "meta": {"redpajama_set_name": ("RedPajamaC4", "RedPajamaGithub")[i % 2]}}
            for i in range(6000)]  # 7 MB of text
    write_jsonl_zst(tmp_path / "big.jsonl.zst", recs)
    peak, n = _peak_while_reading(_src("jsonl", [tmp_path / "big.jsonl.zst"]), tmp_path)
    assert n > 6_000_000 and peak < 1_500_000, (n, peak)
    pq.write_table(records_table(recs), tmp_path / "big.parquet", row_group_size=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        peak, n2 = _peak_while_reading(_src("parquet", [tmp_path / "big.parquet"], batch_rows=64), tmp_path)
    assert n2 == n and peak < 1_500_000, peak
    sizes = [b.num_rows for b in _batches(tmp_path / "big.parquet", ["text"], 64)]  # arrow buffers: one batch
    assert max(sizes) == 64 and sum(sizes) == 6000


def test_parquet_source_builds_with_manifest_counts(records, tmp_path):
    bad = records + [{"text": None, "meta": {"redpajama_set_name": "RedPajamaC4"}}]
    pq.write_table(records_table(bad), tmp_path / "d.parquet")
    raw = {"name": "pq", "domains": {"web": {}, "code": {"role": "heldout"}},
           "splits": {"min_validation_tokens": 100, "min_test_tokens": 100},
           "tokenizer": {"vocab_size": 350}, "sources": [_src("parquet", [tmp_path / "d.parquet"])]}
    with pytest.warns(MalformedRecordWarning, match=r"d\.parquet row 60"):
        corpus = build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=lambda m: None, workers=1)
    src = corpus.manifest["sources"][0]
    assert src["kind"] == "parquet" and src["malformed"] == 1 and src["files"] == 1
    assert src["origin"] == "parquet: 1 files" and set(src["unmapped"]) == {
        "RedPajamaArXiv", "RedPajamaBook", "RedPajamaCommonCrawl", "RedPajamaStackExchange", "RedPajamaWikipedia"}
    assert corpus.domains == ["web", "code"]


def test_selection_memory_is_bounded_by_the_domain_cap(tmp_path):
    """An uncapped source feeding a capped domain holds about the cap, not everything it reads."""
    from basecap.data.collect import Spool, collect

    rng = random.Random(1)
    recs = [{"text": " ".join(rng.choices(WORDS, k=250)), "meta": {"redpajama_set_name": "RedPajamaC4"}} for _ in range(4000)]
    write_jsonl_zst(tmp_path / "c4.jsonl.zst", recs)  # 5 MB of text
    raw = {"name": "t", "domains": {"web": {"max_bytes": 200_000}},
           "sources": [{"kind": "jsonl", "paths": [str(tmp_path / "c4.jsonl.zst")], "domain_field": "meta.redpajama_set_name",
                        "domain_map": {"RedPajamaC4": "web"}}]}
    recipe = recipe_from_dict(raw)
    prep = prepare_source(recipe.sources[0], 0, tmp_path, log=lambda m: None)
    tracemalloc.start()
    selected, _ = collect(recipe, [prep], lambda m: None, spool=Spool(tmp_path / "spool"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert prep.stats["bytes_read"] > 4_500_000 and 200_000 <= sum(n for _, n, _ in selected["web"]) < 202_000
    assert peak < 2_500_000, peak  # the cap's documents, the digests seen, one decompressed piece
