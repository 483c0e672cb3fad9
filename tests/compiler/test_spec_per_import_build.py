"""A spec file that declares other things per target at import (a constexpr a kernel module fixes from the arch,
an op declared for gfx950 only): each target's tasks follow that target's own import, so the bundle is the same
whatever the order of ``--arch`` (examples/flydsl/archspec.py)."""

from __future__ import annotations

import pytest

from flyship.bundle import manifest as M

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile

SPEC_FILE = ROOT / "examples" / "flydsl" / "archspec.py"


def _built(out) -> dict[tuple[str, str], tuple[list[str], tuple[int, int, int]]]:
    m = M.read(out)
    return {(o.name, s.name): ([v.target for v in s.variants], s.example.grid)
            for o in m.ops for s in o.specializations}


def test_a_spec_that_declares_other_things_per_target_builds_the_same_bundle_in_either_arch_order(tmp_path):
    run_build(SPEC_FILE, tmp_path / "a", ["gfx942", "gfx950"], "-j", "2")
    run_build(SPEC_FILE, tmp_path / "b", ["gfx950", "gfx942"], "-j", "2")
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    assert _built(tmp_path / "a") == {
        # TILE_N fixed at import: 256 on gfx942 (4 tiles of a 1000-column row), 128 on gfx950 (8 tiles).
        ("scale_tiled", "f32__gfx942"): (["gfx942"], (400, 1, 1)),
        ("scale_tiled", "f32__gfx950"): (["gfx950"], (800, 1, 1)),
        ("scale_wide", "f32"): (["gfx950"], (200, 1, 1)),  # declared only by gfx950's import
    }

