"""Corpus building: determinism, splits, de-duplication, bad bytes, jsonl, caching, atomicity."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from test_data_helpers import make_tiny_data, prose_doc, tiny_recipe, write_slimpajama_zst

from basecap.data import (
    Corpus,
    DataError,
    MalformedRecordWarning,
    build_corpus,
    load_corpus,
    recipe_from_dict,
    summarize,
)
from basecap.data import collect as collect_mod
from basecap.data import tokenize as tokenize_mod
from basecap.data.collect import BottomK
from basecap.data.text import Doc, decode_utf8, normalize_text, strip_email_headers


def _quiet(_msg):
    pass


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    data = make_tiny_data(root / "data")
    recipe = recipe_from_dict(tiny_recipe(data))
    corpus = build_corpus(recipe, home=root / "home", log=_quiet)
    return root, data, recipe, corpus


def _doc_rows(corpus: Corpus) -> list[list[str]]:
    lines = (corpus.dir / "documents.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [ln.split("\t") for ln in lines]


def test_build_layout_and_manifest(tiny):
    _, _, _, corpus = tiny
    assert corpus.domains == ["prose", "code"]
    assert corpus.dtype == np.uint16 and corpus.vocab_size <= 400
    assert corpus.tokenizer.token_to_id("<|endoftext|>") == corpus.eot_id
    m = corpus.manifest
    src = {s["id"]: s for s in m["sources"]}
    assert src["pajama"]["unmapped"] == {"RedPajamaBook": 1}
    assert src["prose-files"]["license"] == "test" and len(src["pajama"]["sha256"]) == 64
    for d in corpus.domains:
        for split in ("train", "validation", "test"):
            info = m["domains"][d]["splits"][split]
            toks = corpus.tokens(d, split)
            assert len(toks) == info["tokens"] and info["documents"] > 0
            # one separator after each document
            assert int((np.asarray(toks) == corpus.eot_id).sum()) == info["documents"]
            assert toks[-1] == corpus.eot_id
            assert int(corpus.token_bytes()[np.asarray(toks)].sum()) == info["bytes"]  # the bytes bpb divides by
    table = summarize(corpus)
    assert "prose" in table and "validation" in table and "tokens" in table


def test_shards_decode_to_the_documents(tiny):
    _, data, _, corpus = tiny
    originals = {p.read_text(encoding="utf-8") for p in (data / "prose").glob("*.txt")}
    toks = np.asarray(corpus.tokens("prose", "validation")).tolist()
    docs, cur = [], []
    for t in toks:
        if t == corpus.eot_id:
            docs.append(corpus.tokenizer.decode(cur, skip_special_tokens=False))
            cur = []
        else:
            cur.append(t)
    assert docs and all(isinstance(d, str) and d for d in docs)
    from_files = [d for d in docs if d in originals]
    assert from_files, "validation documents from the folder source decode back exactly"


def test_build_is_deterministic(tiny, tmp_path):
    root, data, recipe, corpus = tiny
    again = build_corpus(recipe_from_dict(tiny_recipe(data)), home=tmp_path / "home2", log=_quiet)
    assert again.dir.name == corpus.dir.name
    assert (again.dir / "manifest.json").read_bytes() == (corpus.dir / "manifest.json").read_bytes()
    assert (again.dir / "tokenizer.json").read_bytes() == (corpus.dir / "tokenizer.json").read_bytes()
    for f in (corpus.dir / "tokens").iterdir():
        assert (again.dir / "tokens" / f.name).read_bytes() == f.read_bytes()


def test_splits_are_disjoint_and_cover_the_selection(tiny):
    _, _, _, corpus = tiny
    rows = _doc_rows(corpus)
    split_of = {}
    for domain, split, digest, *_ in rows:
        assert digest not in split_of, "a document appears twice"
        split_of[digest] = (domain, split)
    for d in corpus.domains:
        n = sum(corpus.manifest["domains"][d]["splits"][s]["documents"] for s in ("train", "validation", "test"))
        assert n == sum(1 for v in split_of.values() if v[0] == d)


def test_min_eval_tokens_top_up(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    recipe = recipe_from_dict(tiny_recipe(data, validation=0.0, test=0.0,
                                          min_validation_tokens=1500, min_test_tokens=1500))
    corpus = build_corpus(recipe, home=tmp_path / "home", log=_quiet)
    for d in corpus.domains:
        sp = corpus.manifest["domains"][d]["splits"]
        total = sum(s["tokens"] for s in sp.values())
        for s in ("validation", "test"):
            assert sp[s]["tokens"] >= min(1500, total // 3)
        assert sp["train"]["documents"] > 0


def test_dedup_exact_across_files_and_sources(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    text = (data / "prose" / "doc000.txt").read_text(encoding="utf-8")
    (data / "prose" / "copy.txt").write_text(text, encoding="utf-8")
    (data / "prose" / "crlf.txt").write_bytes(text.replace("\n", "\r\n").encode())  # same after normalising
    raw = tiny_recipe(data)
    raw["sources"].append({"kind": "files", "name": "again", "domain": "code", "root": str(data / "prose"),
                           "include": ["doc000.txt"]})
    corpus = build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=_quiet)
    src = {s["id"]: s for s in corpus.manifest["sources"]}
    assert src["prose-files"]["duplicates"] == 2
    assert src["again"]["duplicates"] == 1 and src["again"]["documents_selected"] == 0
    digests = [r[2] for r in _doc_rows(corpus)]
    assert len(digests) == len(set(digests))


def test_bad_utf8_replaced_and_counted(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    (data / "prose" / "bad.txt").write_bytes(b"caf\xe9 and \xff\xfe ok\n" + prose_doc(random.Random(5)).encode())
    corpus = build_corpus(recipe_from_dict(tiny_recipe(data)), home=tmp_path / "home", log=_quiet)
    src = {s["id"]: s for s in corpus.manifest["sources"]}["prose-files"]
    assert src["bad_bytes"] == 3 and src["docs_with_bad_bytes"] == 1
    assert decode_utf8(b"caf\xe9 and \xff\xfe ok") == ("caf\ufffd and \ufffd\ufffd ok", 3)


def test_normalisation():
    assert normalize_text("\ufeffa\r\nb\rc") == "a\nb\nc"
    assert normalize_text("e\u0301") == "\u00e9"  # NFC
    mail = "From: x@y\nReceived: by z\nSubject: Hello\n  world\nX-Spam: no\n\nBody line\n"
    assert strip_email_headers(mail) == "Subject: Hello world\n\nBody line\n"


def test_malformed_jsonl_line_named_and_counted(tmp_path):
    data = tmp_path / "data"
    make_tiny_data(data, bad_line=True)
    with pytest.warns(MalformedRecordWarning, match=r"shard0\.jsonl\.zst:3: malformed"):
        corpus = build_corpus(recipe_from_dict(tiny_recipe(data)), home=tmp_path / "home", log=_quiet)
    src = {s["id"]: s for s in corpus.manifest["sources"]}["pajama"]
    assert src["malformed"] == 1
    assert src["documents_read"] == 40  # every good record still read, the build went on


def test_jsonl_zst_slimpajama_domain_mapping(tmp_path):
    data = tmp_path / "data"
    write_slimpajama_zst(data / "a.jsonl.zst", n_docs=30, seed=3)
    write_slimpajama_zst(data / "b.jsonl.zst", n_docs=30, seed=4)
    raw = {
        "name": "pajama",
        "domains": {"web": {}, "github": {"role": "heldout"}},
        "splits": {"min_validation_tokens": 100, "min_test_tokens": 100},
        "tokenizer": {"vocab_size": 350},
        "sources": [{"kind": "jsonl", "paths": [str(data / "*.jsonl.zst")],
                     "domain_field": "meta.redpajama_set_name",
                     "domain_map": {"RedPajamaC4": "web", "RedPajamaGithub": "github"}}],
    }
    corpus = build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=_quiet)
    src = corpus.manifest["sources"][0]
    assert src["files"] == 2 and src["documents_read"] == 60 and src["unmapped"] == {"RedPajamaBook": 2}
    assert corpus.manifest["domains"]["web"]["documents"] + corpus.manifest["domains"]["github"]["documents"] == 60 - src["duplicates"]
    code = corpus.tokenizer.decode(np.asarray(corpus.tokens("github", "train")[:200]).tolist())
    assert "def " in code or "for " in code or "class " in code or "import " in code


def test_cache_hit_on_second_build(tiny):
    root, data, recipe, corpus = tiny
    mtime = (corpus.dir / "manifest.json").stat().st_mtime_ns
    msgs = []
    again = build_corpus(recipe, home=root / "home", log=msgs.append)
    assert again.dir == corpus.dir
    assert any("up to date" in m for m in msgs)
    assert (corpus.dir / "manifest.json").stat().st_mtime_ns == mtime
    assert load_corpus(corpus.dir).manifest == corpus.manifest


def test_changed_source_changes_key(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    a = build_corpus(recipe_from_dict(tiny_recipe(data)), home=tmp_path / "home", log=_quiet)
    (data / "prose" / "new.txt").write_text(prose_doc(random.Random(9)), encoding="utf-8")
    b = build_corpus(recipe_from_dict(tiny_recipe(data)), home=tmp_path / "home", log=_quiet)
    assert a.dir != b.dir


def test_interrupted_build_leaves_nothing_complete(tmp_path, monkeypatch):
    data = make_tiny_data(tmp_path / "data")

    def boom(unit):
        raise KeyboardInterrupt

    monkeypatch.setattr(tokenize_mod, "_committed", boom)
    with pytest.raises(KeyboardInterrupt):
        build_corpus(recipe_from_dict(tiny_recipe(data)), home=tmp_path / "home", log=_quiet)
    left = sorted(p.name for p in (tmp_path / "home" / "corpora").iterdir())
    assert [n for n in left if not n.startswith((".tmp-", ".lock-"))] == []  # only the work kept for resuming
    assert not list((tmp_path / "home" / "corpora").glob("*/manifest.json"))


def test_failure_before_any_work_leaves_nothing(tmp_path, monkeypatch):
    data = make_tiny_data(tmp_path / "data")

    def boom(*a, **k):
        raise RuntimeError("no reading today")

    # failing while the sources are read: nothing committed yet (a finished collection is kept, see test_data_spool)
    monkeypatch.setattr(collect_mod, "read_source", boom)
    with pytest.raises(RuntimeError):
        build_corpus(recipe_from_dict(tiny_recipe(data)), home=tmp_path / "home", log=_quiet)
    assert [p.name for p in (tmp_path / "home" / "corpora").iterdir() if not p.name.startswith(".lock-")] == []


def test_missing_required_source_fails_optional_is_skipped(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    raw = tiny_recipe(data)
    raw["sources"].append({"kind": "files", "domain": "code", "root": str(tmp_path / "nowhere"), "optional": True})
    msgs = []
    corpus = build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=msgs.append)
    skipped = [s for s in corpus.manifest["sources"] if s["status"] == "skipped"]
    assert len(skipped) == 1 and "no files" in skipped[0]["reason"]
    assert sum("skipped" in m for m in msgs) == 1
    raw["sources"][-1]["optional"] = False
    with pytest.raises(DataError, match="required"):
        build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=_quiet)


def test_empty_optional_domain_is_skipped(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    raw = tiny_recipe(data)
    raw["domains"]["math"] = {"role": "heldout", "optional": True}
    raw["sources"].append({"kind": "files", "domain": "math", "root": str(tmp_path / "none"), "optional": True})
    corpus = build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=_quiet)
    assert corpus.domains == ["prose", "code"] and "math" in corpus.manifest["skipped_domains"]


def test_bottom_k_matches_offline_selection():
    rng = random.Random(0)
    docs = [(rng.randbytes(32), rng.randint(1, 50)) for _ in range(300)]
    for cap in (1, 100, 1000, 10**6):
        sel = BottomK(cap)
        for dg, n in docs:
            sel.add(dg, n, Doc("d", "x", "o"))
        want, total = [], 0
        for dg, n in sorted(docs):
            if total >= cap:
                break
            want.append(dg)
            total += n
        assert [d for d, _, _ in sel.items()] == want


def test_domain_cap_is_deterministic_subset(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    raw = tiny_recipe(data)
    raw["domains"]["prose"]["max_bytes"] = 20_000
    corpus = build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=_quiet)
    info = corpus.manifest["domains"]["prose"]
    assert 20_000 <= info["bytes"] < 20_000 + 3_000
    raw["sources"].reverse()  # reading order does not change the selection
    again = build_corpus(recipe_from_dict(raw), home=tmp_path / "home2", log=_quiet)
    rows = lambda c: sorted(r[2] for r in _doc_rows(c) if r[0] == "prose")  # noqa: E731
    assert rows(corpus) == rows(again)


def test_manifest_names_the_final_corpus_only(tiny):
    _, _, _, corpus = tiny
    text = (corpus.dir / "manifest.json").read_text()
    m = json.loads(text)
    assert m["format"] == "basecap-corpus/1" and m["key"].startswith(corpus.dir.name.split("-")[-1])
    assert ".tmp-" not in text  # no trace of the temporary build folder


def test_truncated_zst_warns_counts_and_keeps_building(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    shard = data / "pajama" / "shard0.jsonl.zst"
    good = shard.read_bytes()
    write_slimpajama_zst(data / "pajama" / "shard1.jsonl.zst", n_docs=10, seed=11)
    cut = data / "pajama" / "shard1.jsonl.zst"
    cut.write_bytes(cut.read_bytes()[:-10])
    with pytest.warns(MalformedRecordWarning, match=r"shard1\.jsonl\.zst:\d+: stream unreadable"):
        corpus = build_corpus(recipe_from_dict(tiny_recipe(data)), home=tmp_path / "home", log=_quiet)
    src = {s["id"]: s for s in corpus.manifest["sources"]}["pajama"]
    assert src["unreadable_files"] == 1 and src["files"] == 2
    assert shard.read_bytes() == good and src["documents_read"] >= 40


def test_tokenizer_from_file_and_wide_vocab(tiny, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from basecap.config_base import ConfigError

    _, data, _, corpus = tiny
    raw = tiny_recipe(data)
    raw["tokenizer"] = {"kind": "file", "path": str(corpus.tokenizer_path)}
    reuse = build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=_quiet)
    assert reuse.eot_id == corpus.eot_id and reuse.vocab_size == corpus.vocab_size
    # same text, same tokenizer: the same shards as the corpus that trained it
    assert np.array_equal(reuse.tokens("code", "train"), corpus.tokens("code", "train"))

    vocab = {f"w{i}": i for i in range(70_000)} | {"[UNK]": 70_000, "<|endoftext|>": 70_001}
    wide = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    wide.pre_tokenizer = pre_tokenizers.Whitespace()
    wide.save(str(tmp_path / "wide.json"))
    raw["tokenizer"] = {"path": str(tmp_path / "wide.json")}
    big = build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=_quiet)
    assert big.dtype == np.uint32 and big.tokens("prose", "train").dtype == np.uint32
    assert big.eot_id == 70_001 and big.tokens("prose", "train")[-1] == 70_001

    del vocab["<|endoftext|>"]
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(tmp_path / "noeot.json"))
    raw["tokenizer"] = {"path": str(tmp_path / "noeot.json")}
    with pytest.raises(ConfigError, match="has no token"):
        build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=_quiet)


def test_data_verify_checks_every_shard_against_its_manifest(tiny_corpus, tiny_recipe_path, tmp_path, capsys):
    import shutil

    from basecap.cli import main

    assert main(["data", "verify", str(tiny_corpus.dir)]) == 0
    assert main(["data", "verify", str(tiny_recipe_path)]) == 0  # the recipe's built corpus, found, not built
    assert "every shard matches" in capsys.readouterr().out
    copy = tmp_path / tiny_corpus.dir.name
    shutil.copytree(tiny_corpus.dir, copy)
    shard = copy / tiny_corpus.manifest["domains"]["prose"]["splits"]["train"]["file"]
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    (copy / tiny_corpus.manifest["domains"]["code"]["splits"]["test"]["file"]).write_bytes(b"12")
    assert main(["data", "verify", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "prose.train.bin: SHA-256" in err and "code.test.bin: 2 bytes, the manifest records" in err
    assert main(["data", "verify", str(tmp_path / "nope.toml")]) == 2


def test_tokenizer_trained_on_the_training_domains_only(tiny, tmp_path):
    """The held-out-vocabulary control: a BPE trained on prose alone leaves no code-only merge, so every code target is
    spelled with ids that prose uses too."""
    from basecap.config_base import ConfigError

    _, data, _, corpus = tiny
    raw = tiny_recipe(data)
    raw["tokenizer"] = dict(raw.get("tokenizer", {}), train_domains=["prose"])
    ctl = build_corpus(recipe_from_dict(raw), home=tmp_path / "home", log=_quiet)
    assert ctl.manifest["tokenizer"]["train_domains"] == ["prose"] and set(ctl.manifest["tokenizer"]["trained_on_bytes"]) == {"prose"}

    def pieces_not_in_prose(c):  # learned (multi-byte) vocabulary entries whose text never occurs in the prose train split
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(c.tokenizer_path))
        prose = tok.decode(np.asarray(c.tokens("prose", "train"), dtype=np.int64).tolist())
        pieces = [tok.decode([i]) for i in range(tok.get_vocab_size()) if c.token_bytes()[i] > 1]
        return sum(p.strip() not in prose for p in pieces if p.strip())

    assert pieces_not_in_prose(corpus) > 10  # the full BPE learned code's words (lambda, yield, ...)
    assert pieces_not_in_prose(ctl) == 0
    raw["tokenizer"]["train_domains"] = ["poetry"]
    with pytest.raises(ConfigError, match="train_domains"):
        recipe_from_dict(raw)
