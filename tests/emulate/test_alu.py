"""ALU semantics on the emulated device (VALU, SALU, MFMA, float modes) and refusals; expected values from the ISA
text and the number formats' definitions."""

from __future__ import annotations

import struct
import warnings

import numpy as np
import pytest

from flyship.loader import emulate
from tests.emulate.asm import assemble, run_lanes

pytestmark = pytest.mark.cpu
LANE = np.arange(64)
DENORM = np.full(64, 0x00000003, np.uint32)  # a binary32 denormal (3 * 2**-149)


@pytest.mark.parametrize("mode,flushed", [(3, False), (0, True)])
def test_f32_denormals_follow_the_descriptors_float_mode(mode, flushed):
    # v4 = denormal * 1.0 (a denormal input); v5 = 2**-126 * 0.5 (a denormal result).
    img = assemble("  v_mul_f32 v4, v2, 1.0\n  v_mov_b32 v6, 0x00800000\n  v_mul_f32 v5, 0.5, v6\n", "gfx942",
                   denorm32=mode)
    out, _ = run_lanes(img, DENORM)
    if flushed:
        assert (out == 0).all()
    else:
        assert (out[:64] == 3).all() and (out[64:] == 0x00400000).all()


def fp8_value(byte: int, fmt: str) -> float:
    """An 8-bit float by its definition: E4M3FNUZ bias 8, E4M3FN (OCP) bias 7 (normal numbers)."""
    e, m = (byte >> 3) & 15, byte & 7
    bias = {"e4m3fnuz": 8, "e4m3fn": 7}[fmt]
    return (1 + m / 8) * 2.0 ** (e - bias)


@pytest.mark.parametrize("target,fmt", [("gfx942", "e4m3fnuz"), ("gfx950", "e4m3fn")])
def test_fp8_mfma_decodes_fp8_per_target(target, fmt):
    # A = all 0x3c (1.5 in E4M3FN, 0.75 in E4M3FNUZ), B = all 0x40 (2.0 / 1.0); D = sum over K = 32 of a * b.
    img = assemble("""
  v_mov_b32 v10, 0x3c3c3c3c
  v_mov_b32 v11, 0x3c3c3c3c
  v_mov_b32 v12, 0x40404040
  v_mov_b32 v13, 0x40404040
  v_mfma_f32_16x16x32_fp8_fp8 v[20:23], v[10:11], v[12:13], 0
  s_nop 7
  s_nop 7
  v_mov_b32 v4, v20
  v_mov_b32 v5, v23
""", target)
    out, _ = run_lanes(img, LANE)
    want = 32 * fp8_value(0x3C, fmt) * fp8_value(0x40, fmt)
    np.testing.assert_array_equal(out.view(np.float32), np.full(128, want, np.float32))
    assert want == (96.0 if fmt == "e4m3fn" else 24.0)  # the 4x difference between the two decodings


