"""Selected documents are spooled to disk during a build: the same corpus, texts not held in memory, resumable."""

from __future__ import annotations

import random
import tracemalloc

import pytest
from test_data_helpers import WORDS, interrupt_after, slimpajama_records, write_jsonl_zst

from basecap.data import build as build_mod
from basecap.data import build_corpus, recipe_from_dict
from basecap.data import collect as collect_mod
from basecap.data import tokenize as tokenize_mod
from basecap.data.collect import Spool, Spooled, collect
from basecap.data.sources import prepare_source
from basecap.data.text import doc_digest, normalize_text
from basecap.data.tokenize import encode_texts, read_spans

SETS = {"RedPajamaCommonCrawl": "commoncrawl", "RedPajamaArXiv": "arxiv"}
CAP = 40_000  # arxiv's; commoncrawl has none


def _recipe(root, **build) -> dict:
    return {
        "name": "spool",
        "domains": {"commoncrawl": {}, "arxiv": {"role": "heldout", "max_bytes": CAP}},
        "splits": {"min_validation_tokens": 300, "min_test_tokens": 300},
        "tokenizer": {"vocab_size": 400, "sample_bytes_per_domain": 30_000},
        "build": {"unit_bytes": 10_000, **build},
        "sources": [{"kind": "jsonl", "paths": [str(root / "sp" / "**" / "*.jsonl.zst")],
                     "domain_field": "meta.redpajama_set_name", "domain_map": SETS}],
    }


def _write_shards(root) -> list[dict]:
    """SlimPajama's layout, every set mixed in every file; the last file repeats some of the first."""
    files = [slimpajama_records(280, seed=i) for i in range(3)]
    files[2] += files[0][:30]
    for i, recs in enumerate(files):
        write_jsonl_zst(root / "sp" / "train" / "chunk1" / f"example_train_{i}.jsonl.zst", recs)
    return [r for recs in files for r in recs]


def _expected(records: list[dict], recipe) -> dict[str, list[tuple[bytes, str]]]:
    """The selection computed offline from the texts in memory: de-duplicated, by digest, prefix reaching the cap."""
    seen, by_domain = set(), {d: [] for d in recipe.domains}
    for r in records:
        d = SETS.get(r["meta"]["redpajama_set_name"])
        text = normalize_text(r["text"])
        if d and doc_digest(text) not in seen:
            seen.add(doc_digest(text))
            by_domain[d].append((doc_digest(text), text))
    out = {}
    for d, docs in by_domain.items():
        cap, total, out[d] = recipe.domains[d].max_bytes, 0, []
        for dg, text in sorted(docs):
            if cap is not None and total >= cap:
                break
            out[d].append((dg, text))
            total += len(text.encode("utf-8"))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("spool")
    records = _write_shards(root)
    recipe = recipe_from_dict(_recipe(root))
    samples = []
    real_train = build_mod.train_bpe
    mp = pytest.MonkeyPatch()
    mp.setattr(build_mod, "train_bpe", lambda sample, *a, **k: samples.append(list(sample)) or real_train(sample, *a, **k))
    try:
        corpus = build_corpus(recipe, home=root / "home", log=lambda m: None, workers=2)
    finally:
        mp.undo()
    return root, recipe, corpus, _expected(records, recipe), samples[0]


