"""gfx950's block-scaled MFMA and fp4 operands. Expected values by hand from the formats (OCP E2M1: 0, 0.5, 1, 1.5,
2, 3, 4, 6 and their negatives; E4M3FN; E8M0 = 2**(e - 127)) and AMD's CDNA4 matrix-core layouts: 8-bit operands
hold element e of lane group g at k = 32 (e // c) + c g + e % c (c = 8 for 16x16x128, 16 for 32x32x64), fp4 at
k = 32 g + e (low nibble first); lane l gives the scale of row/column l % M for k block l // M, the byte
op_sel[i] + 2 op_sel_hi[i] of its scale VGPR; D = C + sum_b scaleA[i, b] scaleB[b, j] sum_{k in b} A[i, k] B[k, j]."""

from __future__ import annotations

import numpy as np
import pytest

from tests.emulate.asm import assemble, run_lanes

pytestmark = pytest.mark.cpu
LANE = np.arange(64)
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_gfx950_mfma_scale_16x16x128_applies_each_lanes_block_scale_byte():
    # A: VGPRs 10-17 hold bytes e = 4q..4q+3, all of k block e // 8 = q // 2: 1.0, 2.0, 0.5, 1.5 (E4M3 0x38, 0x40,
    # 0x30, 0x3c) for blocks 0-3; B all 1.0. Scales: A from byte 2 of v2 (op_sel_hi[0]), B from byte 1 of v3
    # (op_sel[1]); the other bytes are 0xff (NaN) so a wrong byte shows.
    val = [1.0, 2.0, 0.5, 1.5]
    codes = [0x38, 0x40, 0x30, 0x3C]
    movs = "".join(f"  v_mov_b32 v{10 + q}, 0x{codes[q // 2] * 0x01010101:08x}\n  v_mov_b32 v{20 + q}, 0x38383838\n"
                   for q in range(8))
    img = assemble(movs + """
  v_mfma_scale_f32_16x16x128_f8f6f4 v[30:33], v[10:17], v[20:27], 0, v2, v3 op_sel:[0,1,0] op_sel_hi:[1,0,0]
  s_nop 7
  s_nop 7
  v_mov_b32 v4, v30
  v_mov_b32 v5, v33
""", "gfx950")
    ea = 125 + (LANE * 7) % 5
    eb = 126 + LANE % 3
    out, _ = run_lanes(img, (0xFF00FFFF | (ea << 16)).astype(np.uint32), (0xFFFF00FF | (eb << 8)).astype(np.uint32))
    sa = lambda i, b: 2.0 ** (ea[i + 16 * b] - 127)  # noqa: E731
    sb = lambda j, b: 2.0 ** (eb[j + 16 * b] - 127)  # noqa: E731
    d = np.array([[sum(32 * val[b] * sa(i, b) * sb(j, b) for b in range(4)) for j in range(16)] for i in range(16)])
    want = np.concatenate([d[4 * (LANE // 16) + r, LANE % 16] for r in (0, 3)]).astype(np.float32)
    np.testing.assert_array_equal(out.view(np.float32), want)


def test_gfx950_f8f6f4_mfma_32x32x64_fp4_a_with_fp8_b():
    # A fp4 (cbsz:4, v[10:13]): nibbles e = 0-15 of every lane are codes 0-15, e = 16-23 code 1 (0.5), e = 24-31
    # code 2 (1.0); with k = 32 g + e, A[i, k] = a(k % 32). B fp8: VGPR 20 + q
    # holds one E4M3 value w[q] in all four bytes, bytes e = 4q..4q+3, so B[k, j] = w[4 (k // 32) + (k % 16) // 4].
    w_codes = [0x38, 0x40, 0x30, 0x44, 0x3C, 0x48, 0x34, 0xB8]
    w = [1.0, 2.0, 0.5, 3.0, 1.5, 4.0, 0.75, -1.0]
    movs = "".join(f"  v_mov_b32 v{10 + q}, 0x{x:08x}\n" for q, x in enumerate([0x76543210, 0xFEDCBA98, 0x11111111,
                                                                                  0x22222222]))
    movs += "".join(f"  v_mov_b32 v{20 + q}, 0x{w_codes[q] * 0x01010101:08x}\n" for q in range(8))
    img = assemble(movs + """
  v_mfma_f32_32x32x64_f8f6f4 v[30:45], v[10:13], v[20:27], 0 cbsz:4
  s_nop 7
  s_nop 7
  s_nop 7
  v_mov_b32 v4, v30
  v_mov_b32 v5, v45
""", "gfx950")
    out, _ = run_lanes(img, LANE)
    a = FP4 + [0.5] * 8 + [1.0] * 8
    d = sum(a[k % 32] * w[4 * (k // 32) + (k % 16) // 4] for k in range(64))
    np.testing.assert_array_equal(out.view(np.float32), np.full(128, d, np.float32))
