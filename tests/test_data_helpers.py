"""Helpers shared by the data-pipeline tests (no tests here): tiny generated corpora, never the real default."""

from __future__ import annotations

import json
import random
from pathlib import Path

import zstandard

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "river castle lantern quiet storm winter letter garden anchor silver morning candle").split()
CODE = ["def f(x):\n    return x + 1\n", "for i in range(10):\n    print(i)\n",
        "class A:\n    pass\n", "import os\nos.path.join('a', 'b')\n", "x = [y * 2 for y in z]\n"]


def prose_doc(rng: random.Random, n_words: int = 300) -> str:
    lines, line = [], []
    for _ in range(n_words):
        line.append(rng.choice(WORDS))
        if len(line) >= 12:
            lines.append(" ".join(line).capitalize() + ".")
            line = []
    return "\n".join(lines) + "\n"


def code_doc(rng: random.Random, n: int = 20) -> str:
    return "".join(rng.choice(CODE) for _ in range(n))


def write_prose_folder(folder: Path, n_docs: int = 40, seed: int = 0) -> Path:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        (folder / f"doc{i:03d}.txt").write_text(prose_doc(rng), encoding="utf-8")
    return folder


def write_slimpajama_zst(path: Path, n_docs: int = 40, seed: int = 1, bad_line: bool = False) -> Path:
    """jsonl.zst in the SlimPajama layout: code (Github) and prose (C4) records, plus a Book one."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_docs):
        if i % 2 == 0:
            rec = {"text": code_doc(rng), "meta": {"redpajama_set_name": "RedPajamaGithub"}}
        else:
            rec = {"text": prose_doc(rng, 120), "meta": {"redpajama_set_name": "RedPajamaC4"}}
        lines.append(json.dumps(rec))
    lines.append(json.dumps({"text": "a book", "meta": {"redpajama_set_name": "RedPajamaBook"}}))
    if bad_line:
        lines.insert(2, '{"text": "unterminated')
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.ZstdCompressor().compress(data))
    return path


def tiny_recipe(data: Path, **split_overrides) -> dict:
    """Two domains: prose from a folder of files and from jsonl.zst, code from jsonl.zst."""
    splits = {"validation": 0.1, "test": 0.1, "min_validation_tokens": 200, "min_test_tokens": 200}
    splits.update(split_overrides)
    return {
        "name": "tiny",
        "domains": {"prose": {"role": "train"}, "code": {"role": "heldout"}},
        "splits": splits,
        "tokenizer": {"kind": "bpe", "vocab_size": 400, "sample_bytes_per_domain": 200_000},
        "sources": [
            {"kind": "files", "name": "prose-files", "domain": "prose", "root": str(data / "prose"),
             "include": ["*.txt"], "license": "test"},
            {"kind": "jsonl", "name": "pajama", "paths": [str(data / "pajama" / "*.jsonl.zst")],
             "domain_field": "meta.redpajama_set_name",
             "domain_map": {"RedPajamaGithub": "code", "RedPajamaC4": "prose"}, "license": "test"},
        ],
    }


def make_tiny_data(root: Path, bad_line: bool = False) -> Path:
    write_prose_folder(root / "prose")
    write_slimpajama_zst(root / "pajama" / "shard0.jsonl.zst", bad_line=bad_line)
    return root


SLIMPAJAMA_SETS = ("RedPajamaCommonCrawl", "RedPajamaC4", "RedPajamaGithub", "RedPajamaArXiv",
                   "RedPajamaStackExchange", "RedPajamaBook", "RedPajamaWikipedia")


def set_doc(rng: random.Random, set_name: str, i: int) -> str:
    """A small document in the style of a SlimPajama set, tagged with a marker naming the set."""
    marker = f"marker{set_name.removeprefix('RedPajama').lower()} {i}\n"
    if set_name == "RedPajamaGithub":
        body = code_doc(rng, 12)
    elif set_name == "RedPajamaArXiv":
        body = "\\section{Result} Let $x_i = \\sum_{j} a_{ij}$. " + prose_doc(rng, 60)
    elif set_name == "RedPajamaStackExchange":
        body = "Q: how do I " + prose_doc(rng, 40) + "A: " + code_doc(rng, 3)
    else:
        body = prose_doc(rng, 80)
    return marker + body


def slimpajama_records(n_docs: int, seed: int, sets=SLIMPAJAMA_SETS) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n_docs):
        name = sets[i % len(sets)]
        out.append({"text": set_doc(rng, name, seed * 100000 + i), "meta": {"redpajama_set_name": name}})
    return out


def write_jsonl_zst(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")
    path.write_bytes(zstandard.ZstdCompressor().compress(data))
    return path


def records_table(records: list[dict]):
    """A pyarrow table: ``text`` and a ``meta`` struct column (the SlimPajama parquet layout)."""
    import pyarrow as pa

    meta = pa.array([r.get("meta") for r in records], type=pa.struct([("redpajama_set_name", pa.string())]))
    return pa.table({"text": pa.array([r.get("text") for r in records], type=pa.string()), "meta": meta})


def write_hf_disk(folder: Path, tables: list) -> Path:
    """The layout ``datasets.Dataset.save_to_disk`` writes: arrow streams, state.json, dataset_info.json."""
    import pyarrow as pa

    folder.mkdir(parents=True, exist_ok=True)
    n = len(tables)
    for i, t in enumerate(tables):
        with pa.OSFile(str(folder / f"data-{i:05d}-of-{n:05d}.arrow"), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
            for batch in t.to_batches(max_chunksize=7):
                w.write_batch(batch)
    state = {"_data_files": [{"filename": f"data-{i:05d}-of-{n:05d}.arrow"} for i in range(n)],
             "_fingerprint": "0", "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
             "_output_all_columns": False, "_split": None}
    (folder / "state.json").write_text(json.dumps(state), encoding="utf-8")
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}), encoding="utf-8")
    return folder


def interrupt_after(n: int, calls: list):
    """A stand-in for ``tokenize._committed``: records each committed unit's file in ``calls`` and raises
    KeyboardInterrupt at the n-th, as if the build were stopped there."""
    def hook(unit):
        calls.append(unit.file)
        if len(calls) == n:
            raise KeyboardInterrupt
    return hook
