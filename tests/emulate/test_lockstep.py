"""Waves executed in lockstep batches (loader/emulate/kernel.py): scalar branches the waves of a batch disagree on
(each wave follows its own path and rejoins), per-wave SGPRs across workgroups, s_barrier between diverged waves,
and the EXEC = 0 skip of a lane-only block. Expected values from the kernels' own arithmetic, per wave."""

from __future__ import annotations

import numpy as np
import pytest

from tests.emulate.asm import PROLOGUE, assemble, run_lanes

pytestmark = pytest.mark.cpu

# v4 -> out[group * 128 + tid], v5 -> out[256 + group * 128 + tid] (two waves per workgroup, up to two groups).
STORES = """
  s_mov_b64 exec, -1
  s_mul_i32 s13, s2, 512
  v_add_u32 v11, s13, v1
  global_store_dword v11, v4, s[4:5]
  global_store_dword v11, v5, s[4:5] offset:1024
"""
N_PROLOGUE = len(PROLOGUE.strip().splitlines())
N_STORES = len(STORES.strip().splitlines()) + 1  # + the s_endpgm assemble() appends

DIVERGE = """
  v_lshrrev_b32 v6, 6, v0
  v_readfirstlane_b32 s10, v6
  s_mov_b32 s11, 0
  s_add_u32 s12, s10, s2
  s_add_u32 s12, s12, 1
.Lloop:
  s_add_u32 s11, s11, s10
  s_add_u32 s11, s11, 1
  s_sub_u32 s12, s12, 1
  s_cmp_lg_u32 s12, 0
  s_cbranch_scc1 .Lloop
  s_cmp_eq_u32 s10, 0
  s_cbranch_scc0 .Lskip
  v_mov_b32 v8, 0
  v_mov_b32 v9, s11
  ds_write_b32 v8, v9
.Lskip:
  s_waitcnt lgkmcnt(0)
  s_barrier
  v_mov_b32 v8, 0
  ds_read_b32 v10, v8
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v4, s11
  v_add_u32 v4, v4, v10
  v_mov_b32 v5, v10
"""


@pytest.mark.parametrize("schedule", ["forward", "reverse"])
def test_waves_that_loop_a_different_number_of_times_rejoin_and_meet_at_the_barrier(schedule):
    # Wave k of workgroup g loops k + g + 1 times adding k + 1: s11 = (k + 1)(k + g + 1). Wave 0 alone publishes
    # its s11 (= g + 1) in LDS before the barrier; after it every wave reads it: v4 = s11 + g + 1, v5 = g + 1.
    img = assemble(DIVERGE + STORES, "gfx942", lds=64, store=False)
    inp = np.zeros(128, np.uint32)
    out, st = run_lanes(img, inp, inp, block=128, grid=2, out_words=512, schedule=schedule)
    want4, want5 = np.empty(256, np.uint32), np.empty(256, np.uint32)
    count = 0
    for g in range(2):
        for k in range(2):
            s11 = (k + 1) * (k + g + 1)
            want4[g * 128 + 64 * k:g * 128 + 64 * (k + 1)] = s11 + g + 1
            want5[g * 128 + 64 * k:g * 128 + 64 * (k + 1)] = g + 1
            # per wave: prologue, 5 before the loop, 5 per trip, 2 compares/branch, 3 for wave 0 only, 8 after
            count += N_PROLOGUE + 5 + 5 * (k + g + 1) + 2 + (3 if k == 0 else 0) + 8 + N_STORES
    np.testing.assert_array_equal(out[:256], want4)
    np.testing.assert_array_equal(out[256:], want5)
    assert st.lds_conflicts == [] and st.waves == 4 and st.workgroups == 2
    assert st.instructions == count


GUARD = """
  v_mov_b32 v4, 1
  s_mov_b32 s12, 1
  v_lshrrev_b32 v6, 6, v0
  v_cmp_eq_u32 vcc, 0, v6
  s_and_saveexec_b64 s[10:11], vcc
  s_cbranch_execz .Ldone
{body}
.Ldone:
  s_or_b64 exec, exec, s[10:11]
  v_mov_b32 v5, s12
"""


def test_an_execz_skip_over_lane_only_code_counts_only_the_waves_that_run_it():
    # Only wave 0 has lanes in the block; wave 1 skips its 2 instructions (not counted for it).
    body = "  v_mov_b32 v4, 7\n  v_add_u32 v4, v4, v6\n"
    img = assemble(GUARD.format(body=body) + STORES, "gfx942", store=False)
    inp = np.zeros(128, np.uint32)
    out, st = run_lanes(img, inp, inp, block=128, out_words=512)
    np.testing.assert_array_equal(out[:128], np.repeat([7, 1], 64))
    common = N_PROLOGUE + 6 + 2 + N_STORES
    assert st.instructions == 2 * common + 2


def test_a_skipped_block_with_a_scalar_write_runs_only_for_the_waves_that_enter_it():
    # s_mov_b32 s12, 5 inside the block: wave 0 (lanes in the block) sees 5 after the join, wave 1 keeps 1.
    body = "  s_mov_b32 s12, 5\n  v_mov_b32 v4, 7\n"
    img = assemble(GUARD.format(body=body) + STORES, "gfx942", store=False)
    inp = np.zeros(128, np.uint32)
    out, st = run_lanes(img, inp, inp, block=128, out_words=512)
    np.testing.assert_array_equal(out[:128], np.repeat([7, 1], 64))
    np.testing.assert_array_equal(out[256:384], np.repeat([5, 1], 64))
    assert st.instructions == 2 * (N_PROLOGUE + 6 + 2 + N_STORES) + 2


def test_s_buffer_load_with_a_constant_offset_reads_per_wave_within_num_records():
    # A V# over in0 with num_records = 16 bytes: offset 8 reads in0[2]; offset 16 lies past it and reads 0.
    body = """
  s_mov_b32 s12, s6
  s_and_b32 s13, s7, 0xffff
  s_mov_b32 s14, 16
  s_mov_b32 s15, 0x00027000
  s_buffer_load_dword s20, s[12:15], 0x8
  s_buffer_load_dword s21, s[12:15], 0x10
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v4, s20
  v_mov_b32 v5, s21
"""
    img = assemble(body + STORES, "gfx942", store=False)
    inp = (np.arange(128) * 3 + 11).astype(np.uint32)
    out, _ = run_lanes(img, inp, inp, block=128, out_words=512)
    np.testing.assert_array_equal(out[:128], np.full(128, inp[2]))
    np.testing.assert_array_equal(out[256:384], np.zeros(128, np.uint32))


def test_a_launch_of_more_waves_than_one_batch_runs_every_workgroup():
    # 300 one-wave workgroups (more than kernel.MAX_BATCH_WAVES): each writes its workgroup id to its 64 words.
    body = """
  s_mul_i32 s13, s2, 256
  v_add_u32 v11, s13, v1
  v_mov_b32 v4, s2
  global_store_dword v11, v4, s[4:5]
"""
    from flyship.loader.emulate import kernel
    groups = kernel.MAX_BATCH_WAVES + 44
    img = assemble(body, "gfx942", store=False)
    out, st = run_lanes(img, np.zeros(64, np.uint32), grid=groups, out_words=64 * groups)
    np.testing.assert_array_equal(out, np.repeat(np.arange(groups), 64))
    assert st.waves == groups and st.workgroups == groups
