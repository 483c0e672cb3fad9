"""The architectural state of a batch of waves executed in lockstep, and the readers/writers its instructions'
operands compile to.

Every instruction runs once for the whole batch: SGPRs are numpy vectors with one entry per wave (``s[128, n]``,
32-bit values in uint64, so scalar carries and 64-bit pairs need no Python ints); VGPRs and AGPRs one numpy array
``V[512, n, 64]`` of uint32 (AGPR ``aN`` is row ``256 + N``), one column per lane. Special scalar registers use their
GFX9 operand codes as row indices: ``vcc`` = 106/107, ``m0`` = 124, ``exec`` = 126/127. Every vector write is
masked by EXEC and by the waves active at this PC (``Wave.mask``, recomputed whenever EXEC or ``act`` changes).
"""

from __future__ import annotations

import re
import struct
from typing import Callable

import numpy as np

from flyship.loader.emulate.errors import refuse

LANES = 64
VCC, M0, EXEC = 106, 124, 126
AGPR_BASE = 256
NUM_SGPR_SLOTS = 128
_BIT = np.uint64(1) << np.arange(LANES, dtype=np.uint64)
_SPECIAL = {"vcc": (VCC, 2), "vcc_lo": (VCC, 1), "vcc_hi": (VCC + 1, 1), "exec": (EXEC, 2), "exec_lo": (EXEC, 1),
            "exec_hi": (EXEC + 1, 1), "m0": (M0, 1)}
_REG = re.compile(r"^([sva])(?:(\d+)|\[(\d+):(\d+)\])$")
# Inline float constants (ISA "Source operand encoding", 240-248): f16, f32, f64 bit patterns.
_FLOATS = {0.5: (0x3800, 0x3F000000), 1.0: (0x3C00, 0x3F800000), 2.0: (0x4000, 0x40000000),
           4.0: (0x4400, 0x40800000)}
_INV_2PI = (0x3118, 0x3E22F983, 0x3FC45F306DC9C882)


class Wave:
    """A batch of ``n`` wavefronts executed in lockstep: registers, SCC, EXEC masks, the LDS of their workgroups.

    ``V[512, n, 64]`` (uint32; ``VF`` is the same memory as ``[512, n * 64]``, for flat lane indices), ``s[128, n]``
    (uint64 holding 32-bit SGPR values), ``scc[n]``. ``act[n]`` marks the waves executing the current instruction
    (the others sit at other PCs, at a barrier, or ended); ``mask[n, 64]`` is EXEC & act, so a wave outside ``act``
    is neither read nor written by vector instructions, and scalar writes (``write_s``, ``write_scc``) skip it.
    """

    __slots__ = ("n", "V", "VF", "s", "scc", "mask", "full", "act", "all", "lds", "ids", "index", "mem", "phantom", "lm")

    def __init__(self, n: int, lds, index: np.ndarray, mem) -> None:
        self.n = n
        self.V = np.zeros((2 * AGPR_BASE, n, LANES), np.uint32)
        self.VF = self.V.reshape(2 * AGPR_BASE, n * LANES)
        self.s = np.zeros((NUM_SGPR_SLOTS, n), np.uint64)
        self.scc = np.zeros(n, np.uint64)
        self.lds = lds
        self.ids = np.arange(n)
        self.index = index  # the batch's wave ids for the LDS race record (unique per wave)
        self.mem = mem
        self.lm: dict[int, np.ndarray] = {}  # lanemask cache: SGPR pair index -> per-lane bools (never mutated)
        self.phantom = 0  # wave-instructions counted for the batch that waves with EXEC = 0 skip (execz_skip)
        self.act = np.ones(n, bool)
        self.all = True
        self.set_exec(np.uint64(M64))

    def set_act(self, act: np.ndarray) -> None:
        """Make ``act`` the waves that execute the next instructions."""
        self.act = act
        self.all = bool(act.all())
        self.sync_exec()

    def set_exec(self, value) -> None:
        value = np.asarray(value, np.uint64)
        write_s(self, EXEC, 2, value, sync=False)
        self.sync_exec()

    def sync_exec(self) -> None:
        """Recompute the lane mask after a write to exec (or to ``act``)."""
        bits = self.unpack(EXEC)  # not cached: exec is written often, and read through self.mask
        if not self.all:
            bits = bits & self.act[:, None]
        self.mask = bits
        self.full = self.all and bool(bits.all())

    def lanemask(self, index: int) -> np.ndarray:
        """The 64-bit scalar pair at ``index`` (VCC, an SGPR pair) as a per-lane bool array [n, 64] (shared with a
        cache until the pair is written: callers do not modify it)."""
        hit = self.lm.get(index)
        if hit is not None:
            return hit
        bits = self.unpack(index)
        self.lm[index] = bits
        return bits

    def unpack(self, index: int) -> np.ndarray:
        words = self.s[index:index + 2].T.astype(np.uint32, order="C")  # [n, 2]: low, high dword
        return np.unpackbits(words.view(np.uint8), axis=1, bitorder="little").view(np.bool_)


