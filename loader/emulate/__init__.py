"""flyship's CDNA emulator: execute AMD code objects (gfx942 = CDNA3, gfx950 = CDNA4, gfx90a) on the CPU.

Decoding is LLVM's (``llvm-objdump``); every instruction either executes with the ISA's semantics over the 64
lanes of a wave (numpy) or is refused by name (mnemonic, address, kernel), never skipped. Scratch, traps, GDS and
anything else not modelled are refused with the reason. Global memory is only the explicit regions of a
:class:`Memory`; LDS is per workgroup. The waves of a launch run in lockstep batches (one numpy call per instruction
for all waves at one PC; diverged waves rejoin, ``s_barrier`` waits for the workgroup); ``schedule`` orders the
waves within a batch, so two runs that disagree reveal an LDS race, which :attr:`RunStats.lds_conflicts` also
records (epoch-based, deterministic: see docs/emulator.md).

An emulated run proves what the code computes on these inputs, not timing, the memory model beyond in-order
LDS/global accesses, or hardware errata.
"""

from __future__ import annotations

from flyship.loader.emulate.errors import EmulationError
from flyship.loader.emulate.kernel import DEFAULT_MAX_INSTRUCTIONS, RunStats, run_kernel
from flyship.loader.emulate.memory import Memory

__all__ = ["EmulationError", "Memory", "RunStats", "run"]


def run(image: bytes, symbol: str, *, grid: tuple[int, int, int], block: tuple[int, int, int], dynamic_lds: int,
        kernargs: bytes, memory: Memory, schedule: str = "forward", target: str | None = None,
        max_instructions: int = DEFAULT_MAX_INSTRUCTIONS) -> RunStats:
    """Run one kernel launch on the emulated device.

    Args:
        image: a code object (ELF) or a clang offload bundle (its entry for ``target``, or its only AMDGPU entry).
        symbol: the kernel's symbol (its descriptor is ``<symbol>.kd``).
        grid: workgroups in X, Y, Z (as hipModuleLaunchKernel takes it).
        block: work-items per workgroup in X, Y, Z.
        dynamic_lds: bytes of dynamic LDS beyond the kernel's group segment.
        kernargs: the explicit kernel argument bytes (hidden arguments are filled as the HIP runtime does).
        memory: the global memory the kernel may touch.
        schedule: ``"forward"`` or ``"reverse"``: the order of the waves in the lockstep batch (whose write lands
            last where two waves write one address in one instruction); ``"serial"``: one wave at a time, last wave
            first, each alone until it waits at a barrier or ends (slow: a wave-instruction per step; it shows an
            LDS race that lockstep hides, a read of bytes another wave writes later in program order).
        target: the processor to pick from an offload bundle.
        max_instructions: refuse a launch that runs more wave-instructions than this (a loop that never ends).

    Returns:
        RunStats: instructions executed, waves, seconds, LDS conflicts.

    Raises:
        EmulationError (a LoadError of kind "EmulationError"): an instruction or feature not modelled (named), an
            access outside every memory region, a malformed code object.
    """
    return run_kernel(image, symbol, grid, block, dynamic_lds, kernargs, memory, schedule, target, max_instructions)
