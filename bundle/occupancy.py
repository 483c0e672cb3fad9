"""The occupancy a kernel can reach, from its registers and LDS / shared memory and the documented per-target
limits. One table for both halves: ``flyc-build``'s summary and ``flyship inspect`` read it.

AMD (gfx942, gfx950): *waves per SIMD*, the smallest of the limits set by the hardware, the VGPRs (arch
VGPRs and AGPRs share one file), the SGPRs and the LDS. NVIDIA (sm_90): *blocks per SM*, the smallest of the
limits set by the hardware (blocks and warps), the registers and the shared memory. Figures are per target
and cite where they come from; a target not in the tables gives None (shown as "n/a"). Scratch (private
segment) memory does not limit occupancy in this model; occupancy is what the resources allow, not what a
launch reaches (a grid smaller than the device reaches less).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from flyship.bundle import expr as _expr
from flyship.bundle import targets as _targets
from flyship.bundle.model import Example, KernelMetadata, Variant


@dataclasses.dataclass(frozen=True)
class AmdLimits:
    """Per-CU resources of an AMD CDNA target.

    Attributes:
        max_waves_per_simd: waves one SIMD can hold.
        simds_per_cu: SIMDs (execution units) per compute unit.
        vgprs_per_simd: unified VGPR file per SIMD lane (arch VGPRs + AGPRs), registers.
        vgpr_granule: VGPR allocation granule, registers.
        sgprs_per_simd: SGPRs per SIMD.
        sgpr_granule: SGPR allocation granule.
        lds_per_cu: LDS bytes per compute unit.
        wavefront: work-items per wavefront.
    """

    max_waves_per_simd: int
    simds_per_cu: int
    vgprs_per_simd: int
    vgpr_granule: int
    sgprs_per_simd: int
    sgpr_granule: int
    lds_per_cu: int
    wavefront: int = 64


# Sources:
# * Waves per SIMD: LLVM AMDGPUBaseInfo.cpp getMaxWavesPerEU: 8 for targets with the gfx90a instructions
#   (gfx90a, gfx942, gfx950); AMD CDNA3 ISA reference guide, "Wave scheduling": 8 wave slots per SIMD.
# * VGPRs: LLVM AMDGPUUsage, "AMDGPU Processors" / "Register allocation": gfx90a and later CDNA have a unified
#   512-register file per SIMD lane shared by arch VGPRs and AGPRs, allocated in granules of 8; the AGPRs start
#   after the arch VGPRs rounded up to 4 (AMDGPUUsage, `.amdhsa_accum_offset`), and the code-object metadata's
#   `.vgpr_count` counts both (LLVM test CodeGen/AMDGPU/agpr-register-count.ll: 9 arch VGPRs + 32 AGPRs give
#   `.vgpr_count` 44 and `.agpr_count` 32 on gfx90a).
# * SGPRs: LLVM AMDGPUBaseInfo.cpp getTotalNumSGPRs (800 on GFX8+) and getSGPRAllocGranule (16).
# * LDS: AMD CDNA3 ISA, "Local data share": 64 KiB per CU (gfx942); AMD CDNA4 ISA: 160 KiB per CU (gfx950);
#   LLVM AMDGPUUsage lists the same LDS sizes.
# * 4 SIMDs per CU: CDNA3 ISA, "Compute unit".
AMD: dict[str, AmdLimits] = {
    "gfx942": AmdLimits(max_waves_per_simd=8, simds_per_cu=4, vgprs_per_simd=512, vgpr_granule=8,
                        sgprs_per_simd=800, sgpr_granule=16, lds_per_cu=64 * 1024),
    "gfx950": AmdLimits(max_waves_per_simd=8, simds_per_cu=4, vgprs_per_simd=512, vgpr_granule=8,
                        sgprs_per_simd=800, sgpr_granule=16, lds_per_cu=160 * 1024),
}


@dataclasses.dataclass(frozen=True)
class NvLimits:
    """Per-SM resources of an NVIDIA target.

    Attributes:
        max_blocks_per_sm: resident blocks per SM.
        max_warps_per_sm: resident warps per SM.
        registers_per_sm: 32-bit registers per SM.
        register_unit: registers are allocated per warp in units of this many.
        max_registers_per_thread: the most a thread may use.
        shared_per_sm: shared memory per SM usable by blocks, bytes.
        shared_unit: shared memory allocation unit, bytes.
        reserved_shared_per_block: shared memory the CUDA runtime reserves for each block, bytes.
    """

    max_blocks_per_sm: int
    max_warps_per_sm: int
    registers_per_sm: int
    register_unit: int
    max_registers_per_thread: int
    shared_per_sm: int
    shared_unit: int
    reserved_shared_per_block: int
    warp: int = 32


# Source: CUDA C++ Programming Guide, "Compute Capabilities", table "Technical Specifications per Compute
# Capability" (9.0: 32 blocks, 64 warps, 64K registers per SM, 255 per thread, 228 KB shared memory per SM,
# 1 KB reserved per block) and the CUDA occupancy calculator's 9.0 column (register allocation unit 256 per
# warp, shared memory allocation unit 128 bytes).
NVIDIA: dict[str, NvLimits] = {
    "sm_90": NvLimits(max_blocks_per_sm=32, max_warps_per_sm=64, registers_per_sm=65536, register_unit=256,
                      max_registers_per_thread=255, shared_per_sm=228 * 1024, shared_unit=128,
                      reserved_shared_per_block=1024),
}


@dataclasses.dataclass(frozen=True)
class Occupancy:
    """What one kernel can reach on one target.

    Attributes:
        value: waves per SIMD (AMD) or blocks per SM (NVIDIA); 0 when the kernel cannot run at all.
        unit: ``"waves/SIMD"`` or ``"blocks/SM"``.
        limited_by: the resource that sets ``value``: ``hardware``, ``VGPRs``, ``SGPRs``, ``LDS``,
            ``registers``, ``shared memory``, ``warps``.
        limits: every limit, resource -> value.
    """

    value: int
    unit: str
    limited_by: str
    limits: dict[str, int]

    def __str__(self) -> str:
        return f"{self.value} {self.unit} ({self.limited_by})"


def _base(target: str) -> str:
    return _targets.parse_target(target).processor  # gfx942 for gfx942:sramecc+:xnack-; sm_90 for sm_90a


def occupancy(target: str, meta: KernelMetadata, block: tuple[int, int, int],
              dynamic_lds: int = 0) -> Optional[Occupancy]:
    """The occupancy a kernel reaches on ``target`` from its registers and LDS / shared memory.

    Args:
        target: the code object's target ID (``gfx942:sramecc+:xnack-``, ``sm_90a``).
        meta: the kernel's metadata (register counts, static LDS / shared memory).
        block: the launch's block, work-items (threads) in x, y, z.
        dynamic_lds: dynamic LDS / shared memory bytes of the launch.

    Returns:
        The :class:`Occupancy`, or None for a target not in the tables.
    """
    base = _base(target)
    threads = max(1, block[0] * block[1] * block[2])
    lds = meta.group_segment_fixed_size + dynamic_lds
    if base in AMD:
        return _amd(AMD[base], meta, threads, lds)
    if base in NVIDIA:
        return _nvidia(NVIDIA[base], meta, threads, lds)
    return None


def _pick(limits: dict[str, int], unit: str) -> Occupancy:
    name = min(limits, key=lambda k: (limits[k], k != "hardware"))
    return Occupancy(max(0, limits[name]), unit, name, limits)


def _amd(lim: AmdLimits, meta: KernelMetadata, threads: int, lds: int) -> Occupancy:
    limits = {"hardware": lim.max_waves_per_simd}
    # Unified register file. On these targets the metadata's .vgpr_count is already the total (the arch VGPRs
    # rounded up to 4, then the AGPRs: LLVM's createTotalNumVGPR; .agpr_count is the AGPR part of it, shown by
    # `flyship inspect` but not added again). The total is allocated in granules.
    vgprs = meta.vgpr_count
    if vgprs:
        limits["VGPRs"] = lim.vgprs_per_simd // (math.ceil(vgprs / lim.vgpr_granule) * lim.vgpr_granule)
    if meta.sgpr_count:
        limits["SGPRs"] = lim.sgprs_per_simd // (math.ceil(meta.sgpr_count / lim.sgpr_granule) * lim.sgpr_granule)
    if lds:
        # Workgroups that fit in one CU's LDS, their waves spread over the CU's SIMDs.
        groups = lim.lds_per_cu // lds
        waves = groups * math.ceil(threads / (meta.wavefront_size or lim.wavefront))
        limits["LDS"] = 0 if groups == 0 else max(1, waves // lim.simds_per_cu)
    return _pick(limits, "waves/SIMD")


def _nvidia(lim: NvLimits, meta: KernelMetadata, threads: int, shared: int) -> Occupancy:
    warps = math.ceil(threads / lim.warp)
    limits = {"hardware": lim.max_blocks_per_sm, "warps": lim.max_warps_per_sm // warps}
    if meta.vgpr_count:
        per_warp = math.ceil(meta.vgpr_count * lim.warp / lim.register_unit) * lim.register_unit
        limits["registers"] = (lim.registers_per_sm // per_warp) // warps
    if shared:
        per_block = math.ceil((shared + lim.reserved_shared_per_block) / lim.shared_unit) * lim.shared_unit
        limits["shared memory"] = lim.shared_per_sm // per_block
    return _pick(limits, "blocks/SM")


def example_dynamic_lds(variant: Variant, example: Example) -> int:
    """The variant's dynamic LDS / shared memory bytes for its specialization's example call (0 if the
    expression cannot be evaluated there)."""
    try:
        return _expr.evaluate_with_shapes(variant.launch.dynamic_lds, example.shapes,
                                          {k: v for k, v in example.scalars.items() if isinstance(v, int)})
    except Exception:  # noqa: BLE001 - an expression over inputs the example lacks: no dynamic LDS figure
        return 0


def for_variant(variant: Variant, example: Example) -> Optional[Occupancy]:
    """:func:`occupancy` of a manifest variant, with its launch block and the example call's dynamic LDS."""
    return occupancy(variant.target, variant.metadata, variant.launch.block, example_dynamic_lds(variant, example))
