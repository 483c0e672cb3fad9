"""Direct-to-LDS buffer loads and the CDNA4 LDS transpose reads. Expected values from the ISA text: CDNA3/CDNA4 ISA
"Memory Buffer Load to LDS": the memory address is the buffer's usual one (inst_offset included, num_records bounds:
out of range reads 0), lane t writes its data to LDS at M0 + inst_offset + t * 4 (t * 16 for gfx950's dwordx4);
no VGPR is written; lanes off in EXEC write nothing."""

from __future__ import annotations

import numpy as np
import pytest

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