def test_bf16_mfma_16x16x16_layout_and_f32_accumulate():
    # Lane l holds A[l % 16][4 (l // 16) + t] and B[4 (l // 16) + t][l % 16], t = 0..3 (two bf16 per VGPR);
    # D register r of lane l is C[4 (l // 16) + r][l % 16] (CDNA3 ISA, "Dependency on the MFMA layout").
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (16, 16)).astype(np.float32)
    b = rng.integers(-4, 5, (16, 16)).astype(np.float32)
    k = 4 * (LANE // 16)[:, None] + np.arange(4)
    a_lane = a[(LANE % 16)[:, None], k]
    b_lane = b[k, (LANE % 16)[:, None]]

    def pack(x):  # 4 bf16 per lane -> 2 dwords (exact small integers)
        bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint32)
        return bits[:, 0::2] | (bits[:, 1::2] << 16)
    pa, pb = pack(a_lane), pack(b_lane)
    img = assemble("""
  global_load_dword v10, v1, s[6:7]
  global_load_dword v11, v1, s[6:7] offset:256
  global_load_dword v12, v1, s[8:9]
  global_load_dword v13, v1, s[8:9] offset:256
  s_waitcnt vmcnt(0)
  v_mfma_f32_16x16x16_bf16 a[0:3], v[10:11], v[12:13], 0
  s_nop 7
  s_nop 7
  v_accvgpr_read_b32 v4, a0
  v_accvgpr_read_b32 v5, a3
""", "gfx942")
    out, _ = run_lanes(img, np.r_[pa[:, 0], pa[:, 1]], np.r_[pb[:, 0], pb[:, 1]])
    c = a @ b
    np.testing.assert_array_equal(out[:64].view(np.float32), c[4 * (LANE // 16), LANE % 16])
    np.testing.assert_array_equal(out[64:].view(np.float32), c[4 * (LANE // 16) + 3, LANE % 16])


def bf16_rne(x: np.ndarray) -> np.ndarray:
    """binary32 -> bfloat16 bits, round to nearest even (by the definition, on integers)."""
    b = x.view(np.uint32).astype(np.int64)
    keep, rest = b >> 16, b & 0xFFFF
    up = (rest > 0x8000) | ((rest == 0x8000) & (keep & 1 == 1))
    return ((keep + up) & 0xFFFF).astype(np.uint32)


def test_cvt_pk_bf16_f32_rounds_to_nearest_even_gfx950():
    x = (np.float32(1.0) + np.arange(64, dtype=np.float32) * np.float32(2 ** -12)).astype(np.float32)
    x.view(np.uint32)[::3] |= 0x8000  # exact ties
    img = assemble("  v_cvt_pk_bf16_f32 v4, v2, v3\n", "gfx950")
    y = -x
    out, _ = run_lanes(img, x, y)
    np.testing.assert_array_equal(out[:64], bf16_rne(x) | (bf16_rne(y) << 16))


def test_v_perm_b32_selects_bytes_sign_and_constants():
    # selector bytes (low to high): 0 -> byte 0 of src1, 7 -> byte 3 of src0, 12 -> 0x00, 13 -> 0xff
    img = assemble("  s_mov_b32 s13, 0x0d0c0700\n  v_perm_b32 v4, v2, v3, s13\n", "gfx942")
    a, b = (LANE * 0x01020304 + 0x11223344).astype(np.uint32), (LANE * 0x00010203 + 0x55667788).astype(np.uint32)
    out, _ = run_lanes(img, a, b)
    want = (b & 0xFF) | ((a >> 24) << 8) | (0x00 << 16) | (0xFF << 24)
    np.testing.assert_array_equal(out[:64], want.astype(np.uint32))


def test_64_bit_add_with_carry_and_lshl_add_u64():
    img = assemble("""
  v_mov_b32 v6, -1
  v_add_co_u32 v4, vcc, v2, v6
  v_addc_co_u32 v5, vcc, v3, 0, vcc
  v_lshl_add_u64 v[8:9], v[2:3], 4, v[2:3]
""", "gfx942")
    lo, hi = LANE.astype(np.uint32), (LANE * 3).astype(np.uint32)
    out, _ = run_lanes(img, lo, hi)
    full = (hi.astype(np.uint64) << 32 | lo) + np.uint64(0xFFFFFFFF)
    np.testing.assert_array_equal(out[:64], (full & 0xFFFFFFFF).astype(np.uint32))
    np.testing.assert_array_equal(out[64:], (full >> 32).astype(np.uint32))


def test_scalar_loop_branches_and_compares():
    # s10 = sum of 1..10 through a counted loop; v4 = s10; v5 = s_cselect on scc of s_cmp_lt_i32 -1, 0.
    img = assemble("""
  s_mov_b32 s10, 0
  s_mov_b32 s11, 1
.Lloop:
  s_add_u32 s10, s10, s11
  s_add_u32 s11, s11, 1
  s_cmp_le_u32 s11, 10
  s_cbranch_scc1 .Lloop
  v_mov_b32 v4, s10
  s_cmp_lt_i32 -1, 0
  s_cselect_b32 s12, 7, 9
  v_mov_b32 v5, s12
""", "gfx942")
    out, st = run_lanes(img, LANE)
    assert (out[:64] == 55).all() and (out[64:] == 7).all()
    assert st.instructions > 40 and st.waves == 1


@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "gfx950"])
def test_exec_masking_and_vcc_branch(target):
    img = assemble("""
  v_mov_b32 v4, 0
  v_cmp_gt_u32 vcc, 20, v0
  s_and_saveexec_b64 s[10:11], vcc
  v_mov_b32 v4, 1
  s_or_b64 exec, exec, s[10:11]
  v_cndmask_b32 v5, 5, 6, vcc
""", target)
    out, _ = run_lanes(img, LANE)
    np.testing.assert_array_equal(out[:64], (LANE < 20).astype(np.uint32))
    np.testing.assert_array_equal(out[64:], np.where(LANE < 20, 6, 5))


def test_an_unsupported_instruction_is_refused_by_name_when_reached():
    img = assemble("  v_sad_u32 v4, v2, v3, 0\n", "gfx942")
    with pytest.raises(emulate.EmulationError) as e:
        run_lanes(img, LANE)
    msg = str(e.value)
    assert "unsupported instruction v_sad_u32" in msg and " at 0x" in msg and " in k" in msg


def test_an_unsupported_instruction_never_reached_is_listed_not_run():
    img = assemble("  s_branch .Lskip\n  v_sad_u32 v4, v2, v3, 0\n.Lskip:\n  v_mov_b32 v4, 3\n", "gfx942")
    out, st = run_lanes(img, LANE)
    assert (out[:64] == 3).all() and st.refused_unreached == ["v_sad_u32"]


def test_scratch_and_traps_are_refused_with_the_reason():
    img = assemble("  v_mov_b32 v4, 0\n", "gfx942", extra_directives="  .amdhsa_private_segment_fixed_size 16")
    with pytest.raises(emulate.EmulationError, match="scratch is not modelled"):
        run_lanes(img, LANE)
    img = assemble("  s_trap 2\n", "gfx942")
    with pytest.raises(emulate.EmulationError, match="s_trap"):
        run_lanes(img, LANE)


def test_a_loop_that_never_ends_is_refused_at_the_instruction_limit():
    img = assemble(".Lspin:\n  s_branch .Lspin\n", "gfx942")
    a = np.zeros(64, np.uint32)
    mem = emulate.Memory()
    mem.add(a.ctypes.data, a.nbytes, writable=True, name="a")
    args = struct.pack("<QQQ", a.ctypes.data, a.ctypes.data, a.ctypes.data)
    with pytest.raises(emulate.EmulationError, match="ran past 1000 wave-instructions"):
        emulate.run(img, "k", grid=(1, 1, 1), block=(64, 1, 1), dynamic_lds=0, kernargs=args, memory=mem,
                    max_instructions=1000)


def test_workgroup_ids_and_hidden_arguments_reach_the_kernel():
    img = assemble("  v_mov_b32 v4, s2\n  v_mov_b32 v5, v0\n", "gfx942")
    out, st = run_lanes(img, np.r_[LANE, LANE, LANE], block=64, grid=3, out_words=128)
    assert st.workgroups == 3 and st.waves == 3
    np.testing.assert_array_equal(out[:64], np.full(64, 2))  # every group stores to out[tid]: the last is 2
    np.testing.assert_array_equal(out[64:], LANE)


@pytest.mark.parametrize("target,codes", [
    # E4M3FNUZ (bias 8): 1.0 = 0x40, -2.0 = 0xc8, 1.0625 (a tie) -> 1.0; OCP E4M3FN (bias 7): 0x38, 0xc0, 0x38.
    ("gfx942", (0x40, 0xC8, 0x40)),
    ("gfx950", (0x38, 0xC0, 0x38)),
])
def test_cvt_pk_fp8_f32_encodes_per_target_round_to_nearest_even(target, codes):
    vals = np.array([1.0, -2.0, 1.0625], np.float32)
    a = np.resize(vals, 64)
    b = np.resize(vals[::-1], 64)
    img = assemble("  v_mov_b32 v4, 0x11223344\n  v_cvt_pk_fp8_f32 v4, v2, v3 op_sel:[0,0,1]\n", target)
    out, _ = run_lanes(img, a, b)
    code = dict(zip(vals.tolist(), codes))
    want = np.array([0x3344 | (code[float(x)] << 16) | (code[float(y)] << 24) for x, y in zip(a, b)], np.uint32)
    np.testing.assert_array_equal(out[:64], want)


def test_words_the_disassembler_cannot_decode_are_refused_not_skipped():
    img = assemble("  .long 0xffffffff\n", "gfx942")
    with pytest.raises(emulate.EmulationError, match="llvm-objdump could not decode this instruction"):
        run_lanes(img, LANE)


def test_a_malformed_offload_bundle_is_refused():
    bad = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<QQQQ", 1, 100, 10**6, 5) + b"hipv4"
    mem = emulate.Memory()
    with pytest.raises(emulate.EmulationError, match="malformed header"):
        emulate.run(bad, "k", grid=(1, 1, 1), block=(64, 1, 1), dynamic_lds=0, kernargs=b"", memory=mem)


def test_pk_fma_f32_op_sel_hi_and_neg_pick_and_negate_halves():
    # v[6:7] = (a, 2a), v[8:9] = (b, 3b), v[10:11] = (1, 1); op_sel_hi:[1,0,1] makes the high result use b's low
    # dword; neg_lo:[0,0,1] negates c's low dword: lo = a*b - 1, hi = 2a*b + 1 (ISA "VOP3P op_sel").
    img = assemble("""
  v_mov_b32 v6, v2
  v_add_f32 v7, v2, v2
  v_mov_b32 v8, v3
  v_mul_f32 v9, 0x40400000, v3
  v_mov_b32 v10, 1.0
  v_mov_b32 v11, 1.0
  v_pk_fma_f32 v[4:5], v[6:7], v[8:9], v[10:11] op_sel_hi:[1,0,1] neg_lo:[0,0,1]
""", "gfx942")
    a = (LANE + 1).astype(np.float32)
    b = (LANE * 0.5 - 3).astype(np.float32)
    out, _ = run_lanes(img, a, b)
    np.testing.assert_array_equal(out[:64].view(np.float32), a * b - 1)
    np.testing.assert_array_equal(out[64:].view(np.float32), 2 * a * b + 1)


def test_float_exceptions_give_ieee_results_without_numpy_warnings():
    # The hardware raises no float exceptions (the ISA's v_rcp_f32 table: rcp(+0) = +inf, rcp(-0) = -inf);
    # inf - inf is the default NaN. numpy would warn on each; the emulator computes them silently.
    img = assemble("  v_rcp_f32 v4, v2\n  v_mov_b32 v6, 0x7f800000\n  v_sub_f32 v5, v6, v6\n", "gfx942")
    zeros = np.where(LANE % 2 == 0, 0, 0x80000000).astype(np.uint32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = run_lanes(img, zeros)
    np.testing.assert_array_equal(out[:64], np.where(LANE % 2 == 0, 0x7F800000, 0xFF800000).astype(np.uint32))
    assert np.isnan(out[64:].view(np.float32)).all()


def fp8_any(byte: int, fmt: str) -> float:
    """fp8 E4M3 or bf8 E5M2 (OCP, gfx950) by definition, normal numbers and zero."""
    s, rest = (-1.0 if byte & 0x80 else 1.0), byte & 0x7F
    if rest == 0:
        return 0.0
    eb, bias = (4, 7) if fmt == "e4m3fn" else (5, 15)
    mb = 7 - eb
    e, m = rest >> mb, rest & ((1 << mb) - 1)
    return s * (1 + m / (1 << mb)) * 2.0 ** (e - bias)


@pytest.mark.parametrize("cbsz,fmt_a", [(0, "e4m3fn"), (1, "e5m2")])
def test_gfx950_f8f6f4_mfma_16x16x128_rows_columns_and_output_layout(cbsz, fmt_a):
    # D = A (16x128) B (128x16): lane l holds row l % 16 of A and column l % 16 of B, 32 bytes (8 VGPRs) of K each
    # for lane group l // 16; D register r of lane l is D[4 (l // 16) + r][l % 16] (the 16x16 layout of the ISA).
    # Every byte of a lane is its in0 (A) / in1 (B) byte, so D[m][n] = 32 * sum_g a(m + 16g) b(n + 16g)
    # whatever k each byte stands for. cbsz picks A's format (0 fp8, 1 bf8), blgp B's (0 fp8).
    movs = "".join(f"  v_mov_b32 v{10 + i}, v2\n  v_mov_b32 v{20 + i}, v3\n" for i in range(8))
    img = assemble(movs + f"""
  v_mfma_f32_16x16x128_f8f6f4 v[30:33], v[10:17], v[20:27], 0 cbsz:{cbsz}
  s_nop 7
  s_nop 7
  v_mov_b32 v4, v30
  v_mov_b32 v5, v33
""", "gfx950")
    codes_a = np.array([0x38, 0x40, 0xB8, 0x44, 0x30, 0x3C, 0x48, 0x34] * 8)[LANE] if cbsz == 0 else \
        np.array([0x3C, 0x40, 0xBC, 0x42, 0x38, 0x3E, 0x44, 0x3A] * 8)[LANE]
    codes_b = (np.arange(64) * 5 + 0x30) % 0x20 + 0x30  # E4M3 codes 0x30..0x4f: 0.5 .. 3.875
    a = np.array([fp8_any(int(c), fmt_a) for c in codes_a])
    b = np.array([fp8_any(int(c), "e4m3fn") for c in codes_b])
    word = lambda c: (c * 0x01010101).astype(np.uint32)  # noqa: E731 - the byte in all four bytes
    out, _ = run_lanes(img, word(codes_a), word(codes_b))
    d = np.array([[32 * sum(a[m + 16 * g] * b[n + 16 * g] for g in range(4)) for n in range(16)] for m in range(16)])
    want = np.concatenate([d[4 * (LANE // 16) + r, LANE % 16] for r in (0, 3)]).astype(np.float32)
    np.testing.assert_array_equal(out.view(np.float32), want)


def test_gfx950_f8f6f4_mfma_with_fp6_operands_is_refused_by_name():
    img = assemble("  v_mfma_f32_16x16x128_f8f6f4 v[30:33], v[10:15], v[20:25], 0 cbsz:2 blgp:2\n  s_nop 7\n"
                   "  s_nop 7\n  v_mov_b32 v4, v30\n", "gfx950")
    with pytest.raises(emulate.EmulationError, match="v_mfma_f32_16x16x128_f8f6f4 with formats cbsz:2 blgp:2"):
        run_lanes(img, LANE)


def test_gfx950_f8f6f4_mfma_32x32x64_output_layout():
    # 32x32x64: lane l holds row/column l % 32 and 32 bytes of K for lane group l // 32 (two groups); D register r
    # of lane l is D[8 (r // 4) + 4 (l // 32) + r % 4][l % 32]. D[m][n] = 32 * sum_g a(m + 32g) b(n + 32g).
    movs = "".join(f"  v_mov_b32 v{10 + i}, v2\n  v_mov_b32 v{20 + i}, v3\n" for i in range(8))
    img = assemble(movs + """
  v_mfma_f32_32x32x64_f8f6f4 v[30:45], v[10:17], v[20:27], 0
  s_nop 7
  s_nop 7
  s_nop 7
  v_mov_b32 v4, v35
  v_mov_b32 v5, v44
""", "gfx950")
    codes_a = (np.arange(64) * 3 + 0x30) % 0x20 + 0x30
    codes_b = (np.arange(64) * 5 + 0x31) % 0x20 + 0x30
    a = np.array([fp8_any(int(c), "e4m3fn") for c in codes_a])
    b = np.array([fp8_any(int(c), "e4m3fn") for c in codes_b])
    out, _ = run_lanes(img, (codes_a * 0x01010101).astype(np.uint32), (codes_b * 0x01010101).astype(np.uint32))
    d = np.array([[32 * sum(a[m + 32 * g] * b[n + 32 * g] for g in range(2)) for n in range(32)] for m in range(32)])
    want = np.concatenate([d[8 * (r // 4) + 4 * (LANE // 32) + r % 4, LANE % 32] for r in (5, 14)]).astype(np.float32)
    np.testing.assert_array_equal(out.view(np.float32), want)
