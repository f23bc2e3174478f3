"""Fault injection into corpus builds: kill -9 at seeded random points of a build and of a parallel build (resumed
byte for byte), oversized archive members, files and lines, tampered and truncated token shards. Machinery:
``tests/faults_common.py`` (figures, forked processes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import os
import random
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from faults_common import FIGURES, SEED, die, figures, in_child, lock_is_free, quiet  # noqa: F401 - figures: the module's autouse fixture
from test_data_caps import tar_gz
from test_data_helpers import (
    code_doc,
    make_tiny_data,
    prose_doc,
    tiny_recipe,
    write_jsonl_zst,
)

from basecap.checkpoint import _sha256
from basecap.data import MalformedRecordWarning, build_corpus, recipe_from_dict
from basecap.data import build as build_mod
from basecap.data import collect as collect_mod
from basecap.data import sources as sources_mod
from basecap.data import tokenize as tokenize_mod

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forked children, flock and RLIMIT_FSIZE as on Linux")


# ---- corpus builds -------------------------------------------------------------------------------
# In pipeline order: inside source reading (at a document), after the collection is committed, inside tokenizer
# training, inside a unit's write (half the file), after a unit is committed, between two domains' shards, and
# with every shard written but no manifest yet.
BUILD_PHASES = ("reading", "collected", "in_bpe", "mid_commit", "committed", "shards", "before_manifest")


@pytest.fixture(scope="module")
def build_ref(tmp_path_factory):
    """Generated sources (a folder of files and a jsonl.zst) cut into small units, and their uninterrupted build,
    counting the documents read and listing the units in the order they commit."""
    root = tmp_path_factory.mktemp("faults_build")
    data = make_tiny_data(root / "data")
    recipe = recipe_from_dict(tiny_recipe(data) | {"build": {"unit_bytes": 8000, "workers": 1}})
    read, units = [], []
    real_read = collect_mod.read_source
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(collect_mod, "read_source", lambda prep: (read.append(1) or doc for doc in real_read(prep)))
        mp.setattr(tokenize_mod, "_committed", lambda unit: units.append(unit.file))
        corpus = build_corpus(recipe, home=root / "reference", log=quiet)
    return root, recipe, corpus, len(read), units


def arm_build(phase: str, where):
    """In a child: SIGKILL this process at ``phase`` of a build (``where``: a document count or a unit file)."""
    if phase == "reading":
        real_read, seen = collect_mod.read_source, [0]

        def read_source(prep):
            for doc in real_read(prep):
                seen[0] += 1
                if seen[0] == where:
                    die()
                yield doc

        collect_mod.read_source = read_source
    elif phase == "collected":
        real_save = build_mod.save_collected
        build_mod.save_collected = lambda *a, **k: (real_save(*a, **k), die())
    elif phase == "in_bpe":
        real_train = build_mod.train_bpe
        build_mod.train_bpe = lambda *a, **k: (real_train(*a, **k), die())
    elif phase == "mid_commit":
        real_commit = tokenize_mod._commit

        def commit(path, tokens, lengths):
            if Path(path).name == where:
                buf = io.BytesIO()
                np.savez(buf, tokens=tokens, lengths=lengths)
                with tokenize_mod.atomic_open(path) as f:
                    f.write(buf.getvalue()[: buf.tell() // 2])
                    f.flush()
                    die()
            real_commit(path, tokens, lengths)

        tokenize_mod._commit = commit
    elif phase == "committed":
        tokenize_mod._committed = lambda unit: die() if unit.file == where else None
    elif phase == "shards":
        real_shards, calls = build_mod._write_shards, [0]

        def write_shards(*a, **k):
            calls[0] += 1
            if calls[0] == 2:
                die()  # the first domain's shards are written
            return real_shards(*a, **k)

        build_mod._write_shards = write_shards
    elif phase == "before_manifest":
        real_write = build_mod.write_json
        build_mod.write_json = lambda path, *a, **k: die() if Path(path).name == "manifest.json" else real_write(path, *a, **k)


def build_plan(rng: random.Random, n_docs: int, units: list[str]) -> list[tuple[str, object]]:
    """Every phase once, in pipeline order, at seeded random documents and units (a unit cut mid-write comes
    no later than the unit committed after it)."""
    cut, after = sorted(rng.sample(range(len(units)), 2))
    where = {"reading": rng.randrange(1, n_docs), "mid_commit": units[cut], "committed": units[after]}
    return [(p, where.get(p)) for p in BUILD_PHASES]


def file_digests(folder: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(folder)): (_sha256(p), p.stat().st_size) for p in sorted(folder.rglob("*")) if p.is_file()}


def at_unit(where) -> str:
    """``@6`` for a document count, ``@prose-00006`` for a unit file, nothing for None."""
    return "" if where is None else f"@{where}" if isinstance(where, int) else "@" + "-".join(where.split("-")[:2])


def build_evidence(corpora: Path, name: str, phase: str, where):
    work = corpora / f".tmp-{name}" / "work"
    assert not (corpora / name).exists(), "an interrupted build left a folder that looks complete"
    assert lock_is_free(corpora / f".lock-{name}")
    if phase == "reading":
        assert (work / "spool").is_dir() and not (work / "collected.npz").exists()
    elif phase == "collected":
        assert (work / "collected.npz").is_file() and not (work / "tokenizer.json").exists()
    elif phase == "in_bpe":
        assert not (work / "tokenizer.json").exists()
    elif phase == "mid_commit":
        assert list((work / "units").glob(f".{where}.tmp-*")) and not (work / "units" / where).exists()
    elif phase == "committed":
        assert (work / "units" / where).is_file()
    elif phase == "shards":
        assert work.is_dir() and list((corpora / f".tmp-{name}" / "tokens").glob("*.bin"))
    elif phase == "before_manifest":
        assert not work.exists() and not (corpora / f".tmp-{name}" / "manifest.json").exists()


def test_kill_9_at_random_points_of_a_corpus_build_then_resume_byte_for_byte(build_ref):
    root, recipe, ref_corpus, n_docs, units = build_ref
    home, name = root / "killed", ref_corpus.dir.name
    plan = build_plan(random.Random(SEED), n_docs, units)
    for phase, where in plan:
        def child(phase=phase, where=where):
            arm_build(phase, where)
            build_corpus(recipe, home=home, log=quiet)

        assert in_child(child) == -signal.SIGKILL, f"{phase} ({where}): not killed"
        build_evidence(home / "corpora", name, phase, where)
    corpus = build_corpus(recipe, home=home, log=quiet)
    assert corpus.dir.name == name
    want, got = file_digests(ref_corpus.dir), file_digests(corpus.dir)
    assert got == want, "the resumed corpus differs from the uninterrupted build"
    assert not list((home / "corpora").glob(".tmp-*"))
    lost = sum(size for f, (digest, size) in want.items() if got.get(f, ("", 0))[0] != digest)
    FIGURES.add("corpus build: kill -9 at seeded random points", faults=len(plan), resumes=1, exact=1, bytes_lost=lost,
                note=f"{len(plan)} kills chained in one build ({', '.join(p + at_unit(w) for p, w in plan)}); "
                     f"{len(want)} files, SHA-256 equal")


def gone(pid: int) -> bool:
    """Whether a process (not our child) has exited: no longer listed, or a zombie waiting for its new parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_kill_9_of_a_parallel_build_leaves_no_worker_behind_and_resumes_byte_for_byte(build_ref):
    """Two tokenising processes: the build is killed once the first unit is in; its workers exit on their own."""
    root, recipe, ref_corpus, _, _ = build_ref
    home, pids = root / "killed_parallel", root / "workers.pid"
    real_pool = tokenize_mod._pool

    @contextlib.contextmanager
    def pool(*a, **k):
        with real_pool(*a, **k) as p:
            pids.write_text(" ".join(str(w.pid) for w in p._pool))
            yield p

    def child():
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the orphaned workers' broken-pipe tracebacks
        tokenize_mod._pool, tokenize_mod._committed = pool, lambda unit: die()
        build_corpus(recipe, home=home, log=quiet, workers=2)

    assert in_child(child) == -signal.SIGKILL
    workers = [int(w) for w in pids.read_text().split()]
    deadline = time.monotonic() + 30
    while not all(gone(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [w for w in workers if not gone(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, f"tokenising workers {left} outlived the killed build"
    assert len(list((home / "corpora" / f".tmp-{ref_corpus.dir.name}" / "work" / "units").glob("*.npz"))) >= 1
    corpus = build_corpus(recipe, home=home, log=quiet, workers=2)
    want, got = file_digests(ref_corpus.dir), file_digests(corpus.dir)
    assert got == want
    FIGURES.add("corpus build: kill -9 with 2 tokenising workers", faults=1, resumes=1, exact=1,
                bytes_lost=sum(size for f, (digest, size) in want.items() if got.get(f, ("", 0))[0] != digest),
                note=f"both workers exited by themselves within {30 - (deadline - time.monotonic()):.1f} s; the resume "
                     "with 2 workers equals the 1-worker build")


def test_oversized_members_and_lines_are_skipped_counted_and_the_build_goes_on(tmp_path, monkeypatch):
    """Caps lowered to 16 KiB: an archive member, a nested .gz, a file, a .gz file and a jsonl line past them."""
    cap, big = 16 << 10, 40 << 10
    monkeypatch.setattr(sources_mod, "LIMITS", dataclasses.replace(sources_mod.LIMITS, member_bytes=cap, line_bytes=cap))
    data = make_tiny_data(tmp_path / "data")
    rng = random.Random(SEED)
    (data / "prose" / "huge.txt").write_text(prose_doc(rng, big // 5), encoding="utf-8")
    (data / "prose" / "bomb.txt.gz").write_bytes(gzip.compress(b"z" * big))
    write_jsonl_zst(data / "pajama" / "shard1.jsonl.zst", [
        {"text": prose_doc(rng, 100), "meta": {"redpajama_set_name": "RedPajamaC4"}},
        {"text": prose_doc(rng, big // 5), "meta": {"redpajama_set_name": "RedPajamaC4"}},
        {"text": prose_doc(rng, 100), "meta": {"redpajama_set_name": "RedPajamaC4"}}])
    archive = tar_gz({"a.py": code_doc(rng).encode(), "big.py": code_doc(rng, 2000).encode(),
                      "bomb.py.gz": gzip.compress(b"q" * big), "b.py.gz": gzip.compress(code_doc(rng).encode())})
    home = tmp_path / "home"
    cached = home / "downloads" / "pip" / "pkg-1.0" / "pkg-1.0.tar.gz"  # as fetched before: no network
    cached.parent.mkdir(parents=True)
    cached.write_bytes(archive)
    raw = tiny_recipe(data)
    raw["sources"][0]["include"] = ["*.txt", "*.txt.gz"]
    raw["sources"].append({"kind": "pip_sdist", "name": "sdist", "domain": "code", "package": "pkg", "version": "1.0",
                           "sha256": hashlib.sha256(archive).hexdigest(), "include": ["*.py", "*.py.gz"]})
    with pytest.warns(MalformedRecordWarning) as warned:
        corpus = build_corpus(recipe_from_dict(raw), home=home, log=quiet, workers=1)
    skipped = sorted(str(w.message).split(": skipped")[0].rsplit("/", 1)[-1] for w in warned if ": skipped" in str(w.message))
    assert skipped == ["bomb.txt.gz", "huge.txt", "pkg-1.0.tar.gz:big.py", "pkg-1.0.tar.gz:bomb.py.gz",
                       "shard1.jsonl.zst:2"], skipped
    src = {s["id"]: s for s in corpus.manifest["sources"]}
    assert {k: src[k]["oversized"] for k in src} == {"prose-files": 2, "pajama": 1, "sdist": 2}
    assert src["prose-files"]["documents_read"] == 40 and src["sdist"]["documents_read"] == 2
    assert src["pajama"]["documents_read"] == 40 + 2  # shard0's mapped records and shard1's two short ones
    FIGURES.add("data: oversized archive members, files and jsonl lines", faults=5,
                note=f"caps {cap:,} bytes; each skipped with a warning naming the file (and member), counted as "
                     "oversized in the manifest; the build finished")


def test_a_tampered_shard_fails_verify_naming_it_and_a_truncated_one_is_refused_on_open(build_ref, tmp_path, capsys):
    from basecap.cli import main
    from basecap.config_base import ConfigError
    from basecap.data import load_corpus

    _, _, corpus, _, _ = build_ref
    shard = corpus.manifest["domains"]["prose"]["splits"]["train"]["file"]
    tampered = tmp_path / "tampered" / corpus.dir.name
    shutil.copytree(corpus.dir, tampered)
    flipped = bytearray((tampered / shard).read_bytes())
    flipped[len(flipped) // 3] ^= 0x10
    (tampered / shard).write_bytes(bytes(flipped))
    load_corpus(tampered)  # the size still matches: opening checks sizes, verify checks hashes
    capsys.readouterr()
    assert main(["data", "verify", str(tampered)]) == 2
    err = capsys.readouterr().err
    assert f"{Path(shard).name}: SHA-256" in err, err

    truncated = tmp_path / "truncated" / corpus.dir.name
    shutil.copytree(corpus.dir, truncated)
    size = (truncated / shard).stat().st_size
    os.truncate(truncated / shard, size - 2)
    with pytest.raises(ConfigError, match=rf"{re.escape(str(truncated / shard))}: token shard of prose/train is {size - 2} bytes, "
                                          rf"the manifest records {size} bytes.*basecap data verify"):
        load_corpus(truncated)
    FIGURES.add("data: tampered and truncated token shards", faults=2,
                note="verify exits 2 naming the shard; opening the truncated corpus fails naming it")
