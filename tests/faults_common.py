"""Fault injection, shared machinery: the figures the faults modules gather, and forked processes that kill themselves.

The tests (``tests/test_faults_train.py``: training runs and their checkpoints; ``tests/test_faults_data.py``: corpus
builds and their inputs) inject real faults: a forked copy of the test process (modules, corpus and model code
already loaded, so no interpreter start) SIGKILLs itself from inside the code it interrupts, at seeded random steps;
a file-size limit makes a checkpoint write fail; bytes are torn, flipped, cut or planted on disk. Outcomes are
compared with an uninterrupted run: the per-step losses, evaluations and final weights exactly, a corpus file by
file (SHA-256).

Each faults module ends by printing the figures gathered so far in the session (faults injected, resumed runs and
builds equal to the uninterrupted ones, bytes lost), so the last one printed covers every faults module run; run
them with ``-s`` to see them. ``BASECAP_FAULTS_JSON`` names a file to write them to as JSON (rewritten at the end
of each module, ending with all of them), ``BASECAP_FAULTS_SEED`` picks other kill points (default 0).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import pytest

SEED = int(os.environ.get("BASECAP_FAULTS_SEED", "0"))


def quiet(*_):
    pass


# ---- the figures ---------------------------------------------------------------------------------
class Figures:
    """Per case: faults injected, resumes compared with the uninterrupted run, resumes equal to it, bytes lost."""

    def __init__(self):
        self.cases: dict[str, Counter] = {}
        self.notes: dict[str, str] = {}

    def add(self, case: str, note: str = "", **counts: int):
        self.cases.setdefault(case, Counter()).update(counts)
        if note:
            self.notes[case] = note

    def totals(self) -> Counter:
        out = Counter()
        for c in self.cases.values():
            out.update(c)
        return out

    def as_json(self) -> dict:
        t = self.totals()
        return {"seed": SEED, "faults_injected": t["faults"], "resumes": t["resumes"], "resumed_exactly": t["exact"],
                "bytes_lost": t["bytes_lost"], "bytes_recomputed": t["bytes_recomputed"],
                "cases": {k: {**dict(v), "note": self.notes.get(k, "")} for k, v in self.cases.items()}}

    def summary(self) -> str:
        j = self.as_json()
        lines = [(f"fault injection (seed {SEED}): {j['faults_injected']} faults injected; {j['resumed_exactly']} of "
                  f"{j['resumes']} resumed runs and builds equal to the uninterrupted ones; {j['bytes_lost']} bytes lost "
                  f"({j['bytes_recomputed']} bytes past the last commit point recomputed on resume)")]
        for name, c in j["cases"].items():
            resumed = f", {c['exact']}/{c['resumes']} resumed exactly" if c.get("resumes") else ""
            lost = f", {c['bytes_lost']} bytes lost" if c.get("resumes") else ""
            lines.append(f"  {name}: {c.get('faults', 0)} faults{resumed}{lost}" + (f"; {c['note']}" if c["note"] else ""))
        return "\n".join(lines)


FIGURES = Figures()


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    if not FIGURES.cases:
        return
    print("\n" + FIGURES.summary())
    if os.environ.get("BASECAP_FAULTS_JSON"):
        Path(os.environ["BASECAP_FAULTS_JSON"]).write_text(json.dumps(FIGURES.as_json(), indent=1))


# ---- processes -----------------------------------------------------------------------------------
def die():
    """kill -9 of this process, from inside the code it interrupts."""
    os.kill(os.getpid(), signal.SIGKILL)


def fork(fn) -> int:
    """Run ``fn`` in a forked copy of this process; returns its PID. The child never returns into pytest: it exits
    0 when ``fn`` returns, with SystemExit's code, or 70 after printing any other exception."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        warnings.simplefilter("ignore")
        fn()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 70
    except BaseException:  # noqa: BLE001 - anything, printed, then the child's own exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def reap(pid: int, timeout: float = 120.0) -> int:
    """Wait for a child: its exit code, or minus the signal that ended it."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"child process did not finish within {timeout} s")
        time.sleep(0.01)


def in_child(fn, timeout: float = 120.0) -> int:
    return reap(fork(fn), timeout)


def lock_is_free(path: Path) -> bool:
    """Whether another process could take the flock on ``path`` now (taken and released at once)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing releases a lock taken above
    return True