M64 = (1 << 64) - 1
M32U = np.uint64(0xFFFFFFFF)


def pack_mask(bits: np.ndarray) -> np.ndarray:
    """A per-lane bool array [n, 64] as 64-bit values [n] (lane i = bit i)."""
    return np.packbits(np.ascontiguousarray(bits), axis=-1, bitorder="little").view(np.uint64).reshape(-1)


def parse_reg(tok: str) -> tuple[str, int, int] | None:
    """``v5`` -> ("v", 5, 1); ``s[2:3]`` -> ("s", 2, 2); ``a[0:15]`` -> ("a", 0, 16); ``vcc`` -> ("s", 106, 2)."""
    if tok in _SPECIAL:
        idx, n = _SPECIAL[tok]
        return "s", idx, n
    m = _REG.match(tok)
    if m is None:
        return None
    if m.group(2) is not None:
        return m.group(1), int(m.group(2)), 1
    lo, hi = int(m.group(3)), int(m.group(4))
    return m.group(1), lo, hi - lo + 1


def parse_const(tok: str, kind: str, bits: int) -> int | None:
    """An inline constant or literal as a ``bits``-wide bit pattern for an operand of ``kind`` ("f", "i", "u", "b").

    Integer inline constants are the integer's bits (also for a float operand); float inline constants take the
    operand's float format; a 32-bit literal for a 64-bit float operand is its high half (ISA "Literal constants").
    """
    t = tok
    if t.startswith("lit(") and t.endswith(")"):
        t = t[4:-1]
    mask = (1 << bits) - 1
    try:
        v = int(t, 0)
        if bits == 64 and kind == "f" and (v > 64 or v < -16):
            return (v & 0xFFFFFFFF) << 32
        return v & mask
    except ValueError:
        pass
    try:
        f = float(t)
    except ValueError:
        return None
    if abs(abs(f) - 0.15915494) < 1e-7:
        pat = _INV_2PI[{16: 0, 32: 1, 64: 2}[bits]]
        return pat
    if abs(f) in _FLOATS or f == 0.0:
        if bits == 64:
            return struct.unpack("<Q", struct.pack("<d", f))[0]
        if bits == 16:
            return int(np.float16(f).view(np.uint16))
        return struct.unpack("<I", struct.pack("<f", f))[0]
    return None


Reader = Callable[[Wave], object]


def _sreg_reader(idx: int, n: int) -> Reader:
    if n == 1:
        return lambda w: w.s[idx].astype(np.uint32)[:, None]
    return lambda w: (w.s[idx] | (w.s[idx + 1] << np.uint64(32)))[:, None]


def _vreg_reader(row: int, n: int) -> Reader:
    if n == 1:
        return lambda w: w.V[row]
    return lambda w: w.V[row].astype(np.uint64) | (w.V[row + 1].astype(np.uint64) << np.uint64(32))


def src(tok: str, kind: str, bits: int, where: str) -> Reader:
    """A vector instruction's source operand: a function of the wave batch returning uint32 (bits <= 32) or uint64
    values, per lane (an array [n, 64]), per wave (an SGPR: [n, 1]) or uniform (a numpy scalar). Float modifiers ``-x`` / ``|x|`` flip / clear the
    sign bit of the operand's float format."""
    neg = absv = False
    t = tok
    if t.startswith("-") and not t[1:2].isdigit():
        neg, t = True, t[1:]
    if t.startswith("|") and t.endswith("|"):
        absv, t = True, t[1:-1]
    if t.startswith("neg(") or t.startswith("abs(") or t.startswith("sext("):
        raise refuse(f"operand {tok!r} of `{where}`: SDWA/explicit modifier syntax is not modelled")
    base = _base_reader(t, kind, bits, where)
    if not (neg or absv):
        return base
    width = 16 if bits == 16 else bits
    dtype = np.uint64 if bits == 64 else np.uint32
    sign = dtype(1 << (width - 1))
    notsign = dtype(((1 << (64 if bits == 64 else 32)) - 1) ^ (1 << (width - 1)))

    def mod(w: Wave) -> object:
        x = base(w)
        if absv:
            x = x & notsign
        if neg:
            x = x ^ sign
        return x
    return mod


