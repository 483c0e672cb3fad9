"""Memory on the emulated device: buffer resource descriptors (sizes, num_records bounds), global accesses inside
and outside the launch's regions, LDS and its race record. Expected values from the ISA text."""

from __future__ import annotations

import numpy as np
import pytest

from flyship.loader import emulate
from tests.emulate.asm import assemble, run_lanes

pytestmark = pytest.mark.cpu
LANE = np.arange(64)
IN = (LANE * 0x01010101 + 0x10203040).astype(np.uint32)
FILL = 0xABABABAB

# s[12:15] = a raw buffer descriptor over `out` (stride 0) with num_records = s14 (set by each test).
DESCRIPTOR = """
  s_mov_b32 s12, s4
  s_and_b32 s13, s5, 0xffff
  s_mov_b32 s15, 0x00027000
"""


def buffer_kernel(body: str, num_records: int) -> bytes:
    return assemble(DESCRIPTOR + f"  s_mov_b32 s14, {num_records}\n" + body +
                    "  s_waitcnt vmcnt(0)\n", "gfx942", store=False)


@pytest.mark.parametrize("insn,nbytes", [("buffer_store_short", 2), ("buffer_store_byte", 1),
                                         ("buffer_store_dword", 4)])
def test_buffer_store_short_and_byte_write_only_their_bytes(insn, nbytes):
    img = buffer_kernel(f"  {insn} v2, v1, s[12:15], 0 offen\n", 512)
    out, _ = run_lanes(img, IN, out_init=FILL)
    got = out[:64].view(np.uint8).reshape(64, 4)
    want = np.full((64, 4), 0xAB, np.uint8)
    want[:, :nbytes] = IN.view(np.uint8).reshape(64, 4)[:, :nbytes]
    np.testing.assert_array_equal(got, want)


def test_buffer_store_short_d16_hi_writes_the_high_half():
    img = buffer_kernel("  buffer_store_short_d16_hi v2, v1, s[12:15], 0 offen offset:2\n", 512)
    out, _ = run_lanes(img, IN, out_init=FILL)
    np.testing.assert_array_equal(out[:64] >> 16, IN >> 16)
    np.testing.assert_array_equal(out[:64] & 0xFFFF, np.full(64, 0xABAB))


def test_buffer_store_past_num_records_is_dropped_and_load_reads_zero():
    # num_records = 100 bytes: lanes whose dword ends past byte 100 (lane >= 25) neither store nor load.
    img = buffer_kernel("  buffer_store_dword v2, v1, s[12:15], 0 offen\n"
                        "  s_waitcnt vmcnt(0)\n"
                        "  buffer_load_dword v6, v1, s[12:15], 0 offen\n"
                        "  s_waitcnt vmcnt(0)\n"
                        "  s_mov_b64 exec, -1\n"
                        "  global_store_dword v1, v6, s[4:5] offset:256\n", 100)
    out, _ = run_lanes(img, IN, out_init=FILL)
    inside = LANE * 4 + 4 <= 100
    np.testing.assert_array_equal(out[:64], np.where(inside, IN, FILL))
    np.testing.assert_array_equal(out[64:], np.where(inside, IN, 0))


def test_buffer_soffset_and_offset_add_to_the_address():
    img = buffer_kernel("  s_mov_b32 s16, 8\n  buffer_store_dword v2, v1, s[12:15], s16 offen offset:4\n", 512)
    out, _ = run_lanes(img, IN, out_init=FILL)
    assert (out[:3] == FILL).all()
    np.testing.assert_array_equal(out[3:64], IN[:61])


def test_a_global_store_outside_every_region_is_refused_naming_address_instruction_and_region():
    img = assemble("  global_store_dword v1, v2, s[4:5] offset:1024\n  s_waitcnt vmcnt(0)\n", "gfx942")
    with pytest.raises(emulate.EmulationError) as e:
        run_lanes(img, IN)
    msg = str(e.value)
    assert e.value.kind == "EmulationError"
    assert "global_store_dword" in msg and "outside every region" in msg and "past the end of out" in msg
    assert " at 0x" in msg and "in k" in msg


def test_a_store_to_a_read_only_region_is_refused():
    img = assemble("  global_store_dword v1, v2, s[6:7]\n", "gfx942")
    with pytest.raises(emulate.EmulationError, match="writes read-only in0"):
        run_lanes(img, IN)


def test_global_load_ushort_and_sbyte_extend():
    img = assemble("  global_load_ushort v4, v1, s[6:7] offset:2\n  global_load_sbyte v5, v1, s[6:7] offset:3\n"
                   "  s_waitcnt vmcnt(0)\n", "gfx942")
    out, _ = run_lanes(img, IN)
    np.testing.assert_array_equal(out[:64], IN >> 16)
    np.testing.assert_array_equal(out[64:], ((IN >> 24).astype(np.int8)).astype(np.int32).view(np.uint32))


# Two waves (block 128): each stores v4 at out[tid] and v5 at out[128 + tid] (the shared EPILOGUE's offset:256
# would make wave 0's v5 and wave 1's v4 race on out[64:128], a global-memory race the hardware does not order).
LDS_RACE = """
  v_lshrrev_b32 v6, 6, v0
  v_mov_b32 v7, 0
  ds_write_b32 v7, v6
  s_waitcnt lgkmcnt(0)
  s_barrier
  ds_read_b32 v4, v7
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v5, v6
  s_mov_b64 exec, -1
  global_store_dword v1, v4, s[4:5]
  global_store_dword v1, v5, s[4:5] offset:512
"""


