"""V_MED3 / MIN3 / MAX3 (ISA pseudo-code: if max3(S0, S1, S2) == S0 then max(S1, S2), elif == S1 then max(S0, S2),
else max(S0, S1), i.e. the median; V_MED3_F32/F16 with a NaN operand give min3), and the GFX9 VOP3 op_sel of the
16-bit forms (bit i: source i's high half; bit 3: the result goes to the destination's high half, the low half
kept). Expected values are the median of three (a sort) of the operands as the ISA types them."""

from __future__ import annotations

import numpy as np
import pytest

from tests.emulate.asm import assemble, run_lanes

pytestmark = pytest.mark.cpu
LANE = np.arange(64)


def _median(*xs):
    return np.sort(np.stack(np.broadcast_arrays(*xs)), axis=0)[1]


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_med3_i32_is_the_signed_median(target):
    img = assemble("  s_mov_b32 s10, -5\n  v_med3_i32 v4, v2, v3, s10\n", target)
    a, b = LANE - 32, 20 - 3 * LANE  # both signs; ties with -5 at some lanes
    out, _ = run_lanes(img, a, b)
    np.testing.assert_array_equal(out[:64].view(np.int32), _median(a, b, -5))


def test_med3_u32_compares_unsigned():
    img = assemble("  s_mov_b32 s10, 0x80000000\n  v_med3_u32 v4, v2, v3, s10\n", "gfx942")
    a = (LANE.astype(np.uint64) * 0x05000000).astype(np.uint32)  # crosses 0x80000000 from lane 26
    b = np.full(64, 0x7FFFFFFF, np.uint32)
    out, _ = run_lanes(img, a, b)
    np.testing.assert_array_equal(out[:64], _median(a.astype(np.uint64), b, 0x80000000).astype(np.uint32))
    assert out[40] == 0x80000000 and out[3] == 0x7FFFFFFF  # signed compares would give a (0xC8000000) and b


def test_med3_f32_median_and_nan_gives_min3():
    img = assemble("  v_med3_f32 v4, v2, v3, 1.0\n", "gfx942")
    a = (LANE - 20).astype(np.float32) * np.float32(0.25)
    b = np.float32(3.0) - (LANE % 7).astype(np.float32)
    a[7], b[30] = np.nan, np.nan  # the other non-NaN operand is above 1.0 there
    out, _ = run_lanes(img, a, b)
    got = out[:64].view(np.float32)
    ok = np.ones(64, bool)
    ok[[7, 30]] = False
    np.testing.assert_array_equal(got[ok], _median(a, b, np.float32(1.0))[ok])
    assert got[7] == 1.0 and got[30] == 1.0  # ISA: a NaN operand gives min3


def _halves(lo, hi):
    return (np.asarray(lo, np.uint32) & 0xFFFF) | (np.asarray(hi, np.uint32) << 16)


def test_med3_f16_op_sel_reads_high_halves_and_writes_the_high_half():
    # S0 = v2's high half, S1 = v3's low half, S2 = 1.0; op_sel[3] writes the result to v4's high half, keeping
    # the low half (0x1234).
    img = assemble("  v_mov_b32 v4, 0xabcd1234\n  v_med3_f16 v4, v2, v3, 1.0 op_sel:[1,0,0,1]\n", "gfx942")
    s0 = ((LANE - 30) * 0.125).astype(np.float16)
    s1 = (2.0 - (LANE % 5) * 0.5).astype(np.float16)
    junk = np.full(64, 0x7E00, np.uint16)  # NaN in the halves not selected: reading them would show
    out, _ = run_lanes(img, _halves(junk, s0.view(np.uint16)), _halves(s1.view(np.uint16), junk))
    want = _median(s0, s1, np.float16(1.0)).astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(out[:64], _halves(np.full(64, 0x1234), want))


