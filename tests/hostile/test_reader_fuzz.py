"""The reader fuzz (issue 22): >= 10,000 mutated inputs per JSON reader, >= 5,000 zip-level mutations of a pack
(issue 32), no escape.

Readers: the manifest (:func:`flyship.bundle.manifest.parse`), tuning tables (:func:`flyship.bundle.tuning.read`),
the hook's patches file (:func:`flyship.loader.tools.hook.read_patches`) and the pack index
(:func:`flyship.bundle.pack.open_pack`). Cases come from structured mutation of a valid input
(tests/hostile/mutate.py) and run in fresh processes (tests/hostile/fuzz_child.py), a batch of many cases per
process, each process under a memory limit (RLIMIT_AS) and each case under a time limit; two processes at a time.
A process that dies mid-case counts that case a crash, one killed at the batch limit a hang, and the next process
starts after it. Per reader the tallies are printed: tried / clean refusal / correct acceptance / raw exception /
crash / hang / silent wrong (and wrongly refused: a re-serialized valid input refused), and any escape fails.

``FLYSHIP_FUZZ_CASES`` (default 10000) and ``FLYSHIP_FUZZ_SEED`` (default 22) change the run.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
READERS = ("manifest", "pack", "tuning", "patches", "zip")
CASES = int(os.environ.get("FLYSHIP_FUZZ_CASES", "10000"))
# The zip-level mutator (tests/hostile/zipmutate.py, issue 32): the pack reader under damage to the zip around the
# index; 5,000 cases by default (about 2 s: most cases are refused from the central directory alone).
ZIP_CASES = int(os.environ.get("FLYSHIP_FUZZ_ZIP_CASES", "5000"))
SEED = os.environ.get("FLYSHIP_FUZZ_SEED", "22")
BATCH = 2500
MEMORY_MB = 1024  # the child's address space: a reader that tries to hold a gigabyte fails there, not here
CASE_SECONDS = 5.0
BATCH_SECONDS = 240
ESCAPES = ("raw", "crash", "hang", "wrong", "wrongly-refused")
COLUMNS = ("tried", "refused", "accepted", *ESCAPES)


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYSHIP_")}  # no trusted keys, no cache
    env["PYTHONHASHSEED"] = "0"
    return env


def run_batch(reader: str, start: int, count: int, tally: collections.Counter, escapes: list[str]) -> None:
    """Run cases ``start .. start+count-1`` of ``reader``, restarting after a case that crashes or hangs."""
    end = start + count
    while start < end:
        cmd = [sys.executable, "-m", "tests.hostile.fuzz_child", reader, SEED, str(start), str(end - start),
               str(MEMORY_MB), str(CASE_SECONDS)]
        try:
            r = subprocess.run(cmd, cwd=ROOT, env=_child_env(), capture_output=True, text=True, timeout=BATCH_SECONDS)
            out, err, died = r.stdout, r.stderr, r.returncode != 0
        except subprocess.TimeoutExpired as e:  # (subprocess.run kills the child)
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err, died = "", None
        done = start
        for line in out.splitlines():
            i, kind, outcome, detail = (line.split("\t", 3) + [""])[:4]
            tally["tried"] += 1
            tally[outcome] += 1
            if outcome in ESCAPES:
                escapes.append(f"{reader} case {i} ({kind}): {outcome}: {detail}")
            done = int(i) + 1
        if done >= end:
            if died:
                raise AssertionError(f"the {reader} fuzz child failed after its last case:\n{err[-3000:]}")
            return
        if done == start and died and "Traceback" in err and "fuzz_child" in err and not out:
            raise AssertionError(f"the {reader} fuzz child failed before its first case:\n{err[-3000:]}")
        tally["tried"] += 1
        tally["hang" if died is None else "crash"] += 1
        escapes.append(f"{reader} case {done}: {'hang' if died is None else 'crash'} "
                       f"(the process {'ran past ' + str(BATCH_SECONDS) + ' s' if died is None else 'died'}: "
                       f"{err[-300:]})")
        start = done + 1


def cases(reader: str) -> int:
    return ZIP_CASES if reader == "zip" else CASES


def fuzz(reader: str) -> tuple[collections.Counter, list[str]]:
    tally: collections.Counter = collections.Counter()
    escapes: list[str] = []
    n = cases(reader)
    for start in range(0, n, BATCH):
        run_batch(reader, start, min(BATCH, n - start), tally, escapes)
    return tally, escapes


@pytest.fixture(scope="module")
def results() -> dict[str, tuple[collections.Counter, list[str]]]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # two cores: two children at a time
        return dict(zip(READERS, pool.map(fuzz, READERS)))


def test_the_tallies_are_printed(results, capsys):
    lines = ["reader fuzz (seed %s): " % SEED + " / ".join(COLUMNS)]
    for reader, (tally, _) in results.items():
        lines.append(f"  {reader:9s} " + " / ".join(str(tally[c]) for c in COLUMNS))
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_or_reads_right_every_mutated_input(results, reader):
    tally, escapes = results[reader]
    assert not escapes, f"{len(escapes)} escapes:\n" + "\n".join(escapes[:20])
    n = cases(reader)
    assert tally["tried"] >= n
    # the fuzz reaches both sides: valid inputs are read and invalid ones refused
    assert tally["accepted"] > n // 20 and tally["refused"] > n // 2, dict(tally)