def test_an_lds_race_shows_in_the_two_schedules_and_in_the_conflict_record():
    # Both waves write LDS[0] (their wave index) before the barrier: whichever runs last wins.
    img = assemble(LDS_RACE, "gfx942", lds=64, store=False)
    fwd, st = run_lanes(img, np.r_[IN, IN], np.r_[IN, IN], block=128, out_words=256, schedule="forward")
    rev, _ = run_lanes(img, np.r_[IN, IN], np.r_[IN, IN], block=128, out_words=256, schedule="reverse")
    assert (fwd[:128] == 1).all() and (rev[:128] == 0).all()
    assert st.lds_conflicts == [0, 1, 2, 3]


LDS_BROADCAST_RACE = """
  v_lshrrev_b32 v6, 6, v0
  v_mov_b32 v7, 0
  v_mov_b32 v8, 7
  v_cmp_eq_u32 vcc, 0, v6
  s_and_saveexec_b64 s[20:21], vcc
  ds_write_b32 v7, v8
  s_waitcnt lgkmcnt(0)
  s_or_b64 exec, exec, s[20:21]
  ds_read_b32 v4, v7
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v5, v6
  s_mov_b64 exec, -1
  global_store_dword v1, v4, s[4:5]
  global_store_dword v1, v5, s[4:5] offset:512
"""


def test_a_read_before_another_waves_write_shows_only_when_waves_take_whole_turns():
    # Wave 0 writes LDS[0] = 7 and every wave reads it with no barrier between. In lockstep the write (earlier in
    # program order) always lands first, so both lockstep orders read 7; the serial schedule runs the last wave's whole
    # turn first, which reads the 0 that was there, as hardware may. The conflict record names the bytes either way.
    img = assemble(LDS_BROADCAST_RACE, "gfx942", lds=64, store=False)
    for order in ("forward", "reverse"):
        out, st = run_lanes(img, np.r_[IN, IN], np.r_[IN, IN], block=128, out_words=256, schedule=order)
        assert (out[:128] == 7).all(), order
        assert st.lds_conflicts == [0, 1, 2, 3], order
    out, st = run_lanes(img, np.r_[IN, IN], np.r_[IN, IN], block=128, out_words=256, schedule="serial")
    np.testing.assert_array_equal(out[:128], np.repeat([7, 0], 64))
    np.testing.assert_array_equal(out[128:], np.repeat([0, 1], 64))
    assert st.lds_conflicts == [0, 1, 2, 3]


def test_lds_writes_by_one_wave_read_after_a_barrier_are_no_conflict():
    img = assemble(LDS_RACE.replace("v_mov_b32 v7, 0", "v_lshlrev_b32 v7, 2, v6"), "gfx942", lds=64, store=False)
    out, st = run_lanes(img, np.r_[IN, IN], np.r_[IN, IN], block=128, out_words=256)
    np.testing.assert_array_equal(out[:128], np.repeat([0, 1], 64))
    assert st.lds_conflicts == []


def test_lds_access_past_the_allocation_is_refused():
    img = assemble("  ds_write_b32 v1, v2 offset:64\n  s_waitcnt lgkmcnt(0)\n", "gfx942", lds=128)
    with pytest.raises(emulate.EmulationError, match="past the workgroup's 128-byte allocation"):
        run_lanes(img, IN)


def test_ds_read2st64_and_write_b64_round_trip():
    img = assemble("""
  v_lshlrev_b32 v8, 3, v0
  v_mov_b32 v6, v2
  v_mov_b32 v7, v3
  ds_write_b64 v8, v[6:7]
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v9, 0
  ds_read2st64_b32 v[4:5], v1 offset1:1
  s_waitcnt lgkmcnt(0)
""", "gfx942", lds=1024)
    out, _ = run_lanes(img, IN, IN + 5)
    words = np.empty(256, np.uint32)
    words[0:128:2], words[1:128:2] = IN, IN + 5
    np.testing.assert_array_equal(out[:64], words[LANE])
    np.testing.assert_array_equal(out[64:], words[LANE + 64])


def test_global_atomics_from_every_lane_to_one_address_all_land():
    # 64 lanes add (1.0, 0.5) as packed bf16 to out[0] and 1.0f to out[1] with atomics: 64.0 / 32.0 / 64.0.
    img = assemble("""
  v_mov_b32 v6, 0
  v_mov_b32 v7, 0x3f003f80
  v_mov_b32 v8, 1.0
  global_atomic_pk_add_bf16 v6, v7, s[4:5]
  global_atomic_add_f32 v6, v8, s[4:5] offset:4
  s_waitcnt vmcnt(0)
""", "gfx942", store=False)
    out, _ = run_lanes(img, IN)
    assert out[0] == (0x4280 | (0x4200 << 16))  # bf16 64.0 low, 32.0 high
    assert out[1:2].view(np.float32)[0] == 64.0


def test_memory_regions_that_overlap_merge_writable_if_either_is():
    buf = np.zeros(64, np.uint32)
    mem = emulate.Memory()
    mem.add(buf.ctypes.data, 128, writable=False, name="x")
    mem.add(buf.ctypes.data + 64, 192, writable=True, name="out")
    (r,) = mem.regions
    assert (r.address, r.nbytes, r.writable, r.name) == (buf.ctypes.data, 256, True, "out+x")
    with pytest.raises(emulate.EmulationError, match="expected a positive address"):
        mem.add(0, 4, writable=True)
