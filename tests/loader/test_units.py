"""The extension core's grouping into translation units (loader/units.py): every unit compiled exactly once, groups
balanced and stable, one group on a machine of few cores, and FLYSHIP_BUILD_UNITS read as a checked count."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flyship import env
from flyship.errors import ConfigError
from flyship.loader import extension, units

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
CORE = [str(extension.CSRC / s) for s in extension.CORE_SOURCES]


@pytest.mark.parametrize("cores, groups", [(1, 1), (2, 2), (7, 2), (8, 2), (16, 4), (128, None)])
def test_the_default_grouping_is_bridge_and_plain_apart_on_few_cores_and_never_more_groups_than_units(cores, groups):
    got = units.default_groups(len(CORE), cores)
    assert got == (groups if groups is not None else len(CORE))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=12), groups=st.integers(1, 15))
def test_each_source_lands_in_exactly_one_group_in_source_order(tmp_path_factory, sizes, groups):
    d = tmp_path_factory.mktemp("src")
    sources = []
    for i, n in enumerate(sizes):
        f = d / f"u{i}.cpp"
        f.write_bytes(b"x" * n)
        sources.append(str(f))
    parts = units.group(sources, groups)
    assert len(parts) == min(groups, len(sources))
    assert sorted(s for p in parts for s in p) == sorted(sources)
    for p in parts:
        assert p == sorted(p, key=sources.index)
    weights = [sum(Path(s).stat().st_size for s in p) for p in parts]
    assert max(weights) - min(weights) <= max(sizes)  # greedy largest-first: within one unit of balanced
    assert units.group(sources, groups) == parts


def test_written_units_include_every_core_unit_once_and_an_unchanged_build_keeps_their_mtimes(tmp_path):
    files = units.write_units(CORE, 3, tmp_path)
    assert [Path(f).name for f in files] == ["flyship_core_0.cpp", "flyship_core_1.cpp", "flyship_core_2.cpp"]
    included = [line.split('"')[1] for f in files for line in Path(f).read_text().splitlines()
                if line.startswith("#include")]
    assert sorted(included) == sorted(CORE)
    mtimes = [Path(f).stat().st_mtime_ns for f in files]
    assert units.write_units(CORE, 3, tmp_path) == files
    assert [Path(f).stat().st_mtime_ns for f in files] == mtimes
    (one,) = units.write_units(CORE, 1, tmp_path)
    assert Path(one).name == "flyship_core.cpp"


@pytest.mark.parametrize("value, expected", [("", None), ("3", 3), (" 1 ", 1)])
def test_flyship_build_units_reads_a_count(monkeypatch, value, expected):
    monkeypatch.setenv("FLYSHIP_BUILD_UNITS", value)
    assert env.build_units() == expected


@pytest.mark.parametrize("value", ["0", "-2", "x", "1.5", "99999", "٣"])
def test_flyship_build_units_refuses_what_is_not_a_count_naming_the_switch(monkeypatch, value):
    monkeypatch.setenv("FLYSHIP_BUILD_UNITS", value)
    with pytest.raises(ConfigError, match="FLYSHIP_BUILD_UNITS: expected a whole number from 1"):
        env.build_units()


def test_the_extension_name_does_not_depend_on_the_grouping(monkeypatch):
    try:
        extension.config("record")
    except Exception as e:  # noqa: BLE001 (what the machine lacks is the skip's reason)
        pytest.skip(f"the extension cannot be configured here ({e}); this would prove its name ignores the grouping")
    names = set()
    for n in ("1", "5"):
        monkeypatch.setenv("FLYSHIP_BUILD_UNITS", n)
        names.add(extension.config("record").name)
    assert len(names) == 1


def _torch_includes(name: str, seen: set[str] | None = None) -> set[str]:
    """The ``<torch/...>`` headers a csrc file includes, directly or through csrc's own headers."""
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    found = set()
    for line in (extension.CSRC / name).read_text().splitlines():
        if line.startswith("#include <torch/"):
            found.add(line.split("<")[1].rstrip(">"))
        elif line.startswith('#include "'):
            found |= _torch_includes(line.split('"')[1], seen)
    return found


@pytest.mark.parametrize("name", extension.CORE_SOURCES)
def test_only_the_bridge_units_include_torchs_python_bridge(name):
    assert set(units.BRIDGE) <= set(extension.CORE_SOURCES)
    torch_headers = _torch_includes(name)
    if name in units.BRIDGE:
        assert torch_headers, f"{name} is in units.BRIDGE but includes no torch/ header: move it to the plain units"
    else:
        assert not torch_headers, f"{name} includes {sorted(torch_headers)}: add it to units.BRIDGE or narrow it"


@pytest.mark.parametrize("groups", [2, 3, 4, 13])
def test_from_two_groups_up_no_group_mixes_bridge_and_plain_units(groups):
    parts = units.split(CORE, groups)
    assert sorted(s for p in parts for s in p) == sorted(CORE)
    assert len(parts) == min(groups, len(CORE))
    for p in parts:
        assert len({Path(s).name in units.BRIDGE for s in p}) == 1, p


def test_one_group_holds_every_unit():
    assert units.split(CORE, 1) == [CORE]


def test_a_core_split_into_groups_loads_and_runs_a_bundle(tmp_path, tiny_bundle):
    """Split into groups, the plain units form a translation unit without the bridge's headers: each type they
    convert through pybind11 must have its caster there too (a missing pybind11/stl.h once built, then refused
    every plan's list of ints at load on the 16-core GPU machine, while the one-unit build of 2 cores was right)."""
    code = textwrap.dedent(f"""
        import torch, flyship
        from flyship.loader import extension, units
        written, write = [], units.write_units
        units.write_units = lambda *a: written.append(write(*a)) or written[-1]
        ext = extension.extension("record")
        ext.set_recorded_device(0, "gfx942:sramecc+:xnack-")
        ops = flyship.load({str(tiny_bundle)!r})
        x, y = torch.randn(100), torch.randn(100)
        s, d = torch.empty(100), torch.empty(100)
        ops.addsub.out(x, y, sum=s, diff=d)
        print(len(written[0]), len(ext.recorded_launches(clear=True)))
    """)
    env = dict(os.environ, FLYSHIP_EXTENSIONS_DIR=str(tmp_path), FLYSHIP_BUILD_UNITS="2", FLYSHIP_FLAVOR="record")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-2:] == ["2", "1"], r.stdout  # two translation units built; the op launched once
