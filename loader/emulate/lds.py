"""LDS (ds_*) instructions on the workgroup's LDS, and the cross-lane ones that only use the LDS crossbar
(ds_swizzle_b32, ds_bpermute_b32, ds_permute_b32). Addresses past the LDS allocation are refused.

Race record: per LDS byte, the last writer and reader wave and the barrier epoch they acted in; a write or read
by one wave of a byte another wave wrote (or read, for a write) in the same epoch is an LDS conflict.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from flyship.loader.emulate.decode import Inst
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.state import AGPR_BASE, LANES, Wave, parse_reg, write_v
from flyship.loader.emulate.vmem import load_to_regs, store_bytes

LANE = np.arange(LANES)


class Lds:
    """One workgroup's LDS bytes, with the race record."""

    def __init__(self, nbytes: int) -> None:
        self.data = np.zeros(max(nbytes, 4), np.uint8)
        self.nbytes = nbytes
        nd = len(self.data)
        self.writer = np.full(nd, -1, np.int32)
        self.wepoch = np.full(nd, -1, np.int32)
        self.reader = np.full(nd, -1, np.int32)
        self.repoch = np.full(nd, -1, np.int32)
        self.epoch = 0
        self.conflicts: set[int] = set()

    def check(self, addr: np.ndarray, size: int, where: str) -> None:
        if addr.size and int(addr.max()) + size > self.nbytes:
            bad = int(addr[addr + size > self.nbytes][0])
            raise refuse(f"`{where}` touches LDS bytes [{bad}, {bad + size}) past the workgroup's {self.nbytes}-byte "
                         "allocation (group segment + dynamic LDS)")

    def note(self, addr: np.ndarray, size: int, wave: int, write: bool) -> None:
        d = (addr[:, None] + np.arange(size)[None, :]).reshape(-1)  # repeats are harmless: one wave
        e = self.epoch
        other_w = (self.wepoch[d] == e) & (self.writer[d] != wave) & (self.writer[d] >= 0)
        if write:
            other_r = (self.repoch[d] == e) & (self.reader[d] != wave) & (self.reader[d] >= 0)
            hit = d[other_w | other_r]
            self.writer[d] = wave
            self.wepoch[d] = e
        else:
            hit = d[other_w]
            self.reader[d] = wave
            self.repoch[d] = e
        if hit.size:
            self.conflicts.update(np.unique(hit).tolist())

    def read(self, addr: np.ndarray, size: int) -> np.ndarray:
        return self.data[addr[:, None] + np.arange(size)]

    def write(self, addr: np.ndarray, data: np.ndarray) -> None:
        self.data[addr[:, None] + np.arange(data.shape[1])] = data


def _row(tok: str, where: str) -> int:
    r = parse_reg(tok)
    if r is None or r[0] == "s":
        raise refuse(f"operand {tok!r} of `{where}`: expected a VGPR or AGPR")
    return r[1] + (AGPR_BASE if r[0] == "a" else 0)


_DS_SIZES = {"b32": (4, "b"), "b64": (8, "b"), "b96": (12, "b"), "b128": (16, "b"), "u8": (1, "u"), "i8": (1, "i"),
             "u16": (2, "u"), "i16": (2, "i"), "b8": (1, "b"), "b16": (2, "b"), "u16_d16": (2, "d16"),
             "u16_d16_hi": (2, "d16_hi"), "u8_d16": (1, "d16"), "u8_d16_hi": (1, "d16_hi"),
             "b8_d16_hi": (1, "hi"), "b16_d16_hi": (2, "hi")}


