"""Every test runs somewhere (issue 31): the whole suite is collected once per tier of the Makefile, with the tier's
marker expression, in the tier's Python, and each test must carry exactly one tier marker and be selected by a tier
whose Python can import it. A test no tier selects (an unmarked Triton-only test: the compile tier deselects it, the
workload Python has no Triton) or a file that skips at collection in every tier's Python is a claim nobody checks.

The tiers are read from the Makefile (``TIER_*`` expressions and the ``make test`` / ``make test-matrix`` recipes
that run them), the one statement of them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import ROOT, flydsl_python

pytestmark = pytest.mark.cpu

TIER_MARKERS = ("cpu", "compile", "gpu", "hip", "hipnv", "matrix")  # pytest.ini; `ray` only narrows a tier
# The Makefile's Pythons, as these tests find them (the Makefile exports FLYSHIP_TEST_FLYDSL_PY; this test runs
# in the workload tier, so its own Python is WORKLOAD_PY).
PYTHONS = {"FLYDSL_PY": flydsl_python, "WORKLOAD_PY": lambda: os.environ.get("FLYSHIP_TEST_WORKLOAD_PY", sys.executable)}


@dataclass(frozen=True)
class Tier:
    name: str  # the Makefile variable, e.g. TIER_COMPILE
    python: str  # FLYDSL_PY / WORKLOAD_PY
    expression: str  # the pytest -m expression
    path: str  # what the recipe collects, e.g. tests or tests/matrix


def makefile_tiers(text: str) -> list[Tier]:
    """The tiers the ``test`` and ``test-matrix`` recipes run: ``$(PY) -m pytest -m "$(TIER_X)" PATH`` lines, with
    each ``TIER_X := expression`` resolved."""
    exprs = dict(re.findall(r"^(TIER_\w+)\s*:=\s*(.+?)\s*$", text, re.M))
    recipes = re.findall(r"^(test|test-matrix):.*\n((?:\t.*\n)+)", text, re.M)
    tiers = []
    for _target, body in recipes:
        for py, var, path in re.findall(r"\$\((\w+_PY)\) -m pytest -m \"\$\((TIER_\w+)\)\" (\S+)", body):
            if var not in exprs:
                raise AssertionError(f"Makefile: the test recipe runs $({var}), which is not defined as TIER_X := ...")
            tiers.append(Tier(var, py, exprs[var], path))
    return tiers


def collect(tier: Tier, python: str, root: Path, dump: Path) -> subprocess.Popen:
    """Start ``pytest --collect-only`` of ``tier`` over ``root`` in ``python``; tier_collect.py writes ``dump``."""
    env = dict(os.environ, FLYSHIP_TIER_DUMP=str(dump),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    cmd = [python, "-m", "pytest", "--collect-only", "-q", "-p", "tier_collect", "-p", "no:cacheprovider",
           "-c", str(ROOT / "pytest.ini"), "--rootdir", str(root), "-m", tier.expression, tier.path]
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_tiers(tiers: list[Tier], root: Path, scratch: Path) -> dict[str, dict]:
    """Each tier's collection over ``root``: {tier name: {"selected", "deselected", "skipped"}} (run side by side)."""
    started = {}
    for t in tiers:
        python = PYTHONS[t.python]()
        if python is None:
            pytest.skip(f"needs the Python of {t.python} (make install creates it) to collect the {t.name} tier")
        started[t.name] = (collect(t, python, root, scratch / f"{t.name}.json"), scratch / f"{t.name}.json")
    out = {}
    for name, (proc, dump) in started.items():
        log, _ = proc.communicate(timeout=600)
        if proc.returncode not in (0, 5) or not dump.exists():  # 5: nothing selected (a tiny planted tree)
            raise AssertionError(f"collecting the {name} tier failed (exit {proc.returncode}):\n{log[-3000:]}")
        out[name] = json.loads(dump.read_text())
    return out


def problems(tiers: list[Tier], runs: dict[str, dict]) -> list[str]:
    """What is wrong with the suite's tiers: a test without exactly one tier marker, a test that no tier selects in a
    Python that imports it, a file that skips at collection wherever it is collected."""
    markers: dict[str, list[str]] = {}
    selected_by: dict[str, list[str]] = {}
    for t in tiers:
        for node, marks in {**runs[t.name]["deselected"], **runs[t.name]["selected"]}.items():
            markers[node] = marks
            selected_by.setdefault(node, [])
        for node in runs[t.name]["selected"]:
            selected_by[node].append(t.name)
    found = []
    for node, marks in sorted(markers.items()):
        tier_marks = [m for m in marks if m in TIER_MARKERS]
        if len(tier_marks) != 1:
            found.append(f"{node}: expected exactly one tier marker of {', '.join(TIER_MARKERS)}, got "
                         f"{tier_marks or 'none'}; mark it (pytestmark = pytest.mark.<tier>)")
        if not selected_by[node]:
            found.append(f"{node} (markers {marks or 'none'}) is selected by no tier of the Makefile in a Python that "
                         "imports it; give it the tier whose Python has what it needs")
    found += mixed_files(markers)
    files = {n.split("::")[0] for n in markers}
    skipped: dict[str, list[str]] = {}
    for t in tiers:
        for node, why in runs[t.name]["skipped"].items():
            skipped.setdefault(node, []).append(f"{t.name}: {why}")
    for node, whys in sorted(skipped.items()):
        if node not in files:  # skipped wherever it was collected: its tests are not even listed
            found.append(f"{node} skips at collection in every tier's Python ({'; '.join(whys)}); move it to the "
                         "tier whose Python has the module")
    return found


