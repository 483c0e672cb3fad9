"""Issue 33 item 5's silent cases beyond tests/loader/test_emulated_verify.py's (tests/loader/data/silent/beyond.py),
each refused by `flyship verify --emulate` naming op, specialization, target, the layout or shape and the first
wrong elements: a GEMM built for a column-major b fed a padded one or (b a bare pointer) a row-major one its guard
admits, a fixed per-token stride fed a padded or dims-swapped q, an LDS race (named with its LDS addresses), rows
wrong from 512. Plus what verify says about a wrong reference, a NaN the kernel wrote, the user's op names and the
asked targets. Every result here is emulated (flyship.loader.emulate), never a GPU's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_build

pytestmark = pytest.mark.cpu

SILENT = ROOT / "tests" / "loader" / "data" / "silent"


@pytest.fixture(scope="module")
def beyond(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The bundle (gfx942 only: no case here is per target) and its report, built and emulated once."""
    from flyship.loader import extension

    try:
        extension.extension("emulate")
    except extension.ExtensionBuildError as e:
        pytest.skip(f"the emulate extension cannot be built here, so nothing runs on the emulated device: {e}")
    from flyship.loader.tools.verify_emulated import Report, verify_emulated

    out = tmp_path_factory.mktemp("bundles") / "beyond"
    run_build(SILENT / "beyond.py", out, ["gfx942"])
    # the boundary shapes (up to 1025 rows: most of the cost) only where the case needs them
    layouts = verify_emulated(out, ("gfx942",), shapes=False,
                              ops=["gemm_colb", "gemm_colb_ptr", "q_scale", "lds_broadcast"])
    rows = verify_emulated(out, ("gfx942",), ops=["wrap_512", "cols_baked"])
    return out, Report(layouts.runs + rows.runs)


def _row(report: Any, op: str, case: str) -> Any:
    found = [r for r in report.runs if r.op == op and r.case.startswith(case)]
    assert len(found) == 1, (op, case, report.table())
    return found[0]


def test_each_is_right_on_its_example(beyond: Any) -> None:
    _, report = beyond
    for op in ("gemm_colb", "q_scale", "wrap_512"):  # at 8 rows in the example's layout
        assert _row(report, op, "8 rows, fresh").result == "ok", report.table()
        assert [r.result for r in report.runs if r.op == op and r.case == "8 rows"] == ["ok"], report.table()
    assert _row(report, "wrap_512", "the example").result == "ok", report.table()


def test_a_gemm_built_for_a_column_major_b_is_refused_on_a_padded_b(beyond: Any) -> None:
    _, report = beyond
    # the base case keeps the example's column-major b at 8 rows (it used to become row-major there)
    padded = _row(report, "gemm_colb", "8 rows, b with padded columns (strides [1, 19])")
    assert padded.result == "FAIL" and "output 'out':" in padded.note and "elements wrong, first [0, 1]" in padded.note
    b_contiguous = _row(report, "gemm_colb", "8 rows, b contiguous")
    assert b_contiguous.result == "not admitted"  # FlyDSL's guard: b.stride[0] == 1


def test_a_gemm_whose_guard_admits_a_row_major_b_it_reads_as_column_major_is_refused(beyond: Any) -> None:
    _, report = beyond
    # b is a bare pointer: its guard asks for contiguous rows, so the column-major example itself is not admitted;
    # verify runs the row-major layout the guard admits, and the kernel reads it as column-major
    r = _row(report, "gemm_colb_ptr", "8 rows (row-major, not the example's layout), fresh outputs")
    assert r.result == "FAIL" and "output 'out': 384 of 384 elements wrong, first [0, 0]" in r.note, report.table()


def test_a_fixed_per_token_stride_is_refused_on_admitted_layouts(beyond: Any) -> None:
    _, report = beyond
    padded = _row(report, "q_scale", "8 rows, q with padded rows (strides [70, 35, 1])")
    swapped = _row(report, "q_scale", "8 rows, q with dims 0 and 1 swapped in memory (strides [32, 256, 1])")
    for r in (padded, swapped):
        assert r.result == "FAIL" and "elements wrong, first [0, 1, 0]" in r.note, report.table()