def compile_ds(inst: Inst, where: str) -> Callable[[Wave], None]:
    """ds_read*/ds_write* (incl. read2/write2[st64]), ds_swizzle_b32, ds_(b)permute_b32, ds_add_{u32,f32}."""
    m = inst.mnemonic
    ops = inst.operands
    if m == "ds_swizzle_b32":
        return _swizzle(_row(ops[0], where), _row(ops[1], where), inst.words[0] & 0xFFFF)
    if m in ("ds_bpermute_b32", "ds_permute_b32"):
        return _permute(m, _row(ops[0], where), _row(ops[1], where), _row(ops[2], where),
                        int(inst.modifier("offset", "0"), 0))
    if inst.modifier("gds") is not None:
        raise refuse(f"`{where}`: GDS is not modelled")
    m2 = m.replace("ds_read_addtid", "").replace("ds_load_", "ds_read_").replace("ds_store_", "ds_write_")
    for pre in ("ds_read2st64_", "ds_write2st64_", "ds_read2_", "ds_write2_"):
        if m2.startswith(pre):
            return _ds2(inst, where, pre, m2[len(pre):])
    if m2.startswith("ds_read_") or m2.startswith("ds_write_"):
        load = m2.startswith("ds_read_")
        sfx = m2[len("ds_read_" if load else "ds_write_"):]
        if sfx not in _DS_SIZES:
            raise refuse(f"`{where}`: {m} (this LDS access size is not modelled)")
        size, kind = _DS_SIZES[sfx]
        off = int(inst.modifier("offset", "0"), 0)
        if load:
            drow, arow = _row(ops[0], where), _row(ops[1], where)
        else:
            arow, drow = _row(ops[0], where), _row(ops[1], where)
        nregs = max(1, size // 4)

        def ds(w: Wave) -> None:
            lanes = np.flatnonzero(w.mask)
            if not lanes.size:
                return
            addr = w.V[arow, lanes].astype(np.int64) + off
            lds = w.lds
            lds.check(addr, size, where)
            lds.note(addr, size, w.index, not load)
            if load:
                load_to_regs(w, drow, nregs, lds.read(addr, size), kind, lanes)
            else:
                lds.write(addr, store_bytes(w, drow, size, kind, lanes))
        return ds
    if m in ("ds_add_u32", "ds_add_f32", "ds_add_rtn_u32", "ds_add_rtn_f32", "ds_max_f32", "ds_min_f32",
             "ds_max_i32", "ds_min_i32", "ds_max_u32", "ds_min_u32"):
        return _ds_atomic(inst, where)
    raise refuse(f"`{where}`: {m} (this LDS instruction is not modelled)")


def _ds2(inst: Inst, where: str, pre: str, sfx: str) -> Callable[[Wave], None]:
    size = {"b32": 4, "b64": 8}.get(sfx)
    if size is None:
        raise refuse(f"`{where}`: {inst.mnemonic} (this LDS access size is not modelled)")
    load = pre.startswith("ds_read")
    unit = size * (64 if "st64" in pre else 1)
    o0 = int(inst.modifier("offset0", "0"), 0) * unit
    o1 = int(inst.modifier("offset1", "0"), 0) * unit
    ops = inst.operands
    nregs = size // 4
    if load:
        drow, arow = _row(ops[0], where), _row(ops[1], where)
        rows = (drow, drow + nregs)
    else:
        arow = _row(ops[0], where)
        rows = (_row(ops[1], where), _row(ops[2], where))

    def ds2(w: Wave) -> None:
        lanes = np.flatnonzero(w.mask)
        if not lanes.size:
            return
        base = w.V[arow, lanes].astype(np.int64)
        lds = w.lds
        for off, row in zip((o0, o1), rows):
            addr = base + off
            lds.check(addr, size, where)
            lds.note(addr, size, w.index, not load)
            if load:
                load_to_regs(w, row, nregs, lds.read(addr, size), "b", lanes)
            else:
                lds.write(addr, store_bytes(w, row, size, "b", lanes))
    return ds2


def _ds_atomic(inst: Inst, where: str) -> Callable[[Wave], None]:
    m = inst.mnemonic
    ret = "_rtn_" in m
    ops = inst.operands
    rrow = _row(ops[0], where) if ret else None
    arow, drow = _row(ops[1 if ret else 0], where), _row(ops[2 if ret else 1], where)
    off = int(inst.modifier("offset", "0"), 0)
    op = m.replace("_rtn", "")[3:]

    def atomic(w: Wave) -> None:
        lds = w.lds
        for lane in np.flatnonzero(w.mask).tolist():  # lane order
            a = int(w.V[arow, lane]) + off
            lds.check(np.array([a]), 4, where)
            lds.note(np.array([a]), 4, w.index, True)
            old = lds.data[a:a + 4].view(np.uint32)[0].copy()
            v = w.V[drow, lane]
            if op.endswith("f32"):
                fo, fv = np.float32(old.view(np.float32)), np.float32(v.view(np.float32))
                new = {"add_f32": fo + fv, "max_f32": max(fo, fv), "min_f32": min(fo, fv)}[op]
                new = np.float32(new).view(np.uint32)
            elif op.endswith("i32"):
                io, iv = old.view(np.int32), v.view(np.int32)
                new = (max(io, iv) if op.startswith("max") else min(io, iv)).view(np.uint32)
            elif op == "add_u32":
                new = np.uint32((int(old) + int(v)) & 0xFFFFFFFF)
            else:
                new = max(old, v) if op.startswith("max") else min(old, v)
            lds.data[a:a + 4] = np.array([new], np.uint32).view(np.uint8)
            if rrow is not None:
                w.V[rrow, lane] = old
    return atomic


def swizzle_source(offset: int) -> np.ndarray:
    """The source lane of each lane for ``ds_swizzle_b32 offset:<offset>`` (ISA "DS_SWIZZLE_B32"): bit 15 set =
    quad-permute mode (each lane of a quad reads lane ``offset[2i+1:2i]`` of its quad); else bit-mask mode over
    groups of 32 lanes: ``and_mask = offset[4:0]``, ``or_mask = offset[9:5]``, ``xor_mask = offset[14:10]``,
    source = ((lane & and) | or) ^ xor within the group of 32."""
    if offset & 0x8000:
        sel = np.array([(offset >> (2 * i)) & 3 for i in range(4)])
        return (LANE & ~3) | sel[LANE & 3]
    and_m, or_m, xor_m = offset & 0x1F, (offset >> 5) & 0x1F, (offset >> 10) & 0x1F
    return (LANE & 0x20) | ((((LANE & 0x1F) & and_m) | or_m) ^ xor_m)


def _swizzle(drow: int, srow: int, offset: int) -> Callable[[Wave], None]:
    source = swizzle_source(offset)

    def swizzle(w: Wave) -> None:
        # A lane whose source lane is inactive reads 0 (the crossbar sees no data from it).
        v = np.where(w.mask[source], w.V[srow][source], np.uint32(0))
        write_v(w, drow, v)
    return swizzle


def _permute(m: str, drow: int, arow: int, srow: int, off: int) -> Callable[[Wave], None]:
    def permute(w: Wave) -> None:
        idx = ((w.V[arow].astype(np.int64) + off) >> 2) & 63
        if m == "ds_bpermute_b32":  # each lane reads lane idx (inactive source lanes give 0)
            v = np.where(w.mask[idx], w.V[srow][idx], np.uint32(0))
            write_v(w, drow, v)
        else:  # ds_permute_b32: each active lane writes its value to lane idx (the higher lane wins)
            out = np.zeros(LANES, np.uint32)
            act = np.flatnonzero(w.mask)
            out[idx[act]] = w.V[srow][act]
            write_v(w, drow, out)
    return permute
