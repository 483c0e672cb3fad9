"""A wave's architectural state and the readers/writers its instructions' operands compile to.

SGPRs live in a Python list of 32-bit ints (scalar code is int arithmetic); VGPRs and AGPRs in one numpy array
``V[512, 64]`` of uint32 (AGPR ``aN`` is row ``256 + N``), one column per lane. Special scalar registers use their
GFX9 operand codes as list indices: ``vcc`` = 106/107, ``m0`` = 124, ``exec`` = 126/127. Every vector write is
masked by EXEC (``Wave.mask``, recomputed whenever EXEC is written).
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
    """One wavefront: registers, SCC, EXEC mask, its workgroup's LDS."""

    __slots__ = ("s", "V", "scc", "mask", "full", "lds", "group", "index", "pc", "done", "mem")

    def __init__(self, lds, group: tuple[int, int, int], index: int, mem) -> None:
        self.s = [0] * NUM_SGPR_SLOTS
        self.V = np.zeros((2 * AGPR_BASE, LANES), np.uint32)
        self.scc = 0
        self.lds = lds
        self.group = group
        self.index = index
        self.pc = 0
        self.done = False
        self.mem = mem
        self.set_exec((1 << LANES) - 1)

    def set_exec(self, value: int) -> None:
        value &= (1 << 64) - 1
        self.s[EXEC] = value & 0xFFFFFFFF
        self.s[EXEC + 1] = value >> 32
        self.mask = np.unpackbits(np.array([value], np.uint64).view(np.uint8), bitorder="little").view(np.bool_)
        self.full = value == (1 << 64) - 1

    def sync_exec(self) -> None:
        """Recompute the lane mask after a write to exec_lo / exec_hi."""
        self.set_exec(self.s[EXEC] | (self.s[EXEC + 1] << 32))

    def lanemask(self, index: int) -> np.ndarray:
        """The 64-bit scalar pair at ``index`` (VCC, an SGPR pair) as a per-lane bool array."""
        words = np.array((self.s[index], self.s[index + 1]), np.uint32)
        return np.unpackbits(words.view(np.uint8), bitorder="little").view(np.bool_)


def pack_mask(bits: np.ndarray) -> int:
    """A per-lane bool array as a 64-bit int (lane i = bit i)."""
    return int(np.packbits(bits, bitorder="little").view(np.uint64)[0])


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
        return lambda w: np.uint32(w.s[idx])
    return lambda w: np.uint64(w.s[idx] | (w.s[idx + 1] << 32))


def _vreg_reader(row: int, n: int) -> Reader:
    if n == 1:
        return lambda w: w.V[row]
    return lambda w: w.V[row].astype(np.uint64) | (w.V[row + 1].astype(np.uint64) << np.uint64(32))


def src(tok: str, kind: str, bits: int, where: str) -> Reader:
    """A vector instruction's source operand: a function of the wave returning uint32 (bits <= 32) or uint64
    values, per lane (an array) or uniform (a numpy scalar). Float modifiers ``-x`` / ``|x|`` flip / clear the
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


def write_s(w: Wave, idx: int, n: int, value: int) -> None:
    """Write ``n`` SGPRs from an int; EXEC's mask follows a write to exec."""
    for i in range(n):
        w.s[idx + i] = (value >> (32 * i)) & 0xFFFFFFFF
    if idx <= EXEC + 1 and idx + n > EXEC:
        w.sync_exec()