def mixed_files(markers: dict[str, list[str]]) -> list[str]:
    """A file whose tests do not all carry the same tier markers: a file belongs to one tier, so that its imports,
    fixtures and helpers serve one Python (one ``pytestmark = pytest.mark.<tier>`` at module level)."""
    tiers_of: dict[str, dict[tuple[str, ...], int]] = {}
    for node, marks in markers.items():
        key = tuple(m for m in marks if m in TIER_MARKERS)
        counts = tiers_of.setdefault(node.split("::")[0], {})
        counts[key] = counts.get(key, 0) + 1
    said = {file: ", ".join(f"{n} marked {list(k) if k else 'none'}" for k, n in sorted(counts.items()))
            for file, counts in tiers_of.items()}
    return [f"{file}: expected every test of the file to carry the same tier marker, got {said[file]}; split the "
            "file by tier (the minority's tests into a file of their own, shared helpers into a module both "
            "import), one pytestmark = pytest.mark.<tier> per file"
            for file, counts in sorted(tiers_of.items()) if len(counts) > 1]


def test_the_makefile_names_its_tiers_and_the_pythons_that_run_them():
    tiers = makefile_tiers((ROOT / "Makefile").read_text())
    assert {(t.name, t.python, t.path) for t in tiers} == {
        ("TIER_COMPILE", "FLYDSL_PY", "tests"), ("TIER_WORKLOAD", "WORKLOAD_PY", "tests"),
        ("TIER_MATRIX", "WORKLOAD_PY", "tests/matrix")}
    assert all(t.expression for t in tiers)


def test_every_test_of_the_suite_is_run_by_one_tier_of_the_makefile(tmp_path):
    tiers = makefile_tiers((ROOT / "Makefile").read_text())
    runs = run_tiers(tiers, ROOT, tmp_path)
    found = problems(tiers, runs)
    counts = {t.name: len(runs[t.name]["selected"]) for t in tiers}
    print("tests selected per tier:", counts)
    assert not found, f"{len(found)} problems with the test tiers (counts {counts}):\n" + "\n".join(found[:40])
    assert counts["TIER_COMPILE"] > 0 and counts["TIER_WORKLOAD"] > 0


PLANTED = """
import pytest

{mark}
triton = pytest.importorskip("triton")


def test_triton_compiles_something():
    assert triton.__version__
"""


def test_an_unmarked_triton_only_test_is_caught_and_a_compile_marked_one_passes(tmp_path):
    tree = tmp_path / "tree"
    (tree / "tests" / "compiler").mkdir(parents=True)
    (tree / "tests" / "matrix").mkdir()  # every tier's path exists (the matrix tier's holds nothing here)
    for name, mark in (("unmarked", ""), ("marked", "pytestmark = pytest.mark.compile")):
        (tree / "tests" / "compiler" / f"test_{name}.py").write_text(textwrap.dedent(PLANTED.format(mark=mark)))
    tiers = makefile_tiers((ROOT / "Makefile").read_text())
    found = problems(tiers, run_tiers(tiers, tree, tmp_path))
    text = "\n".join(found)
    assert "tests/compiler/test_unmarked.py::test_triton_compiles_something (markers none) is selected by no tier" in text
    assert "tests/compiler/test_unmarked.py::test_triton_compiles_something: expected exactly one tier marker" in text
    assert len(found) == 2 and "test_marked.py" not in text, found  # the compile-marked copy runs in the compile tier


MIXED = """
import pytest


@pytest.mark.cpu
def test_a_cpu_check():
    assert 1 + 1 == 2


@pytest.mark.compile
def test_a_build_check():
    assert 2 * 2 == 4
"""
ONE_TIER = MIXED.replace("@pytest.mark.cpu\n", "").replace("@pytest.mark.compile\n", "").replace(
    "import pytest\n", "import pytest\n\npytestmark = pytest.mark.cpu\n")


def test_a_file_whose_tests_carry_different_tiers_is_caught_and_a_file_of_one_tier_passes(tmp_path):
    tree = tmp_path / "tree"
    (tree / "tests" / "compiler").mkdir(parents=True)
    (tree / "tests" / "matrix").mkdir()
    (tree / "tests" / "compiler" / "test_mixed.py").write_text(MIXED)
    (tree / "tests" / "compiler" / "test_one_tier.py").write_text(ONE_TIER)
    tiers = makefile_tiers((ROOT / "Makefile").read_text())
    found = problems(tiers, run_tiers(tiers, tree, tmp_path))
    assert found == [
        "tests/compiler/test_mixed.py: expected every test of the file to carry the same tier marker, got 1 marked "
        "['compile'], 1 marked ['cpu']; split the file by tier (the minority's tests into a file of their own, "
        "shared helpers into a module both import), one pytestmark = pytest.mark.<tier> per file"], found


def test_a_file_skipped_at_collection_in_every_tier_is_caught():
    tiers = [Tier("TIER_A", "WORKLOAD_PY", "a", "tests"), Tier("TIER_B", "FLYDSL_PY", "b", "tests")]
    runs = {"TIER_A": {"selected": {}, "deselected": {}, "skipped": {"tests/test_x.py": "no module named nowhere"}},
            "TIER_B": {"selected": {}, "deselected": {}, "skipped": {"tests/test_x.py": "no module named nowhere"}}}
    assert problems(tiers, runs) == [
        "tests/test_x.py skips at collection in every tier's Python (TIER_A: no module named nowhere; TIER_B: no "
        "module named nowhere); move it to the tier whose Python has the module"]
    runs["TIER_B"] = {"selected": {"tests/test_x.py::test_y": ["compile"]}, "deselected": {}, "skipped": {}}
    assert problems(tiers, runs) == []
