"""bench/build_overhead.py's ``--marginal`` arm builds the FlyDSL examples declared several times over: its spec file
must declare each example kernel that many times, under names of its own, and nothing else."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from flyship.compiler import pipeline as B

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parents[2]


def test_the_marginal_arms_spec_declares_every_example_kernel_copies_times(tmp_path):
    spec = importlib.util.spec_from_file_location("build_overhead", ROOT / "bench" / "build_overhead.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    targets = B.check_archs(("gfx942",))
    base = B.read_declarations(str(bench.SPEC), targets)
    copies = B.read_declarations(str(bench.copies_spec(tmp_path / "examples", 3)), targets)
    want = {(o.name, f"{s.name}_{k}") for o in base.ops for s in o.specs for k in range(3)}
    got = {(o.name, s.name) for o in copies.ops for s in o.specs}
    assert got == want and len(B.plan(copies, targets)) == 3 * len(B.plan(base, targets))
    assert B.read_declarations(str(bench.SPEC), targets).ops[0].specs == base.ops[0].specs  # no copies after it
    # each copy keeps its example's constraints and adds one of its own, so that no copy hides another
    for o in copies.ops:
        orig = {s.name: set(s.constraints) for s in next(b for b in base.ops if b.name == o.name).specs}
        added = [set(s.constraints) - orig[s.name.rsplit("_", 1)[0]] for s in o.specs]
        assert all(len(a) == 1 and orig[s.name.rsplit("_", 1)[0]] <= set(s.constraints)
                   for a, s in zip(added, o.specs))
        assert len({c for a in added for c in a}) == len(o.specs) // len(orig)
