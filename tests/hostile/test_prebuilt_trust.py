"""A prebuilt extension is imported exactly as checked (issue 32, S1 and item 4): opened once, checked through that
descriptor (a trusted path, a recorded sha256, a whole ELF shared library), imported through the same descriptor;
a record that matches an empty, foreign or cut-short library is a LoadError naming the file, never a raw
ImportError or a SIGBUS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flyship.errors import LoadError
from flyship.loader import extension, prebuilt

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
NAME = "flyship_race_test_0123456789ab"
GOOD = "int flyship_good(void) { return 1; }\n"
PLANT = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *p = getenv("PLANTED_MARK");
    FILE *f = p ? fopen(p, "a") : NULL;
    if (f) { fputs("ran\n", f); fclose(f); }
}
"""


def _cc(tmp: Path, source: str, out: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to make the test libraries with")
    src = tmp / (out.name + ".c")
    src.write_text(source)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """dir_a: a recorded library; dir_b: a planted one with dir_a's record (its bytes differ from the record)."""
    d = tmp_path_factory.mktemp("race")
    os.chmod(d, 0o755)
    a, b = d / "a", d / "b"
    a.mkdir(mode=0o755)
    b.mkdir(mode=0o755)
    _cc(d, GOOD, a / f"{NAME}.so")
    prebuilt.write_record(a / f"{NAME}.so", NAME)
    _cc(d, PLANT, b / f"{NAME}.so")
    shutil.copy(prebuilt.record_path(a / f"{NAME}.so"), prebuilt.record_path(b / f"{NAME}.so"))
    return d


RACE = r"""
import os, sys
from pathlib import Path
from flyship.errors import LoadError
from flyship.loader import extension
name, links = sys.argv[1], [Path(p) for p in sys.argv[2:]]
counts = {"imported": 0, "refused": 0}
for link in links:  # each path once per process: the dynamic loader knows a library by the name it was opened by
    found = extension.find_prebuilt(name, near=link)  # the loader's own steps: find (checked by path) ...
    if found is None:
        counts["refused"] += 1
        continue
    try:
        extension._import(name, found)  # ... then import
    except (LoadError, ImportError) as e:  # the good library is no Python module: refused after dlopen (no PyInit_),
        counts["refused" if "refused" in str(e) else "imported"] += 1  # or the planted bytes refused before it
print(counts["imported"], counts["refused"])
"""

FLIP = r"""
import os, sys, time
a, b, end = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
links = sys.argv[4:]
i = 0
while time.monotonic() < end:
    link = links[i % len(links)]
    tmp = link + ".new"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(a if (i // len(links)) % 2 else b, tmp)
    os.replace(tmp, link)  # atomic: the link always names one folder or the other
    i += 1
"""
LINKS = 50  # links flipped round-robin; a process loads through each once


def race(libs: Path, tmp_path: Path, loads: int) -> tuple[int, int, int]:
    """``loads`` loads through links that another process flips between the recorded and the planted folder as
    fast as it can; returns (imported, refused, planted runs)."""
    mark = tmp_path / "mark"
    links = [tmp_path / f"ext{i}" for i in range(LINKS)]
    for link in links:
        os.symlink(libs / "a", link)
    env = {k: v for k, v in os.environ.items() if k != "FLYSHIP_EXTENSION_PATH"}
    env["PLANTED_MARK"] = str(mark)
    flipper = subprocess.Popen([sys.executable, "-c", FLIP, str(libs / "a"), str(libs / "b"), "600",
                                *map(str, links)])
    imported = refused = 0
    try:
        while imported + refused < loads:
            batch = links[: loads - imported - refused]
            r = subprocess.run([sys.executable, "-c", RACE, NAME, *map(str, batch)], cwd=ROOT, capture_output=True,
                               text=True, env=env, timeout=300)
            assert r.returncode == 0, r.stderr[-2000:]
            i, f = map(int, r.stdout.split())
            imported, refused = imported + i, refused + f
    finally:
        flipper.kill()
        flipper.wait()
    runs = len(mark.read_text().splitlines()) if mark.exists() else 0
    return imported, refused, runs


def test_flipping_a_link_between_check_and_import_never_runs_planted_code(libs, tmp_path):
    t = time.monotonic()
    imported, refused, runs = race(libs, tmp_path, int(os.environ.get("FLYSHIP_TEST_RACE_LOADS", "1000")))
    seconds = time.monotonic() - t
    assert runs == 0, f"planted code ran {runs} times in {imported + refused} loads"
    assert imported > 0 and refused > 0, (imported, refused)  # the race really flipped under the loads
    print(f"\n  race: {imported + refused} loads ({imported} of the recorded library, {refused} refused) in "
          f"{seconds:.1f} s, planted code ran 0 times")


def test_a_path_through_a_link_owned_by_another_user_is_refused(libs, tmp_path):
    if os.getuid() != 0:
        pytest.skip("giving a link to another user needs root (lchown)")
    link = tmp_path / "ext"
    os.symlink(libs / "a", link)
    os.lchown(link, 4242, 4242)  # (as a link another user made in a folder of ours, a sticky one)
    assert "the link" in prebuilt.refusal_of_path(link / f"{NAME}.so") and "owned by uid 4242" in \
        prebuilt.refusal_of_path(link / f"{NAME}.so")
    with pytest.raises(LoadError, match=r"refused: the link .* is owned by uid 4242"):
        extension._import(NAME, link / f"{NAME}.so")


def test_a_path_through_a_folder_others_can_write_is_refused_and_a_sticky_one_is_not(libs, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shutil.copytree(libs / "a", shared / "a")
    os.chmod(shared, 0o777)
    assert "writable by group or others (mode 777)" in prebuilt.refusal_of_path(shared / "a" / f"{NAME}.so")
    os.chmod(shared, 0o1777)  # sticky, as /tmp: others cannot rename or remove our folder in it
    assert prebuilt.refusal_of_path(shared / "a" / f"{NAME}.so") is None


def _recorded(tmp_path: Path, data: bytes) -> Path:
    d = tmp_path / "rec"
    d.mkdir(mode=0o755)
    lib = d / f"{NAME}.so"
    lib.write_bytes(data)
    prebuilt.write_record(lib, NAME)  # the record matches the bad bytes: only the ELF check can tell
    return lib


IMPORT = """
import sys
from pathlib import Path
from flyship.errors import LoadError
from flyship.loader import extension
try:
    extension._import(sys.argv[1], Path(sys.argv[2]))
except LoadError as e:
    print("LoadError:", e)
"""


@pytest.mark.parametrize("make, words", [
    (lambda good: b"", "has 0 bytes, too few for an ELF shared library"),
    (lambda good: good[: len(good) // 2], "the file is cut short"),
    (lambda good: good[:2000], "the file is cut short"),
    (lambda good: b"#!/bin/sh\n" + b"x" * 100, "it is not an ELF file"),
    (lambda good: good, "does not define module export function"),  # a library of another flavor / no module
], ids=["empty", "truncated-half", "truncated-headers", "not-elf", "wrong-flavor"])
def test_a_record_that_matches_a_bad_library_is_a_load_error_not_a_crash(libs, tmp_path, make, words):
    lib = _recorded(tmp_path, make((libs / "a" / f"{NAME}.so").read_bytes()))
    r = subprocess.run([sys.executable, "-c", IMPORT, NAME, str(lib)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"exit {r.returncode} (SIGBUS is -7)\n{r.stderr[-2000:]}"
    assert r.stdout.startswith("LoadError: import flyship extension") and str(lib) in r.stdout, r.stdout + r.stderr
    assert words in r.stdout, r.stdout