def _base_reader(t: str, kind: str, bits: int, where: str) -> Reader:
    r = parse_reg(t)
    wide = bits == 64
    if r is not None:
        file, idx, n = r
        if file == "s":
            return _sreg_reader(idx, 2 if wide else 1)
        return _vreg_reader(idx + (AGPR_BASE if file == "a" else 0), 2 if wide else 1)
    c = parse_const(t, kind, 64 if wide else (16 if bits == 16 else 32))
    if c is None:
        raise refuse(f"operand {t!r} of `{where}` is not a register or constant the emulator models")
    if bits == 16 and kind != "f":
        c &= 0xFFFF
    value = np.uint64(c) if wide else np.uint32(c & 0xFFFFFFFF)
    return lambda w: value


def vdst(tok: str, where: str) -> tuple[int, int]:
    """A vector destination's (row in V, register count)."""
    r = parse_reg(tok)
    if r is None or r[0] == "s":
        raise refuse(f"destination {tok!r} of `{where}`: expected a VGPR or AGPR")
    return r[1] + (AGPR_BASE if r[0] == "a" else 0), r[2]


def sreg(tok: str, where: str) -> tuple[int, int]:
    """A scalar register operand's (index, count)."""
    r = parse_reg(tok)
    if r is None or r[0] != "s":
        raise refuse(f"operand {tok!r} of `{where}`: expected a scalar register")
    return r[1], r[2]


def write_v(w: Wave, row: int, value: np.ndarray) -> None:
    """Write one 32-bit VGPR under EXEC."""
    if w.full:
        w.V[row] = value
    else:
        np.copyto(w.V[row], value, where=w.mask, casting="unsafe")


def write_v64(w: Wave, row: int, value: np.ndarray) -> None:
    """Write a 64-bit VGPR pair under EXEC."""
    value = np.asarray(value, np.uint64)
    write_v(w, row, (value & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    write_v(w, row + 1, (value >> np.uint64(32)).astype(np.uint32))


def write_s(w: Wave, idx: int, n: int, value, sync: bool = True) -> None:
    """Write ``n`` SGPRs of the active waves from a value per wave (uint64 array [n] or a scalar); EXEC's mask
    follows a write to exec. A one-register value is already a 32-bit value (every 32-bit result is)."""
    s = w.s
    lm = w.lm
    if lm and (idx in lm or idx - 1 in lm or (n > 1 and idx + 1 in lm)):
        forget(w, idx, n)
    if n == 1:
        if w.all:
            s[idx] = value
        else:
            np.copyto(s[idx], value, where=w.act, casting="unsafe")
    elif n:
        if type(value) is np.ndarray and value.dtype == np.uint64 and value.shape == (w.n,):
            halves = value.view(np.uint32).reshape(w.n, 2)  # little-endian: [:, 0] low, [:, 1] high dword
            parts = [halves[:, i] for i in range(2)] + [(value >> np.uint64(32 * i)) & M32U for i in range(2, n)]
        else:
            v = int(value) if np.ndim(value) == 0 else np.asarray(value, np.uint64)
            parts = [(v >> (32 * i)) & 0xFFFFFFFF if isinstance(v, int) else (v >> np.uint64(32 * i)) & M32U
                     for i in range(n)]
        for i, part in enumerate(parts):
            if w.all:
                s[idx + i] = part
            else:
                np.copyto(s[idx + i], part, where=w.act, casting="unsafe")
    if sync and idx <= EXEC + 1 and idx + n > EXEC:
        w.sync_exec()


def forget(w: Wave, idx: int, n: int) -> None:
    """Drop the cached lane masks of pairs that overlap SGPRs [idx, idx + n)."""
    for k in [k for k in w.lm if idx - 1 <= k < idx + n]:
        del w.lm[k]


def write_scc(w: Wave, value) -> None:
    """Write SCC of the active waves."""
    if w.all:
        w.scc[:] = value
    else:
        np.copyto(w.scc, value, where=w.act, casting="unsafe")