def test_spooled_build_gives_the_in_memory_corpus(built):
    """Capped and uncapped domain: the selection, the tokenizer sample and every shard's bytes as from the texts."""
    _, recipe, corpus, expected, sample = built
    assert len(expected["commoncrawl"]) == 3 * 280 // 7  # uncapped: every distinct document
    assert CAP <= sum(len(t.encode()) for _, t in expected["arxiv"]) < CAP + 2_000 < 3 * 280 // 7 * 600  # capped
    rows = [ln.split("\t") for ln in (corpus.dir / "documents.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    cut = recipe.splits.validation + recipe.splits.test
    want_sample = []
    for d, docs in expected.items():
        text_of = {dg.hex(): t for dg, t in docs}
        mine = [r for r in rows if r[0] == d]
        assert sorted(r[2] for r in mine) == sorted(text_of)
        assert all(int(r[3]) == len(text_of[r[2]].encode()) for r in mine)
        for split in ("train", "validation", "test"):
            texts = [text_of[r[2]] for r in mine if r[1] == split]
            toks, _ = encode_texts(corpus.tokenizer, texts, corpus.eot_id, corpus.dtype)
            assert (corpus.dir / "tokens" / f"{d}.{split}.bin").read_bytes() == toks.tobytes(), (d, split)
        room = recipe.tokenizer.sample_bytes_per_domain  # the old sampling: the texts in digest order, cut at room
        for dg, t in [x for x in docs if build_mod.split_key(x[0]) >= cut]:
            if room <= 0:
                break
            raw = t.encode()[:room]
            want_sample.append(raw.decode("utf-8", errors="ignore"))
            room -= len(raw)
    assert sample == want_sample
    assert corpus.manifest["domains"]["commoncrawl"]["duplicates_removed"] == 5  # records 0, 7, .., 28 of file 0
    assert not (corpus.dir / "work").exists()


def test_selection_records_hold_no_text(tmp_path):
    """An uncapped domain: memory holds a record per document, the text lies in the spool, byte for byte."""
    rng = random.Random(2)
    recs = [{"text": " ".join(rng.choices(WORDS, k=1000)), "meta": {"redpajama_set_name": "RedPajamaCommonCrawl"}}
            for _ in range(1000)]
    write_jsonl_zst(tmp_path / "cc.jsonl.zst", recs)  # about 5 MB of text
    recipe = recipe_from_dict(_recipe(tmp_path) | {"sources": [
        {"kind": "jsonl", "paths": [str(tmp_path / "cc.jsonl.zst")], "domain_field": "meta.redpajama_set_name",
         "domain_map": SETS}]})
    prep = prepare_source(recipe.sources[0], 0, tmp_path, log=lambda m: None)
    spool = Spool(tmp_path / "work" / "spool")
    tracemalloc.start()
    selected, _ = collect(recipe, [prep], lambda m: None, spool=spool)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    items = selected["commoncrawl"]
    assert len(items) == 1000 and prep.stats["bytes_read"] > 4_500_000
    assert all(isinstance(rec, Spooled) and len(rec.origin) < 40 for _, _, rec in items)
    assert peak < 2_500_000, peak  # records, digests, a decompressed piece: not the 4.6 MB of text
    texts = {r["text"] for r in recs}
    got = read_spans(spool.path("commoncrawl"), [(rec.offset, n) for _, n, rec in items])
    assert {b.decode() for b in got} == texts and all(doc_digest(b.decode()) == dg for (dg, _, _), b in zip(items, got))


def test_interrupted_build_keeps_its_spool_in_work_and_resumes(built, tmp_path, monkeypatch):
    root, _, corpus, _, _ = built
    monkeypatch.setattr(tokenize_mod, "_committed", interrupt_after(2, []))
    recipe = recipe_from_dict(_recipe(root, workers=1))
    with pytest.raises(KeyboardInterrupt):
        build_corpus(recipe, home=tmp_path / "home", log=lambda m: None)
    work = next((tmp_path / "home" / "corpora").glob(".tmp-*")) / "work"
    assert sorted(p.name for p in (work / "spool").iterdir()) == ["arxiv.txt", "commoncrawl.txt"]
    assert len(list((work / "units").glob("*.npz"))) == 2

    assert (work / "collected.npz").is_file() and not list(work.glob("*.pkl"))  # the finished collection is committed too, no pickle

    def no_reading(prep):
        raise AssertionError(f"source {prep.id} read again on resume")

    monkeypatch.setattr(tokenize_mod, "_committed", lambda unit: None)
    monkeypatch.setattr(collect_mod, "read_source", no_reading)
    msgs = []
    again = build_corpus(recipe, home=tmp_path / "home", log=msgs.append)
    assert any("sources already read (resumed)" in m for m in msgs)
    assert any("2 already committed (resumed)" in m for m in msgs)
    assert again.dir.name == corpus.dir.name and not (again.dir / "work").exists()
    for f in sorted(p for p in corpus.dir.rglob("*") if p.is_file()):
        assert (again.dir / f.relative_to(corpus.dir)).read_bytes() == f.read_bytes(), f.name
    assert not list((tmp_path / "home" / "corpora").glob(".tmp-*"))


def test_file_texts_come_back_in_the_given_order(tmp_path):
    path = tmp_path / "spool.txt"
    path.write_bytes("aaébbbc".encode())
    spans = ((7, 1), (0, 2), (2, 2), (4, 3))
    assert list(tokenize_mod.FileTexts(str(path), spans)) == ["c", "aa", "é", "bbb"]
    assert len(tokenize_mod.FileTexts(str(path), spans)) == 4
