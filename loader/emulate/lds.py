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


_WAVES = 1 << 20  # more than the waves of any batch: stamps of one epoch never reach the next


class Lds:
    """The LDS of the workgroups of a batch (``groups`` allocations of ``nbytes``, one flat array), with the race
    record.

    Race record (epoch-based): per LDS byte, the last writer and reader wave and the barrier epoch they acted in
    (the epoch advances when the waves are released from a barrier). A write or read by one wave of a byte another
    wave wrote (or read, for a write) in the same epoch is an LDS conflict, and so is a byte two waves write in
    the same lockstep instruction.
    """

    def __init__(self, nbytes: int, groups: int, wave_group: np.ndarray) -> None:
        self.nbytes = nbytes
        self.stride = max(nbytes, 4)
        self.data = np.zeros(self.stride * groups, np.uint8)
        self.base = wave_group.astype(np.int64) * self.stride  # per wave of the batch: its group's first byte
        nd = len(self.data)
        # per byte: the last writer's and reader's stamp, epoch * _WAVES + wave (-1: none); epochs only grow, so a
        # stamp >= epoch * _WAVES was made in this epoch
        self.wstamp = np.full(nd, -1, np.int64)
        self.rstamp = np.full(nd, -1, np.int64)
        self.epoch = 0
        self.conflicts: set[int] = set()

    def locate(self, lanes: np.ndarray, addr: np.ndarray, size: int, where: str) -> np.ndarray:
        """The flat byte index of each lane's LDS address (``lanes``: flat lane indices of the batch); refuses an
        address past the allocation."""
        if addr.size and int(addr.max()) + size > self.nbytes:
            bad = int(addr[addr + size > self.nbytes][0])
            raise refuse(f"`{where}` touches LDS bytes [{bad}, {bad + size}) past the workgroup's {self.nbytes}-byte "
                         "allocation (group segment + dynamic LDS)")
        return addr + self.base[lanes >> 6]

    def note(self, flat: np.ndarray, size: int, waves: np.ndarray, write: bool) -> None:
        """Record an access of ``size`` bytes at each flat address by the wave ``waves`` (per address)."""
        d = (flat[:, None] + np.arange(size)[None, :]).reshape(-1) if size > 1 else flat
        base = self.epoch * _WAVES
        mine = base + (np.repeat(waves, size) if size > 1 else waves).astype(np.int64)
        sw = self.wstamp[d]
        hit = (sw >= base) & (sw != mine)  # another wave wrote it in this epoch
        if write:
            sr = self.rstamp[d]
            hit |= (sr >= base) & (sr != mine)  # another wave read it in this epoch
            self.wstamp[d] = mine
            if waves[0] != waves[-1]:  # several waves in this instruction: a byte two of them write
                hit |= self.wstamp[d] != mine
        else:
            self.rstamp[d] = mine
        if hit.any():
            self.conflicts.update(np.unique(d[hit] % self.stride).tolist())

    def read(self, flat: np.ndarray, size: int) -> np.ndarray:
        return self.data[flat[:, None] + np.arange(size)]

    def write(self, flat: np.ndarray, data: np.ndarray) -> None:
        self.data[flat[:, None] + np.arange(data.shape[1])] = data


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
    if m == "ds_read_b64_tr_b16":
        return _read_tr_b16(_row(ops[0], where), _row(ops[1], where), int(inst.modifier("offset", "0"), 0), where)
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
            lds = w.lds
            flat = lds.locate(lanes, w.VF[arow, lanes].astype(np.int64) + off, size, where)
            lds.note(flat, size, w.index[lanes >> 6], not load)
            if load:
                load_to_regs(w, drow, nregs, lds.read(flat, size), kind, lanes)
            else:
                lds.write(flat, store_bytes(w, drow, size, kind, lanes))
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
        base = w.VF[arow, lanes].astype(np.int64)
        lds = w.lds
        waves = w.index[lanes >> 6]
        for off, row in zip((o0, o1), rows):
            flat = lds.locate(lanes, base + off, size, where)
            lds.note(flat, size, waves, not load)
            if load:
                load_to_regs(w, row, nregs, lds.read(flat, size), "b", lanes)
            else:
                lds.write(flat, store_bytes(w, row, size, "b", lanes))
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
        for lane in np.flatnonzero(w.mask).tolist():  # wave order, then lane order
            a = int(lds.locate(np.array([lane]), np.array([int(w.VF[arow, lane]) + off]), 4, where)[0])
            lds.note(np.array([a]), 4, w.index[lane >> 6:(lane >> 6) + 1], True)
            old = lds.data[a:a + 4].view(np.uint32)[0].copy()
            v = w.VF[drow, lane]
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
                w.VF[rrow, lane] = old
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
        v = np.where(w.mask[:, source], w.V[srow][:, source], np.uint32(0))
        write_v(w, drow, v)
    return swizzle


def _permute(m: str, drow: int, arow: int, srow: int, off: int) -> Callable[[Wave], None]:
    def permute(w: Wave) -> None:
        idx = ((w.V[arow].astype(np.int64) + off) >> 2) & 63
        waves = w.ids[:, None]
        if m == "ds_bpermute_b32":  # each lane reads lane idx (inactive source lanes give 0)
            v = np.where(w.mask[waves, idx], w.V[srow][waves, idx], np.uint32(0))
            write_v(w, drow, v)
        else:  # ds_permute_b32: each active lane writes its value to lane idx (the higher lane wins)
            out = np.zeros(w.mask.shape, np.uint32)
            wv, ln = np.nonzero(w.mask)
            out[wv, idx[wv, ln]] = w.V[srow][wv, ln]
            write_v(w, drow, out)
    return permute


# ds_read_b64_tr_b16 (CDNA4 "MFMA Transpose Load from LDS"): each lane reads 64 bits (four 16-bit elements) at its
# address; within each group of 16 lanes, destination lane l's element n is source lane (l & ~15) + ((l >> 2) & 3)
# + 4n's element (l & 3) (a 4 x 16-lane transpose: the layout Triton's gfx950 lowering draws and that ROCm's
# rocjitsu tests against hardware, rocm-systems PR 10175).
_TR16_SRC = np.array([[(l & ~15) + ((l >> 2) & 3) + 4 * n for n in range(4)] for l in range(64)])
_TR16_HALF = (np.arange(64) & 3)[:, None]


def _read_tr_b16(drow: int, arow: int, off: int, where: str) -> Callable[[Wave], None]:
    def tr(w: Wave) -> None:
        groups = w.mask.reshape(w.n, 4, 16)
        if (groups.any(axis=2) != groups.all(axis=2)).any():
            raise refuse(f"`{where}`: ds_read_b64_tr_b16 with part of a 16-lane group off in EXEC is not modelled")
        lanes = np.flatnonzero(w.mask)
        if not lanes.size:
            return
        lds = w.lds
        flat = lds.locate(lanes, w.VF[arow, lanes].astype(np.int64) + off, 8, where)
        lds.note(flat, 8, w.index[lanes >> 6], False)
        src = np.zeros((w.n * 64, 4), np.uint16)
        src[lanes] = lds.read(flat, 8).view(np.uint16)
        out = src.reshape(w.n, 64, 4)[:, _TR16_SRC, _TR16_HALF].astype(np.uint32)  # [n, 64 lanes, 4 elements]
        write_v(w, drow, out[..., 0] | (out[..., 1] << np.uint32(16)))
        write_v(w, drow + 1, out[..., 2] | (out[..., 3] << np.uint32(16)))
    return tr
