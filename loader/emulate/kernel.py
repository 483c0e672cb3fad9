"""Launch a kernel on the emulated device: read the kernel descriptor, lay out the kernarg segment with the hidden
arguments the HIP runtime fills, and run every wave of every workgroup.

Kernel descriptor (LLVM AMDGPUUsage, "Kernel Descriptor" and "Initial Kernel Execution State"): user SGPRs in the
order private segment buffer (4), dispatch ptr (2), queue ptr (2), kernarg segment ptr (2), dispatch id (2), flat
scratch init (2), private segment size (1), then preloaded kernarg dwords; then system SGPRs: workgroup id X, Y, Z,
workgroup info, private segment wave offset. Work-item ids are packed in v0 (X | Y << 10 | Z << 20; gfx90a and
later).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import time

import numpy as np

from flyship.bundle.codeobject import CodeObjectFile
from flyship.errors import BundleError, LoadError
from flyship.loader.emulate import decode
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.lds import Lds
from flyship.loader.emulate.memory import Memory
from flyship.loader.emulate.program import Program, program
from flyship.loader.emulate.scalar import END
from flyship.loader.emulate.state import LANES, Wave

MODELLED_TARGETS = ("gfx90a", "gfx942", "gfx950")
DEFAULT_MAX_INSTRUCTIONS = 50_000_000
_HIDDEN_U32 = {"hidden_block_count_x": 0, "hidden_block_count_y": 1, "hidden_block_count_z": 2}
_HIDDEN_U16 = {"hidden_group_size_x": 0, "hidden_group_size_y": 1, "hidden_group_size_z": 2}
_HIDDEN_ZERO = {"hidden_remainder_x", "hidden_remainder_y", "hidden_remainder_z", "hidden_global_offset_x",
                "hidden_global_offset_y", "hidden_global_offset_z", "hidden_none", "hidden_printf_buffer",
                "hidden_hostcall_buffer", "hidden_default_queue", "hidden_completion_action",
                "hidden_multigrid_sync_arg", "hidden_heap_v1", "hidden_queue_ptr", "hidden_private_base",
                "hidden_shared_base", "hidden_multigrid_sync_arg"}


@dataclasses.dataclass
class RunStats:
    """What an emulated launch executed.

    Attributes:
        instructions: dynamic wave-instructions executed (one per wave per instruction).
        waves: waves run.
        workgroups: workgroups run.
        seconds: wall time of the run.
        cpu_seconds: CPU time of this process during the run (on a shared machine, the per-core cost).
        lds_conflicts: LDS byte addresses one wave wrote (or read) while another wave wrote (or read, for a write)
            with no barrier between; sorted.
        refused_unreached: mnemonics the kernel holds that the emulator does not model but no wave reached.
    """

    instructions: int = 0
    waves: int = 0
    workgroups: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    lds_conflicts: list[int] = dataclasses.field(default_factory=list)
    refused_unreached: list[str] = dataclasses.field(default_factory=list)

    @property
    def rate(self) -> float:
        """Emulated wave-instructions per second."""
        return self.instructions / self.seconds if self.seconds > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Descriptor:
    group_segment: int
    private_segment: int
    kernarg_size: int
    rsrc1: int
    rsrc2: int
    properties: int
    preload: int
    entry: int

    @property
    def denorm32(self) -> int:
        return (self.rsrc1 >> 16) & 3

    @property
    def user_sgprs(self) -> int:
        return (self.rsrc2 >> 1) & 0x1F


def unbundle(image: bytes, target: str | None) -> bytes:
    """The ELF in ``image`` (itself, or the entry of a clang offload bundle for ``target`` / its only AMDGPU one)."""
    magic = b"__CLANG_OFFLOAD_BUNDLE__"
    if not image.startswith(magic):
        return image
    try:
        (count,) = struct.unpack_from("<Q", image, len(magic))
        pos = len(magic) + 8
        entries = []
        for _ in range(min(count, 1024)):
            off, size, idlen = struct.unpack_from("<QQQ", image, pos)
            pos += 24
            if idlen > 4096 or pos + idlen > len(image) or off + size > len(image):
                raise struct.error(f"entry {len(entries)} lies past the {len(image)}-byte image")
            ident = image[pos:pos + idlen].decode()
            pos += idlen
            entries.append((ident, image[off:off + size]))
    except (struct.error, UnicodeDecodeError) as e:
        raise refuse(f"read offload bundle: malformed header ({e})") from None
    amd = [(i, b) for i, b in entries if "amdgcn" in i and b]
    if target is not None:
        amd = [(i, b) for i, b in amd if i.split("--")[-1].split(":")[0] == target.split(":")[0]]
    if len(amd) != 1:
        raise refuse(f"read offload bundle: expected one AMDGPU entry{' for ' + target if target else ''}, got "
                     f"{[i for i, _ in amd] or [i for i, _ in entries]}; pass target=")
    return amd[0][1]


def _descriptor(co: CodeObjectFile, symbol: str) -> Descriptor:
    kd = co.kernel_descriptor(symbol)
    return Descriptor(int(kd["group_segment_fixed_size"]), int(kd["private_segment_fixed_size"]),
                      int(kd["kernarg_size"]), int(kd["compute_pgm_rsrc1"]), int(kd["compute_pgm_rsrc2"]),
                      int(kd["kernel_code_properties"]), int(kd["kernarg_preload"]), int(kd["_entry"]))


def _check(d: Descriptor, target: str, symbol: str) -> None:
    if target.split(":")[0] not in MODELLED_TARGETS:
        raise refuse(f"kernel {symbol}: expected a code object for one of {MODELLED_TARGETS}, got {target}")
    if d.private_segment or (d.properties >> 11) & 1:
        raise refuse(f"kernel {symbol}: uses scratch (private segment {d.private_segment} bytes"
                     f"{', dynamic stack' if (d.properties >> 11) & 1 else ''}); scratch is not modelled")
    if (d.properties >> 10) & 1:
        raise refuse(f"kernel {symbol}: wave32 is not modelled (CDNA runs wave64)")
    if (d.rsrc2 >> 6) & 1:
        raise refuse(f"kernel {symbol}: enables the trap handler; traps are not modelled")


_info_cache: dict[tuple[str, str], tuple[Descriptor, dict, str]] = {}


def _kernel_info(elf: bytes, sha: str, symbol: str) -> tuple[Descriptor, dict, str]:
    """(kernel descriptor, metadata map, target) of ``symbol``, parsed once per code object sha256."""
    key = (sha, symbol)
    hit = _info_cache.get(key)
    if hit is None:
        try:
            co = CodeObjectFile(elf, f"<{symbol}>")
            hit = (_descriptor(co, symbol), co.kernel(symbol), co.target)
        except BundleError as e:
            raise refuse(f"kernel {symbol}: {e}") from e
        _info_cache[key] = hit
    return hit


def kernarg_segment(meta: dict, symbol: str, explicit: bytes, grid, block, dynamic_lds: int) -> bytearray:
    """Explicit argument bytes at their offsets, hidden arguments filled as the HIP runtime does (``meta``: the
    kernel's code object metadata map)."""
    size = max(int(meta.get(".kernarg_segment_size", 0)), len(explicit))
    seg = bytearray(size + 64)
    seg[:len(explicit)] = explicit
    for arg in meta.get(".args", []):
        kind, off, sz = arg.get(".value_kind", ""), int(arg.get(".offset", 0)), int(arg.get(".size", 0))
        if not kind.startswith("hidden_"):
            continue
        if kind in _HIDDEN_U32:
            struct.pack_into("<I", seg, off, grid[_HIDDEN_U32[kind]])
        elif kind in _HIDDEN_U16:
            struct.pack_into("<H", seg, off, block[_HIDDEN_U16[kind]])
        elif kind == "hidden_grid_dims":
            struct.pack_into("<H", seg, off, 3)
        elif kind == "hidden_dynamic_lds_size":
            struct.pack_into("<I", seg, off, dynamic_lds)
        elif kind in _HIDDEN_ZERO:
            seg[off:off + sz] = bytes(sz)
        else:
            raise refuse(f"kernel {symbol}: hidden argument {kind} is not modelled")
    return seg


def _initial_sgprs(d: Descriptor, kernarg_addr: int, dispatch_addr: int, kernargs: bytes, symbol: str) -> list:
    """(index, value) for the user SGPRs; the system SGPRs follow at the returned next index."""
    vals: list[int] = []
    p = d.properties
    if p & 1:
        vals += [0, 0, 0, 0]  # private segment buffer: no scratch (num_records 0)
    if p & 2:
        vals += [dispatch_addr & 0xFFFFFFFF, dispatch_addr >> 32]
    if p & 4:
        vals += [0, 0]  # queue ptr: no queue; a read of it is refused (address 0 lies in no region)
    if p & 8:
        vals += [kernarg_addr & 0xFFFFFFFF, kernarg_addr >> 32]
    if p & 16:
        vals += [0, 0]
    if p & 32:
        raise refuse(f"kernel {symbol}: flat scratch init (scratch) is not modelled")
    if p & 64:
        vals += [0]
    n_preload, preload_off = d.preload & 0x7F, (d.preload >> 7) & 0x1FF
    for k in range(n_preload):
        o = 4 * (preload_off + k)
        vals.append(struct.unpack_from("<I", kernargs, o)[0] if o + 4 <= len(kernargs) else 0)
    if len(vals) > d.user_sgprs:
        raise refuse(f"kernel {symbol}: {len(vals)} user SGPRs enabled, USER_SGPR_COUNT is {d.user_sgprs}")
    return vals


def run_kernel(image: bytes, symbol: str, grid, block, dynamic_lds: int, kernargs: bytes, memory: Memory,
               schedule: str, target: str | None, max_instructions: int) -> RunStats:
    t0, c0 = time.perf_counter(), time.process_time()
    if schedule not in SCHEDULES:
        raise refuse(f"run: expected schedule one of {', '.join(SCHEDULES)}, got {schedule!r}")
    grid, block = tuple(int(g) for g in grid), tuple(int(b) for b in block)
    if len(grid) != 3 or len(block) != 3 or min(grid + block) < 1 or block[0] * block[1] * block[2] > 1024:
        raise refuse(f"run: expected 3 positive grid (workgroups) and block (work-items, at most 1024) extents, "
                     f"got grid {grid}, block {block}")
    elf = unbundle(bytes(image), target)
    sha = hashlib.sha256(elf).hexdigest()
    d, meta, arch = _kernel_info(elf, sha, symbol)
    _check(d, arch, symbol)
    prog = program(lambda: _instructions(elf, sha, symbol, d), sha, symbol, arch.split(":")[0], d.denorm32)

    seg = kernarg_segment(meta, symbol, kernargs, grid, block, dynamic_lds)
    kernarg_addr = memory.own(np.frombuffer(bytes(seg), np.uint8).copy(), writable=False,
                              name=f"kernarg segment of {symbol}")
    packet = np.zeros(64, np.uint8)
    struct.pack_into("<HHHHHHIIIII", packet, 0, 0, 3, block[0], block[1], block[2], 0, grid[0] * block[0],
                     grid[1] * block[1], grid[2] * block[2], 0, d.group_segment + dynamic_lds)
    struct.pack_into("<Q", packet, 40, kernarg_addr)
    dispatch_addr = memory.own(packet, writable=False, name="dispatch packet")
    user = _initial_sgprs(d, kernarg_addr, dispatch_addr, bytes(seg), symbol)
    stats = RunStats()
    nthreads = block[0] * block[1] * block[2]
    nwaves = (nthreads + LANES - 1) // LANES
    tid = np.arange(nwaves * LANES)
    wi = ((tid % block[0]) | (((tid // block[0]) % block[1]) << 10) | ((tid // (block[0] * block[1])) << 20))
    wi = wi.astype(np.uint32).reshape(nwaves, LANES)
    lds_bytes = d.group_segment + dynamic_lds
    conflicts: set[int] = set()
    budget = [max_instructions]
    groups = [(gx, gy, gz) for gz in range(grid[2]) for gy in range(grid[1]) for gx in range(grid[0])]
    per_batch = max(1, min(MAX_BATCH_WAVES // nwaves, MAX_BATCH_LDS // max(lds_bytes, 1)))
    for start in range(0, len(groups), per_batch):
        chunk = groups[start:start + per_batch]
        w = _batch(d, user, chunk, nwaves, nthreads, wi, lds_bytes, memory, schedule)
        # the hardware's float ops raise no exceptions: 1/0 is inf, inf-inf is NaN (numpy would warn)
        with np.errstate(all="ignore"):
            stats.instructions += _run_batch(prog, w, budget, max_instructions, schedule == "serial")
        conflicts |= w.lds.conflicts
        stats.waves += w.n
        stats.workgroups += len(chunk)
    stats.lds_conflicts = sorted(conflicts)
    stats.refused_unreached = sorted(prog.refused)
    stats.seconds = time.perf_counter() - t0
    stats.cpu_seconds = time.process_time() - c0
    return stats


def _instructions(elf: bytes, sha: str, symbol: str, d: Descriptor):
    funcs = decode.functions(elf, sha, symbol)
    insts = funcs.get(symbol)
    if not insts:
        raise refuse(f"kernel {symbol}: llvm-objdump found no code for it; functions: {sorted(funcs)}")
    if insts[0].address != d.entry:
        raise refuse(f"kernel {symbol}: the descriptor's entry 0x{d.entry:x} is not the symbol's first "
                     f"instruction 0x{insts[0].address:x}")
    return insts


def _batch(d: Descriptor, user: list, chunk: list, nwaves: int, nthreads: int, wi: np.ndarray, lds_bytes: int,
           memory: Memory, schedule: str) -> Wave:
    """The waves of the workgroups ``chunk`` as one lockstep batch, in ``schedule`` order (``reverse``: the last
    wave of the last workgroup first), with their initial registers."""
    entries = [(g, k) for g in range(len(chunk)) for k in range(nwaves)]
    if schedule in ("reverse", "serial"):
        entries.reverse()
    gi = np.array([g for g, _ in entries], np.int64)
    ki = np.array([k for _, k in entries], np.int64)
    w = Wave(len(entries), Lds(lds_bytes, len(chunk), gi), np.arange(len(entries)), memory)
    s = w.s
    for i, v in enumerate(user):
        s[i] = v
    k = d.user_sgprs
    ids = np.array(chunk, np.uint64)[gi]  # [waves, 3]
    for axis, bit in enumerate((7, 8, 9)):
        if (d.rsrc2 >> bit) & 1:
            s[k] = ids[:, axis]
            k += 1
    if (d.rsrc2 >> 10) & 1:
        raise refuse("workgroup info SGPR is not modelled")
    w.V[0] = wi[ki]
    active = np.minimum(LANES, nthreads - ki * LANES)
    w.set_exec(np.array([(1 << int(a)) - 1 for a in active], np.uint64))
    return w


def _run_batch(prog: Program, w: Wave, budget: list, limit: int, serial: bool = False) -> int:
    """Run a batch of waves in lockstep: every instruction executes once for all waves at the same PC (``w.act``).
    When a branch's waves disagree, the waves at the lowest PC run first and the others join them when their PCs
    meet (reconvergence); ``s_barrier`` holds a wave until no wave can run, then releases them all and starts a new
    LDS epoch (a workgroup's waves all wait there, or ended). ``serial``: one wave at a time instead, the first
    runnable in batch order running alone until it waits at a barrier or ends (the ``serial`` schedule: an order in
    which one wave's LDS writes land before or after another's whole turn, which lockstep never shows). Returns the
    wave-instructions executed."""
    ops = prog.ops
    n = w.n
    pcs = np.zeros(n, np.int64)
    done = np.zeros(n, bool)
    wait = np.zeros(n, bool)
    total = 0
    pc = 0
    stop = _NEVER  # the lowest PC of a runnable wave outside the active set: meeting it merges them
    nact = n
    if serial and n > 1:
        first = np.zeros(n, bool)
        first[0] = True
        w.set_act(first)
        nact = 1
    while True:
        steps = 0
        r = None
        try:
            while True:
                r = ops[pc](w)
                steps += 1
                if r is None:
                    pc += 1
                    if pc >= stop:
                        break
                elif type(r) is int and r >= 0:
                    pc = r
                    if steps * nact > budget[0]:
                        raise refuse(f"kernel {prog.symbol}: ran past {limit} wave-instructions (a loop that does "
                                     "not end?)")
                    if pc >= stop:
                        break
                else:
                    break
        except LoadError:
            raise
        except Exception as e:  # a bug of the emulator: name the instruction it ran
            raise refuse(f"{prog.where(pc)}: internal error {type(e).__name__}: {e}") from e
        act = w.act
        if r is None or (type(r) is int and r >= 0):
            pcs[act] = pc
        elif type(r) is int:
            if r == END:
                done |= act
            else:  # BARRIER
                wait |= act
                pcs[act] = pc + 1
        else:  # a branch the active waves disagree on: each wave's next PC
            pcs[act] = r[act]
        total += steps * nact
        budget[0] -= steps * nact
        runnable = ~done & ~wait
        if not runnable.any():
            if not wait.any():
                return total - w.phantom
            wait[:] = False  # every live wave waits at a barrier: release them
            w.lds.epoch += 1
            runnable = ~done
        if serial:
            act = np.zeros(n, bool)
            act[int(np.flatnonzero(runnable)[0])] = True
            stop = _NEVER
        else:
            act = runnable & (pcs == pcs[runnable].min())
            others = runnable & ~act
            stop = int(pcs[others].min()) if others.any() else _NEVER
        pc = int(pcs[act][0])
        nact = int(act.sum())
        w.set_act(act)


# forward / reverse: lockstep, the batch in wave order or last wave first; serial: one wave at a time (last first)
SCHEDULES = ("forward", "reverse", "serial")
_NEVER = 1 << 62
# A batch holds whole workgroups: at most this many waves (VGPRs: 128 KiB a wave) and LDS bytes (plus 16 bytes of
# race record per LDS byte).
MAX_BATCH_WAVES = 256
MAX_BATCH_LDS = 4 << 20
