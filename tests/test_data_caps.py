"""Decompression caps: an archive member, a nested .gz, a jsonl line or a zstd frame past its cap is
skipped with a warning naming the file (and member), counted as ``oversized``; the rest is read."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import tracemalloc
from dataclasses import replace

import pytest
import zstandard

from basecap.data import MalformedRecordWarning, recipe_from_dict
from basecap.data import sources as sources_mod
from basecap.data.source_base import PreparedSource
from basecap.data.sources import read_source

MiB = 1 << 20


@pytest.fixture
def small_caps(monkeypatch):
    monkeypatch.setattr(sources_mod, "LIMITS", replace(sources_mod.LIMITS, member_bytes=MiB, line_bytes=MiB, frame_bytes=4 * MiB))


def jsonl_prep(path):
    recipe = recipe_from_dict({"name": "caps", "domains": {"prose": {}},
                               "sources": [{"kind": "jsonl", "domain": "prose", "paths": [str(path)]}]})
    return PreparedSource("s", recipe.sources[0], "ok", files=[path])


def rec(text: str) -> bytes:
    return (json.dumps({"text": text}) + "\n").encode()


def test_a_long_jsonl_line_is_skipped_and_the_file_goes_on(tmp_path, small_caps):
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(rec("first") + rec("x" * (2 * MiB)) + rec("third")))
    prep = jsonl_prep(path)
    with pytest.warns(MalformedRecordWarning, match=r"a\.jsonl\.zst:2: skipped, a line longer than 1,048,576 bytes"):
        docs = [d.text for d in read_source(prep)]
    assert docs == ["first", "third"] and prep.stats["oversized"] == 1


def test_a_zstd_bomb_stays_small_in_memory_and_past_its_frame_cap_ends_the_file(tmp_path, small_caps):
    """256 MiB of zeros in an 8 KiB frame: read with bounded memory; the frame cap stops the file."""
    zc = zstandard.ZstdCompressor()
    path = tmp_path / "bomb.jsonl.zst"
    path.write_bytes(zc.compress(rec("before")) + zc.compress(b"\0" * (256 * MiB)) + zc.compress(rec("after")))
    assert path.stat().st_size < 64 * 1024
    prep = jsonl_prep(path)
    tracemalloc.start()
    with pytest.warns(MalformedRecordWarning, match="bomb.jsonl.zst:2: skipped, a zstd frame decompresses to more than 4,194,304"):
        docs = [d.text for d in read_source(prep)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert docs == ["before"] and prep.stats["oversized"] >= 1 and prep.stats["unreadable_files"] == 1
    assert peak < 64 * MiB, peak


def test_one_decompress_call_is_bounded_whatever_the_ratio(tmp_path):
    path = tmp_path / "zeros.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"\0" * (64 * MiB)))
    sizes = [len(c) for c in sources_mod._zstd_chunks(path, MiB)]
    assert sum(sizes) == 64 * MiB and max(sizes) <= 40 * MiB


def tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(f"pkg-1.0/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_oversized_archive_members_and_nested_gz_are_skipped(tmp_path, small_caps):
    archive = tmp_path / "pkg-1.0.tar.gz"
    archive.write_bytes(tar_gz({"a.txt": b"small text one", "big.txt": b"y" * (2 * MiB),
                                "bomb.txt.gz": gzip.compress(b"z" * (3 * MiB)), "b.txt.gz": gzip.compress(b"small text two")}))
    recipe = recipe_from_dict({"name": "caps", "domains": {"code": {}}, "sources": [
        {"kind": "pip_sdist", "domain": "code", "package": "pkg", "version": "1.0", "sha256": "0" * 64}]})
    prep = PreparedSource("s", recipe.sources[0], "ok", archive=archive)
    with pytest.warns(MalformedRecordWarning) as warned:
        docs = [d.text for d in read_source(prep)]
    assert docs == ["small text one", "small text two"] and prep.stats["oversized"] == 2
    msgs = [str(w.message) for w in warned]
    assert any("pkg-1.0.tar.gz:big.txt: skipped" in m for m in msgs) and any("pkg-1.0.tar.gz:bomb.txt.gz: skipped" in m for m in msgs)


def test_an_oversized_file_of_a_files_source_is_skipped(tmp_path, small_caps):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("a small file")
    (tmp_path / "docs" / "b.txt.gz").write_bytes(gzip.compress(b"q" * (2 * MiB)))
    recipe = recipe_from_dict({"name": "caps", "domains": {"d": {}},
                               "sources": [{"kind": "files", "domain": "d", "root": str(tmp_path / "docs")}]})
    prep = PreparedSource("s", recipe.sources[0], "ok", files=sorted((tmp_path / "docs").iterdir()))
    with pytest.warns(MalformedRecordWarning, match=r"b\.txt\.gz: skipped"):
        assert [d.text for d in read_source(prep)] == ["a small file"]
    assert prep.stats["oversized"] == 1
