"""Occupancy from registers and LDS / shared memory, against figures worked by hand from the documented limits."""

from __future__ import annotations

import pytest

from flyship.bundle import occupancy as occ
from flyship.bundle import targets
from flyship.bundle.manifest import KernelMetadata

pytestmark = pytest.mark.cpu


def meta(vgprs=0, sgprs=0, agprs=0, lds=0) -> KernelMetadata:
    return KernelMetadata(kernarg_segment_size=0, kernarg_segment_align=8, group_segment_fixed_size=lds,
                          private_segment_fixed_size=0, sgpr_count=sgprs, vgpr_count=vgprs, agpr_count=agprs,
                          wavefront_size=64, max_flat_workgroup_size=1024, reqd_workgroup_size=None, args=())


@pytest.mark.parametrize("vgprs, agprs, waves", [
    (12, 0, 8),     # the hardware's 8 slots
    (64, 0, 8),     # 512 / 64
    (65, 0, 7),     # 72 after the granule of 8: 512 // 72
    (128, 0, 4),
    (256, 0, 2),
    # With AGPRs, .vgpr_count is already the total (arch VGPRs rounded to 4, then the AGPRs), as LLVM writes it:
    (44, 32, 8),    # LLVM's agpr-register-count.ll on gfx90a: 9 arch + 32 AGPRs -> .vgpr_count 44 -> 48: 10, hw 8
    (260, 128, 1),  # 132 arch + 128 AGPRs -> 264: 512 // 264
    (256, 128, 2),  # 128 arch + 128 AGPRs: the AGPRs are not counted twice (that gave 1)
    (512, 256, 1),  # a kernel using the whole file runs one wave per SIMD (counting AGPRs twice gave 0)
    (512, 0, 1),
])
def test_gfx942_waves_per_simd_follow_the_unified_vgpr_file(vgprs, agprs, waves):
    got = occ.occupancy("gfx942:sramecc+:xnack-", meta(vgprs=vgprs, agprs=agprs, sgprs=16), (256, 1, 1))
    assert got.value == waves and got.unit == "waves/SIMD"


def test_sgprs_limit_waves_in_granules_of_16():
    got = occ.occupancy("gfx942", meta(vgprs=8, sgprs=102), (64, 1, 1))
    assert (got.value, got.limited_by) == (800 // 112, "SGPRs")


def test_lds_limits_waves_per_simd_through_the_workgroups_one_cu_holds():
    # 48 KiB per 256-work-item workgroup: one group of 4 waves per CU on gfx942 (64 KiB) -> 1 wave per SIMD;
    # gfx950's 160 KiB holds three -> 12 waves over 4 SIMDs -> 3.
    m = meta(vgprs=32, sgprs=32, lds=48 * 1024)
    assert occ.occupancy("gfx942", m, (256, 1, 1)).value == 1
    assert occ.occupancy("gfx950", m, (256, 1, 1)).value == 3
    assert occ.occupancy("gfx942", m, (256, 1, 1)).limited_by == "LDS"
    assert occ.occupancy("gfx942", meta(vgprs=32, lds=0), (256, 1, 1), dynamic_lds=80 * 1024).value == 0


def test_sm_90_blocks_per_sm_from_registers_and_shared_memory():
    # 167 registers: 5376 per warp after the unit of 256, 12 warps per SM, one block of 8 warps.
    got = occ.occupancy("sm_90a", meta(vgprs=167), (256, 1, 1), dynamic_lds=32768)
    assert (got.value, got.limited_by, got.unit) == (1, "registers", "blocks/SM")
    # 100 KB of shared memory (+1 KB reserved): two blocks in 228 KB.
    got = occ.occupancy("sm_90", meta(vgprs=32), (128, 1, 1), dynamic_lds=100 * 1024)
    assert (got.value, got.limited_by) == (2, "shared memory")
    assert occ.occupancy("sm_90", meta(vgprs=16), (32, 1, 1)).value == 32  # the 32-block hardware limit


def test_a_target_without_a_table_gives_none():
    assert occ.occupancy("gfx1100", meta(vgprs=8), (64, 1, 1)) is None
    assert occ.occupancy("sm_80", meta(vgprs=8), (64, 1, 1)) is None


def test_the_lds_per_cu_agrees_with_the_target_table():
    for name, lim in occ.AMD.items():
        assert lim.lds_per_cu == targets.AMD_PROCESSORS[name]["lds_bytes"]
