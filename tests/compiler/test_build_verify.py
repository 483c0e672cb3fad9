"""``flyc-build --verify``: after writing, every AMD specialization runs on the emulated device (``flyship verify
--emulate`` in a child process of the build Python); a kernel right on its example but wrong beyond it (rows past
256 or 512, an admitted layout it ignores, an LDS race, fewer columns than it bakes in) refuses the build, naming
op, specialization, target, case and the first wrong elements, and nothing is left at OUT to load.
Emulated results, never a GPU's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, run_build

pytestmark = pytest.mark.compile

SILENT = ROOT / "tests" / "loader" / "data" / "silent" / "silent.py"


def test_verify_refuses_a_kernel_wrong_past_its_example(tmp_path: Path) -> None:
    out = tmp_path / "silent"
    r = run_build(SILENT, out, ["gfx942"], "--verify", check=False)
    text = r.stdout + r.stderr
    assert r.returncode == 1, text
    assert ("flyc-build --verify: expected every AMD specialization to match its reference on the emulated device, "
            "got 8 failing; first: ") in r.stderr, text  # 259, 513 and 1025 rows of two ops, two layouts of one
    # the first failure, by op, specialization, target and case, with the first wrong elements
    assert ("op 'wrap_rows', specialization 'f32', gfx942, past the base's grid: 259 rows: forward: output 'out': "
            "192 of 16576 elements wrong, first [256, 0]") in r.stderr, text
    assert not out.exists() and (tmp_path / "silent.refused" / "manifest.json").is_file(), text
    assert "emulated device:" in r.stdout and "8 failed" in r.stdout, text  # every case listed as it ran


def test_verify_refuses_a_fixed_layout_a_fixed_token_stride_an_lds_race_and_rows_wrong_from_512(tmp_path: Path
                                                                                                ) -> None:
    out = tmp_path / "beyond"
    r = run_build(SILENT.parent / "beyond.py", out, ["gfx942"], "--verify", check=False)
    text = r.stdout + r.stderr
    assert r.returncode == 1 and not out.exists(), text
    failed = [line for line in r.stdout.splitlines() if " FAIL" in line]
    # each named by op, specialization, target and case (layout or shape), with the first wrong elements
    want = {"gemm_colb        f32_k16    gfx942   8 rows, b with padded columns (strides [1, 19])": "first [0, 1]",
            "gemm_colb_ptr    f32_k16    gfx942   8 rows (row-major, not the example's layout), fresh outputs":
                "384 of 384 elements wrong, first [0, 0]",
            "q_scale          f32        gfx942   8 rows, q with padded rows (strides [70, 35, 1])": "first [0, 1, 0]",
            "q_scale          f32        gfx942   8 rows, q with dims 0 and 1 swapped in memory": "first [0, 1, 0]",
            "lds_broadcast    f32        gfx942   8 rows, fresh outputs": "LDS race: LDS bytes two waves touched "
                                                                          "with no barrier between: ['0x0', '0x1'",
            "wrap_512         f32        gfx942   past 512 rows: 513 rows":
                "64 of 32832 elements wrong, first [512, 0]",
            # N columns baked in behind a guard that admits fewer (x.shape[1] <= N): it reads past x there
            "cols_baked       n64        gfx942   fewer columns: 8 rows x 32 columns (half the example's)":
                "outside every region of the launch's memory (nearest: 0 bytes past the end of x"}
    for head, words in want.items():
        assert any(line.startswith(head) and words in line for line in failed), (head, text)
    assert not any(line.startswith("wrap_512") for line in failed if "513 rows" not in line
                   and "1025 rows" not in line), text  # right on every shape up to 512 rows
    assert ("got 27 failing; first: op 'gemm_colb', specialization 'f32_k16', gfx942, 8 rows, b with padded "
            "columns (strides [1, 19]): forward: output 'out': ") in r.stderr, text


def test_verify_passes_a_right_kernel(tmp_path: Path) -> None:
    out = tmp_path / "right"
    r = run_build(SILENT.parent / "right.py", out, ["gfx942", "gfx950"], "--verify", check=False)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert (out / "manifest.json").is_file() and "0 failed" in r.stdout, text
    ok = [line for line in r.stdout.splitlines() if line.startswith("plus_one") and " ok [" in line]
    assert {t for t in ("gfx942", "gfx950") if any(f" {t} " in line for line in ok)} == {"gfx942", "gfx950"}, text
    assert len(ok) >= 2 * 7, text  # base, its layout, one row, tails, past 256 rows, the example: both targets
