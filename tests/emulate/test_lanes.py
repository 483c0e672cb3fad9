"""Cross-lane instructions on the emulated device, expected values from the ISA text (CDNA3/CDNA4 ISA guides,
"Data Parallel Primitives", DS_SWIZZLE_B32, V_PERMLANE*_SWAP_B32), never from running the emulator."""

from __future__ import annotations

import numpy as np
import pytest

from tests.emulate.asm import assemble, run_lanes

pytestmark = pytest.mark.cpu

LANE = np.arange(64)  # int64: lane arithmetic below may go negative before masking
IN = (LANE * 7 + 100).astype(np.uint32)  # distinct per lane
OLD = (LANE + 1000).astype(np.uint32)   # v4 before the DPP instruction


def dpp_run(insn: str, target: str = "gfx942") -> np.ndarray:
    img = assemble(f"  v_add_u32 v4, 1000, v0\n  {insn}\n", target)
    out, _ = run_lanes(img, IN)
    return out[:64]


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_row_bcast15_makes_row_r_read_lane_16r_minus_1(target):
    got = dpp_run("v_mov_b32_dpp v4, v2 row_bcast:15 row_mask:0xa bank_mask:0xf", target)
    row = LANE // 16
    want = np.where(np.isin(row, [1, 3]), IN[np.maximum(16 * row - 1, 0)], OLD)
    np.testing.assert_array_equal(got, want)
    assert got[16] == IN[15] and got[48] == IN[47]  # not lane 0 of the row


def test_row_bcast31_makes_rows_2_and_3_read_lane_31():
    got = dpp_run("v_mov_b32_dpp v4, v2 row_bcast:31 row_mask:0xc bank_mask:0xf")
    want = np.where(LANE >= 32, IN[31], OLD)
    np.testing.assert_array_equal(got, want)


def test_dpp_destination_that_is_its_source_reads_old_values():
    # v_add_u32_dpp v2, v2, v2 row_shr:1: every lane adds its left neighbour's OLD value (pairwise sums, not a
    # running sum); lane 0 of each row has no source: with bound_ctrl it reads 0.
    img = assemble("  v_add_u32_dpp v2, v2, v2 row_shr:1 row_mask:0xf bank_mask:0xf bound_ctrl:1\n"
                   "  v_mov_b32 v4, v2\n", "gfx942")
    out, _ = run_lanes(img, IN)
    prev = np.where(LANE % 16 == 0, 0, IN[np.maximum(LANE - 1, 0)])
    np.testing.assert_array_equal(out[:64], IN + prev)


def test_dpp_without_bound_ctrl_leaves_lanes_with_no_source_unwritten():
    got = dpp_run("v_mov_b32_dpp v4, v2 row_shl:3 row_mask:0xf bank_mask:0xf")
    want = np.where(LANE % 16 < 13, IN[np.minimum(LANE + 3, 63)], OLD)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("ctrl,source", [
    ("quad_perm:[3,2,1,0]", (LANE & ~3) | (3 - (LANE & 3))),
    ("row_mirror", (LANE & ~15) | (15 - (LANE & 15))),
    ("row_half_mirror", (LANE & ~7) | (7 - (LANE & 7))),
    ("row_ror:4", (LANE & ~15) | ((LANE - 4) & 15)),
    ("wave_ror:1", (LANE - 1) & 63),
])
def test_dpp_permutations(ctrl, source):
    got = dpp_run(f"v_mov_b32_dpp v4, v2 {ctrl} row_mask:0xf bank_mask:0xf")
    np.testing.assert_array_equal(got, IN[source])


def test_dpp_bank_mask_leaves_disabled_banks_unwritten():
    got = dpp_run("v_mov_b32_dpp v4, v2 quad_perm:[0,0,0,0] row_mask:0xf bank_mask:0x5")
    bank = (LANE >> 2) & 3
    np.testing.assert_array_equal(got, np.where(np.isin(bank, [0, 2]), IN[LANE & ~3], OLD))


@pytest.mark.parametrize("swz,source", [
    ("swizzle(QUAD_PERM,1,0,3,2)", (LANE & ~3) | ((LANE & 3) ^ 1)),
    ("swizzle(SWAP,16)", LANE ^ 16),
    ("swizzle(REVERSE,8)", (LANE & ~7) | (7 - (LANE & 7))),
    ("swizzle(BROADCAST,8,3)", (LANE & ~7) | 3),
    ("swizzle(BITMASK_PERM,\"01pip\")", None),
])
def test_ds_swizzle_quad_and_bitmask_modes(swz, source):
    # BITMASK_PERM "01pip" (bit 4 .. bit 0 of the lane within 32): bit4 = 0, bit3 = 1, bit2 = preserve,
    # bit1 = invert, bit0 = preserve.
    if source is None:
        low = LANE & 31
        source = (LANE & 32) | 8 | (low & 4) | ((low & 2) ^ 2) | (low & 1)
    img = assemble(f"  ds_swizzle_b32 v4, v2 offset:{swz}\n  s_waitcnt lgkmcnt(0)\n", "gfx942")
    out, _ = run_lanes(img, IN)
    np.testing.assert_array_equal(out[:64], IN[source])


def test_ds_bpermute_reads_the_lane_at_the_byte_address():
    src_lane = (LANE * 5 + 3) % 64
    img = assemble("  v_lshlrev_b32 v6, 2, v3\n  ds_bpermute_b32 v4, v6, v2\n  s_waitcnt lgkmcnt(0)\n", "gfx942")
    out, _ = run_lanes(img, IN, src_lane)
    np.testing.assert_array_equal(out[:64], IN[src_lane])


def test_permlane16_swap_swaps_odd_rows_of_vdst_with_even_rows_of_vsrc_gfx950():
    # v4 = OLD, v5 = IN; afterwards v4's rows 1, 3 hold v5's rows 0, 2 and v5's rows 0, 2 hold v4's rows 1, 3.
    img = assemble("  v_add_u32 v4, 1000, v0\n  v_mov_b32 v5, v2\n  v_permlane16_swap_b32 v4, v5\n", "gfx950")
    out, _ = run_lanes(img, IN)
    row = LANE // 16
    odd = row % 2 == 1
    np.testing.assert_array_equal(out[:64], np.where(odd, IN[LANE - 16 * odd], OLD))
    np.testing.assert_array_equal(out[64:], np.where(~odd, OLD[np.minimum(LANE + 16, 63)], IN))


def test_permlane32_swap_swaps_upper_half_of_vdst_with_lower_half_of_vsrc_gfx950():
    img = assemble("  v_add_u32 v4, 1000, v0\n  v_mov_b32 v5, v2\n  v_permlane32_swap_b32 v4, v5\n", "gfx950")
    out, _ = run_lanes(img, IN)
    hi = LANE >= 32
    np.testing.assert_array_equal(out[:64], np.where(hi, IN[LANE - 32 * hi], OLD))
    np.testing.assert_array_equal(out[64:], np.where(~hi, OLD[np.minimum(LANE + 32, 63)], IN))


def test_readlane_writelane_readfirstlane():
    img = assemble("""
  v_readlane_b32 s10, v2, 37
  s_mov_b64 exec, 0xff00
  v_readfirstlane_b32 s11, v2
  s_mov_b64 exec, -1
  v_mov_b32 v4, s10
  v_writelane_b32 v4, s11, 5
""", "gfx942")
    out, _ = run_lanes(img, IN)
    want = np.full(64, IN[37], np.uint32)
    want[5] = IN[8]
    np.testing.assert_array_equal(out[:64], want)