def test_med3_i16_and_u16_type_the_halves():
    img = assemble("""
  v_mov_b32 v4, 0x5555aaaa
  v_med3_i16 v4, v2, v3, -1 op_sel:[0,1,0,0]
  s_mov_b32 s10, 0x8000
  v_med3_u16 v5, v2, v3, s10
""", "gfx942")
    a16 = ((LANE - 32) * 1000).astype(np.int16)              # low half of v2: signed
    b16 = (LANE * 1023 - 30000).astype(np.int16)             # high half of v3
    c16 = ((LANE * 2039) & 0xFFFF).astype(np.uint16)         # low half of v3
    v2 = _halves(a16.view(np.uint16), 0x7777)
    v3 = _halves(c16, b16.view(np.uint16))
    out, _ = run_lanes(img, v2, v3)
    want_i = _median(a16, b16, np.int16(-1)).astype(np.int16).view(np.uint16)
    np.testing.assert_array_equal(out[:64], _halves(want_i, 0x5555))  # result in the low half, high half kept
    want_u = _median(a16.view(np.uint16), c16, np.uint16(0x8000)).astype(np.uint16)
    np.testing.assert_array_equal(out[64:] & 0xFFFF, want_u)


def test_16_bit_vop2_use_the_low_halves_and_zero_the_high_half():
    # GFX9 ISA: D.u16 = S1.u16 >> S0[3:0] (lshrrev), S1.i16 >> S0[3:0] (ashrrev), S0.u16 * S1.u16 (low 16 bits),
    # S0.u16 - S1.u16 (mod 2**16); the high half of D is 0 on GFX9. SDWA src0_sel:BYTE_1 feeds byte 1 of S0.
    img = assemble("""
  v_lshrrev_b16_e32 v4, v3, v2
  v_ashrrev_i16_e64 v5, v3, v2
  v_mul_lo_u16_e32 v6, 0x56, v2
  v_sub_u16_e32 v7, v2, v3
  v_mul_lo_u16_sdwa v8, v2, v3 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:BYTE_1 src1_sel:DWORD
  v_xor_b32 v4, v4, v6
  v_lshlrev_b32 v7, 16, v7
  v_or_b32 v5, v5, v7
  v_xor_b32 v5, v5, v8
""", "gfx942")
    a = ((LANE * 0x9E3779B1) & 0xFFFFFFFF).astype(np.uint32)  # high halves non-zero: must be ignored
    b = ((LANE * 0x85EBCA77 + 0x10000) & 0xFFFFFFFF).astype(np.uint32)
    out, _ = run_lanes(img, a, b)
    a16, b16 = a & 0xFFFF, b & 0xFFFF
    sh = b & 15
    lshr = a16 >> sh
    ashr = (a16.astype(np.uint16).view(np.int16).astype(np.int32) >> sh.astype(np.int32)) & 0xFFFF
    mul = (a16 * 0x56) & 0xFFFF
    sub = (a16 - b16) & 0xFFFF
    sdwa = (((a >> 8) & 0xFF) * b16) & 0xFFFF
    np.testing.assert_array_equal(out[:64], (lshr ^ mul).astype(np.uint32))
    np.testing.assert_array_equal(out[64:], ((ashr | (sub << 16)) ^ sdwa).astype(np.uint32))


def test_gfx950_cvt_pk_f16_f32_rounds_to_nearest_even():
    # binary16 bit patterns by hand: 1.0 = 0x3c00; 1 + 2**-11 is a tie between 0x3c00 and 0x3c01 -> even 0x3c00;
    # 1 + 3 * 2**-11 ties between 0x3c01 and 0x3c02 -> 0x3c02; 65520 rounds up past 65504 -> inf 0x7c00;
    # -2**-24 is the smallest negative denormal 0x8001; 2**-26 rounds to +0.
    a = np.array([1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 65520.0] * 16, np.float32)
    b = np.array([-2.0 ** -24, 2.0 ** -26, -1.5, 0.5] * 16, np.float32)
    img = assemble("  v_cvt_pk_f16_f32 v4, v2, v3\n", "gfx950")
    out, _ = run_lanes(img, a, b)
    lo = np.array([0x3C00, 0x3C00, 0x3C02, 0x7C00] * 16)
    hi = np.array([0x8001, 0x0000, 0xBE00, 0x3800] * 16)
    np.testing.assert_array_equal(out[:64], (lo | (hi << 16)).astype(np.uint32))
