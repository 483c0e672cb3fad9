"""Issue 9, pattern 9: a clean DSL state per variant. A task that fails in a reused worker is retried once
in a fresh process before it counts as failed, so ``-j 1`` and ``-j 2`` build the same bundle; a task
that fails in a fresh process too is reported with both errors."""

from __future__ import annotations

import pytest

from flyship.bundle import manifest as M

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile
pytest.importorskip("triton", reason="needs triton 3.6 (the FlyDSL venv); it would build a kernel that cannot be "
                                     "traced twice in one process")

SPEC_FILE = ROOT / "tests" / "compiler" / "data" / "fragile" / "fragile_ops.py"


def variants(out) -> set[tuple[str, str, str]]:
    m = M.read(out)
    return {(o.name, s.name, v.target) for o in m.ops for s in o.specializations for v in s.variants}


def test_a_kernel_that_traces_once_per_process_builds_alike_with_one_or_two_jobs(tmp_path):
    one = run_build(SPEC_FILE, tmp_path / "j1", ["gfx942"], "-j", "1")
    # Three tasks on -j 1's two workers (one traces while the other assembles): some worker is reused, and the
    # spec it traced second failed there first.
    assert "retried in a fresh process" in one.stderr
    run_build(SPEC_FILE, tmp_path / "j2", ["gfx942"], "-j", "2")
    want = {("fragile", f"f32_b{b}{g}", "gfx942") for b in (256, 512, 1024) for g in ("", "__generic")}
    assert variants(tmp_path / "j1") == variants(tmp_path / "j2") == want