def test_an_lds_race_is_named_with_its_lds_addresses(beyond: Any) -> None:
    _, report = beyond
    base = _row(report, "lds_broadcast", "8 rows, fresh")
    assert base.result == "FAIL" and base.note.startswith("serial: output 'out': 512 of 1024 elements wrong"), base
    assert "LDS race: LDS bytes two waves touched with no barrier between: ['0x0', '0x1'" in base.note, base.note


def test_rows_wrong_from_512_are_caught_past_512_rows(beyond: Any) -> None:
    _, report = beyond
    assert _row(report, "wrap_512", "past the base's grid: 259 rows").result == "ok"  # where it used to stop
    r = _row(report, "wrap_512", "past 512 rows: 513 rows")
    assert r.result == "FAIL" and "64 of 32832 elements wrong, first [512, 0]" in r.note, r.note


def test_a_column_count_baked_in_is_refused_on_fewer_columns_the_guard_admits(beyond: Any) -> None:
    _, report = beyond
    # right on every row count at 64 columns; the guard (x.shape[1] <= 64) admits fewer, which the kernel reads past
    assert _row(report, "cols_baked", "8 rows, fresh").result == "ok", report.table()
    assert _row(report, "cols_baked", "past the base's grid").result == "ok", report.table()
    for n, why in ((1, "one column"), (32, "half the example's"), (63, "one fewer than the example's")):
        r = _row(report, "cols_baked", f"fewer columns: 8 rows x {n} column{'s' * (n != 1)} ({why})")
        assert r.result == "FAIL", report.table()
    assert not report.ok


def test_the_users_op_names_and_only_the_asked_targets(beyond: Any) -> None:
    _, report = beyond
    refused = [r for r in report.runs if r.result == "not admitted"]
    assert refused and all("flyship flyship_beyond::" in r.note for r in refused), report.table()
    assert "flyship_e" not in report.table()
    assert {r.target for r in report.runs} == {"gfx942"}


def test_a_wrong_reference_is_named_not_the_kernel(beyond: Any) -> None:
    import torch

    from flyship.loader.tools import verify_emulated as ve

    out, _ = beyond
    handle = ve.load_emulated(out, "gfx942").wrap_512
    spec = handle.manifest.specializations[0]
    x = [torch.randn(8, 64)]

    def raises(x: Any) -> Any:
        raise ValueError("boom")

    result, note, _n, _s = ve.run_case(handle, spec, raises, x)
    assert result == "FAIL" and note.startswith("the reference raised ValueError: boom on inputs the guard admits: "
                                                "the reference is wrong"), note
    result, note, _n, _s = ve.run_case(handle, spec, lambda x: (x + 1).double(), x)
    assert result == "FAIL" and "the reference's result does not fit the op's declared output" in note, note
    assert "got shape [8, 64] and dtype float64" in note and "the reference is wrong, not the kernel" in note, note
    result, note, _n, _s = ve.run_case(handle, spec, lambda x: (x + 1, x), x)
    assert result == "FAIL" and "the reference returned 2 value(s) (Tensor, Tensor), the op declares 1" in note, note


def test_a_nan_the_kernel_wrote_is_not_called_unwritten(beyond: Any) -> None:
    import torch

    from flyship.loader.tools import verify_emulated as ve

    out, _ = beyond
    handle = ve.load_emulated(out, "gfx942").wrap_512
    spec = handle.manifest.specializations[0]
    x = torch.randn(8, 64)
    x[3, 5] = float("nan")  # the kernel computes NaN + 1 there; this reference says 0
    result, note, _n, _s = ve.run_case(handle, spec, lambda x: (x + 1).nan_to_num(0.0), [x])
    assert result == "FAIL" and "the kernel wrote NaN at 1 of 512 elements" in note and "[3, 5]" in note, note
    assert "never written" not in note, note
