"""``flyc-build --verify`` for Triton ops: each kernel's source runs under Triton's interpreter (TRITON_INTERPRET=1)
through the launches the recording driver makes for verify's cases (base, fresh and sentinel outputs, admitted
layouts, boundary shapes), against the reference. A spec that builds for sm_90 only (nothing of it was executed
before) with a grid short of the rows on an odd row count is refused, naming op, specialization, case and the first
wrong elements; a right Triton op passes. The interpreter runs the kernel's Python source, never the cubin."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_build

pytestmark = pytest.mark.compile
pytest.importorskip("triton", reason="needs Triton 3.6 (the FlyDSL venv): its interpreter runs the kernels")

DATA = ROOT / "tests" / "compiler" / "data" / "triton_interp"


def test_verify_refuses_a_triton_grid_short_of_the_rows(tmp_path: Path) -> None:
    out = tmp_path / "silent"
    r = run_build(DATA / "silent.py", out, ["sm_90"], "--verify", check=False)
    text = r.stdout + r.stderr
    assert r.returncode == 1, text
    # each odd row count the guard admits fails: the tail (9), past the grid (259), past 512 and 1024 rows (513, 1025)
    assert re.search(r"flyc-build --verify: expected every Triton specialization to match its reference under "
                     r"Triton's interpreter, got [2-9] failing under Triton's interpreter; first: op 'scale_rows', "
                     r"specialization 'f32__generic', a row tail: 9 rows: output 'out': 24 of 216 elements never "
                     r"written \(first at \[8, 0\]\)", r.stderr), text
    assert not out.exists() and (tmp_path / "silent.refused" / "manifest.json").is_file(), text
    lines = [line for line in r.stdout.splitlines() if line.startswith("scale_rows")]
    # the example and every even row count are right: only the odd row counts the guard admits fail
    assert any(" 8 rows, fresh outputs " in line and line.endswith(" ok") for line in lines), text
    assert any("past the base's grid: 259 rows" in line and " FAIL " in line for line in lines), text
    assert "sm_90 code objects not executed (no NVIDIA GPU" in r.stdout, text


def test_verify_names_the_input_a_triton_op_writes_in_place_and_the_declared_namespace(tmp_path: Path) -> None:
    out = tmp_path / "inplace"
    r = run_build(DATA / "inplace.py", out, ["sm_90"], "--verify", check=False)
    text = r.stdout + r.stderr
    assert r.returncode == 1, text
    lines = [line for line in r.stdout.splitlines() if line.startswith("scale_rows_inplace")]
    tail = [line for line in lines if "a row tail: 9 rows" in line]
    assert len(tail) == 1 and " FAIL " in tail[0], text
    assert "input 'x' (written in place): " in tail[0] and "in-place 0" not in text, text
    # a layout the guard refuses (x.stride[1] == 1) names the op by the spec's namespace
    refused = [line for line in lines if " not admitted " in line]
    assert refused and all("flyship flyship_tl_inplace::scale_rows_inplace" in line for line in refused), text
    assert "flyship_dry_" not in text, text


def test_verify_passes_a_right_triton_op(tmp_path: Path) -> None:
    out = tmp_path / "right"
    r = run_build(DATA / "right.py", out, ["sm_90"], "--verify", check=False)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert (out / "manifest.json").is_file(), text
    ok = [line for line in r.stdout.splitlines() if line.startswith("scale_rows") and " interp " in line
          and line.endswith(" ok")]
    # per specialization: base fresh + sentinel, padded rows, one row, tails, largest columns, past the grid
    assert len(ok) >= 2 * 8, text
    # two launches per call through a workspace: replayed on a workspace allocated per call, every case ok
    sums = [line for line in r.stdout.splitlines() if line.startswith("row_sums") and " interp " in line]
    assert len(sums) >= 2 * 9 and all(line.endswith(" ok") or " not admitted " in line for line in sums), text
    assert "Triton interpreter: " in r.stdout and " 0 failed" in r.stdout and " 0 skipped" in r.stdout, text


def test_a_kernel_file_changed_since_the_build_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flyship.compiler.interpreting import interpret_plan
    from flyship.errors import LoadError
    from flyship.loader.tools.verify_interpreted import PLAN_KIND, Kernels

    plan = interpret_plan(str(DATA / "right.py"), ("sm_90",))
    assert plan is not None and plan["target"] == "sm_90"
    (entry,) = plan["ops"]["scale_rows"]["f32"]
    assert entry["constexprs"] == {"BLOCK_N": 32} and entry["qualname"] == "scale_rows_kernel", entry
    copy = tmp_path / "tl_rows.py"
    copy.write_bytes(Path(entry["file"]).read_bytes() + b"\n# changed after the build\n")
    changed = dict(entry, file=str(copy), files={str(copy): entry["files"][entry["file"]]})
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    hashed = r"expected .*tl_rows.py as the build hashed it .* got other bytes; rebuild"
    with pytest.raises(LoadError, match=hashed) as e:
        Kernels(json.loads(json.dumps(plan))).get(changed)
    assert e.value.kind == PLAN_KIND
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(LoadError, match="expected TRITON_INTERPRET=1"):
        Kernels(plan)
    assert os.environ.get("TRITON_INTERPRET") is None
