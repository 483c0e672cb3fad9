"""Direct-to-LDS buffer loads and the CDNA4 LDS transpose reads. Expected values from the ISA text: CDNA3/CDNA4 ISA
"Memory Buffer Load to LDS": the memory address is the buffer's usual one (inst_offset included, num_records bounds:
out of range reads 0), lane t writes its data to LDS at M0 + inst_offset + t * 4 (t * 16 for gfx950's dwordx4);
no VGPR is written; lanes off in EXEC write nothing."""

from __future__ import annotations

import numpy as np
import pytest

from flyship.loader import emulate
from tests.emulate.asm import assemble, run_lanes

pytestmark = pytest.mark.cpu
LANE = np.arange(64)
DEAD = 0xDEADBEEF
IN = (np.arange(320) * 0x01030507 + 0x11) .astype(np.uint32)

# s[12:15] = a raw buffer descriptor over in0 (stride 0), num_records = s14; v9 = DEAD, the LDS fill.
DESCRIPTOR = """
  s_mov_b32 s12, s6
  s_and_b32 s13, s7, 0xffff
  s_mov_b32 s14, {records}
  s_mov_b32 s15, 0x00027000
  v_mov_b32 v9, 0xdeadbeef
"""


def test_buffer_load_dword_lds_writes_lane_t_at_m0_plus_offset_plus_4t():
    # M0 = 32, voffset = 4t, offset:8: lane t reads in0 word t + 2 (in range while 4t + 12 <= 200, t <= 47) and
    # writes LDS word (32 + 8 + 4t) / 4 = 10 + t; lane 7 is off in EXEC.
    img = assemble(DESCRIPTOR.format(records=200) + """
  ds_write_b32 v1, v9
  ds_write_b32 v1, v9 offset:256
  s_waitcnt lgkmcnt(0)
  s_mov_b32 m0, 32
  s_mov_b32 exec_lo, 0xffffff7f
  buffer_load_dword v1, s[12:15], 0 offen offset:8 lds
  s_waitcnt vmcnt(0)
  s_mov_b64 exec, -1
  ds_read_b32 v4, v1
  ds_read_b32 v5, v1 offset:256
  s_waitcnt lgkmcnt(0)
""", "gfx942", lds=512)
    out, stats = run_lanes(img, IN)
    j = np.arange(128)
    t = j - 10
    want = np.where((t < 0) | (t >= 64) | (t == 7), DEAD, np.where(t <= 47, IN[np.clip(t + 2, 0, 319)], 0))
    np.testing.assert_array_equal(out, want.astype(np.uint32))
    assert stats.lds_conflicts == []


def test_gfx950_buffer_load_dwordx4_lds_writes_16_bytes_per_lane():
    # M0 = 64, voffset = 16t, offset:16: lane t reads in0 words 4t + 4 .. 4t + 7 (in range while 16t + 32 <= 976,
    # t <= 59) and writes LDS bytes 80 + 16t .. 80 + 16t + 15; lanes 3 and 50 are off in EXEC.
    img = assemble(DESCRIPTOR.format(records=976) + """
  ds_write_b32 v1, v9 offset:80
  ds_write_b32 v1, v9 offset:848
  s_waitcnt lgkmcnt(0)
  v_lshlrev_b32 v6, 2, v1
  s_mov_b32 m0, 64
  s_mov_b32 exec_lo, 0xfffffff7
  s_mov_b32 exec_hi, 0xfffbffff
  buffer_load_dwordx4 v6, s[12:15], 0 offen offset:16 lds
  s_waitcnt vmcnt(0)
  s_mov_b64 exec, -1
  ds_read_b32 v4, v1 offset:80
  ds_read_b32 v5, v1 offset:848
  s_waitcnt lgkmcnt(0)
""", "gfx950", lds=2048)
    out, _ = run_lanes(img, IN)
    word = np.concatenate([LANE, 192 + LANE])  # LDS words from byte 80 that v4 and v5 read
    src_lane = word // 4
    want = np.where(np.isin(src_lane, [3, 50]), DEAD, np.where(src_lane <= 59, IN[np.clip(word + 4, 0, 319)], 0))
    np.testing.assert_array_equal(out, want.astype(np.uint32))


TR16 = """
  v_lshlrev_b32 v6, 3, v0
  ds_write_b64 v6, v[2:3] offset:16
  s_waitcnt lgkmcnt(0)
  v_mul_u32_u24 v7, 5, v0
  v_and_b32 v7, 63, v7
  v_lshlrev_b32 v7, 3, v7
{exec}
  ds_read_b64_tr_b16 v[4:5], v7 offset:16
  s_waitcnt lgkmcnt(0)
  s_mov_b64 exec, -1
"""


def _tr16_sources():
    # lane t wrote (in0[t], in1[t]) at LDS byte 16 + 8t; lane s reads the 8 bytes at 16 + 8 * (5s mod 64), i.e.
    # the four halfwords of (in0[p], in1[p]), p = 5s mod 64.
    in0 = (LANE * 0x00020002 + 0x00010000).astype(np.uint32)  # halfwords 2t (low), 2t + 1 (high)
    in1 = in0 + np.uint32(0x00800080)                          # halfwords 2t + 128, 2t + 129
    p = (5 * LANE) % 64
    halves = np.stack([in0[p] & 0xFFFF, in0[p] >> 16, in1[p] & 0xFFFF, in1[p] >> 16], axis=1)  # [source lane, 4]
    return in0, in1, halves


def test_gfx950_ds_read_b64_tr_b16_transposes_4x16_lanes():
    # CDNA4 ISA "MFMA Transpose Load from LDS": within each 16-lane group, destination lane l's halfword n is
    # source lane (l & ~15) + ((l >> 2) & 3) + 4n's halfword (l & 3).
    img = assemble(TR16.format(exec=""), "gfx950", lds=1024)
    in0, in1, halves = _tr16_sources()
    out, stats = run_lanes(img, in0, in1)
    h = np.array([[halves[(l & ~15) + ((l >> 2) & 3) + 4 * n, l & 3] for n in range(4)] for l in range(64)])
    np.testing.assert_array_equal(out[:64], (h[:, 0] | (h[:, 1] << 16)).astype(np.uint32))
    np.testing.assert_array_equal(out[64:], (h[:, 2] | (h[:, 3] << 16)).astype(np.uint32))
    assert stats.lds_conflicts == []


def test_gfx950_ds_read_b64_tr_b16_with_a_whole_group_off_and_a_partial_group_refused():
    img = assemble(TR16.format(exec="  v_mov_b32 v4, 7\n  v_mov_b32 v5, 9\n  s_mov_b32 exec_lo, 0xffff0000\n"),
                   "gfx950", lds=1024)
    in0, in1, halves = _tr16_sources()
    out, _ = run_lanes(img, in0, in1)
    np.testing.assert_array_equal(out[:16], np.full(16, 7, np.uint32))  # lanes 0-15 off: not written
    l = LANE[16:]
    h = np.array([[halves[(x & ~15) + ((x >> 2) & 3) + 4 * n, x & 3] for n in range(4)] for x in l])
    np.testing.assert_array_equal(out[16:64], (h[:, 0] | (h[:, 1] << 16)).astype(np.uint32))
    partial = assemble(TR16.format(exec="  s_mov_b32 exec_lo, 0xfffffffe\n"), "gfx950", lds=1024)
    with pytest.raises(emulate.EmulationError, match="ds_read_b64_tr_b16 with part of a 16-lane group off"):
        run_lanes(partial, in0, in1)
