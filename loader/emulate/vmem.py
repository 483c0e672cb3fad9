"""Vector memory (global_*, flat_*, buffer_*) and scalar memory (s_load_*, s_buffer_load_*) instructions.

Memory operations complete in program order before the next instruction (so ``s_waitcnt`` has nothing to wait
for). Buffer instructions follow the buffer resource descriptor (V#): base, stride, num_records; an access past
num_records reads 0 and a store there is dropped, as the hardware does (checked per access; an access that crosses
the bound is checked in 4-byte pieces).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from flyship.loader.emulate.decode import Inst
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.state import AGPR_BASE, EXEC, LANES, M0, Wave, forget, parse_reg
from flyship.loader.emulate.scalar import ssrc

# suffix -> (bytes, kind): kind "b" = whole dwords, "u"/"i" = zero/sign-extend, "d16" = low half kept high,
# "d16_hi" = high half, low kept.
_SIZES = {"dword": (4, "b"), "dwordx2": (8, "b"), "dwordx3": (12, "b"), "dwordx4": (16, "b"),
          "ubyte": (1, "u"), "sbyte": (1, "i"), "ushort": (2, "u"), "sshort": (2, "i"),
          "short_d16": (2, "d16"), "short_d16_hi": (2, "d16_hi"), "ubyte_d16": (1, "d16"),
          "ubyte_d16_hi": (1, "d16_hi"), "sbyte_d16": (1, "d16s"), "sbyte_d16_hi": (1, "d16s_hi"),
          "byte": (1, "b"), "short": (2, "b"), "byte_d16_hi": (1, "hi"),
          "b32": (4, "b"), "b64": (8, "b"), "b96": (12, "b"), "b128": (16, "b")}


def _vrow(tok: str, where: str) -> tuple[int, int]:
    r = parse_reg(tok)
    if r is None or r[0] == "s":
        raise refuse(f"operand {tok!r} of `{where}`: expected a VGPR or AGPR")
    return r[1] + (AGPR_BASE if r[0] == "a" else 0), r[2]


def load_to_regs(w: Wave, row: int, nregs: int, data: np.ndarray, kind: str, lanes: np.ndarray) -> None:
    """Scatter loaded bytes ``data`` [n, size] of the lanes ``lanes`` into registers from ``row``."""
    size = data.shape[1]
    if kind == "b":
        words = np.zeros((data.shape[0], 4 * nregs), np.uint8)
        words[:, :size] = data
        vals = words.view(np.uint32)
        for i in range(nregs):
            w.VF[row + i, lanes] = vals[:, i]
        return
    raw = data[:, 0].astype(np.uint32) if size == 1 else data.view(np.uint16)[:, 0].astype(np.uint32)
    bits = 8 * size
    if kind in ("i", "d16s", "d16s_hi"):
        raw = ((raw.astype(np.int32) << (32 - bits)) >> (32 - bits)).astype(np.uint32)
    if kind in ("u", "i"):
        w.VF[row, lanes] = raw
    elif kind in ("d16", "d16s"):
        w.VF[row, lanes] = (w.VF[row, lanes] & np.uint32(0xFFFF0000)) | (raw & np.uint32(0xFFFF))
    else:
        w.VF[row, lanes] = (w.VF[row, lanes] & np.uint32(0xFFFF)) | (raw << np.uint32(16))


def store_bytes(w: Wave, row: int, size: int, kind: str, lanes: np.ndarray) -> np.ndarray:
    """The bytes a store writes per lane: ``size`` bytes from registers at ``row`` (``_d16_hi``: the high half)."""
    nregs = max(1, size // 4)
    vals = np.ascontiguousarray(w.VF[row:row + nregs][:, lanes].T)
    if kind == "hi" or kind == "d16_hi":
        vals = vals >> np.uint32(16)
    return vals.view(np.uint8).reshape(len(lanes), 4 * nregs)[:, :size].copy()


def _size(m: str, prefix: str, where: str) -> tuple[int, str]:
    sfx = m[len(prefix):]
    if sfx not in _SIZES:
        raise refuse(f"`{where}`: {m} (this access size is not modelled)")
    size, kind = _SIZES[sfx]
    if prefix.endswith("store_") and sfx.endswith("_d16_hi"):
        kind = "hi"
    return size, kind


def compile_global(inst: Inst, where: str) -> Callable[[Wave], None]:
    """global_load/store_* and flat_load/store_* (flat addresses must be global memory)."""
    m = inst.mnemonic
    seg = m.split("_")[0]
    ops = inst.operands
    off = int(inst.modifier("offset", "0"), 0)
    if "_atomic_" in m:
        return _global_atomic(inst, where)
    if inst.modifier("lds") is not None:
        raise refuse(f"`{where}`: {m} with lds (direct load to LDS) is not modelled")
    load = "_load_" in m
    size, kind = _size(m, f"{seg}_load_" if load else f"{seg}_store_", where)
    if load:
        vd, vaddr_tok = ops[0], ops[1]
        saddr_tok = ops[2] if len(ops) > 2 else "off"
    else:
        vaddr_tok, vd = ops[0], ops[1]
        saddr_tok = ops[2] if len(ops) > 2 else "off"
    drow, _ = _vrow(vd, where)
    nregs = max(1, size // 4)
    arow, an = _vrow(vaddr_tok, where)
    if saddr_tok == "off" or seg == "flat":
        if an != 2:
            raise refuse(f"`{where}`: expected a 64-bit address in {vaddr_tok}")

        def addr(w: Wave) -> np.ndarray:
            return (w.V[arow].astype(np.uint64) | (w.V[arow + 1].astype(np.uint64) << np.uint64(32))) + \
                np.uint64(off & 0xFFFFFFFFFFFFFFFF)
    else:
        sb = ssrc(saddr_tok, 64, where)

        def addr(w: Wave) -> np.ndarray:
            return sb(w)[:, None] + w.V[arow].astype(np.uint64) + np.uint64(off & 0xFFFFFFFFFFFFFFFF)

    if load:
        def gload(w: Wave) -> None:
            lanes = np.flatnonzero(w.mask)
            if lanes.size:
                data = w.mem.read(addr(w).reshape(-1)[lanes], size, where)
                load_to_regs(w, drow, nregs, data, kind, lanes)
        return gload

    def gstore(w: Wave) -> None:
        lanes = np.flatnonzero(w.mask)
        if lanes.size:
            w.mem.write(addr(w).reshape(-1)[lanes], store_bytes(w, drow, size, kind, lanes), where)
    return gstore


def _global_atomic(inst: Inst, where: str) -> Callable[[Wave], None]:
    m = inst.mnemonic
    op = m.split("_atomic_")[1]
    if op not in ATOMICS:
        raise refuse(f"`{where}`: {m} (this atomic is not modelled)")
    ops = inst.operands
    ret = inst.modifier("glc") is not None or inst.modifier("sc0") is not None
    base = 1 if ret else 0
    vaddr_tok, data_tok = ops[base], ops[base + 1]
    saddr_tok = ops[base + 2] if len(ops) > base + 2 else "off"
    off = int(inst.modifier("offset", "0"), 0)
    arow, an = _vrow(vaddr_tok, where)
    drow, _ = _vrow(data_tok, where)
    rrow = _vrow(ops[0], where)[0] if ret else None
    sb = None if saddr_tok == "off" else ssrc(saddr_tok, 64, where)

    def atomic(w: Wave) -> None:
        lanes = np.flatnonzero(w.mask)
        if sb is None:
            a = w.V[arow].astype(np.uint64) | (w.V[arow + 1].astype(np.uint64) << np.uint64(32))
        else:
            a = sb(w)[:, None] + w.V[arow].astype(np.uint64)
        a = (a + np.uint64(off & 0xFFFFFFFFFFFFFFFF)).reshape(-1)
        for lane in lanes.tolist():  # lane order: each lane's read-modify-write is atomic
            old = w.mem.read(a[lane:lane + 1], 4, where).view(np.uint32)[0, 0]
            new = _rmw(op, old, w.VF[drow, lane])
            w.mem.write(a[lane:lane + 1], np.array([new], np.uint32).view(np.uint8).reshape(1, 4), where)
            if rrow is not None:
                w.VF[rrow, lane] = old
    return atomic


ATOMICS = ("add_f32", "add", "max_i32", "min_i32", "umax", "umin", "smax", "smin", "or", "and", "xor",
           "pk_add_bf16", "pk_add_f16")


def _rmw(op: str, old: np.uint32, v: np.uint32) -> np.uint32:
    """One lane's atomic read-modify-write of a dword (ISA "FLAT/BUFFER atomics"); pk_add_bf16/f16 add the two
    halves separately, each rounded to nearest even."""
    if op == "pk_add_bf16":
        from flyship.loader.emulate import alu
        o, x = np.array([old, old >> np.uint32(16)], np.uint32), np.array([v, v >> np.uint32(16)], np.uint32)
        r = alu.f32_to_bf16(alu.bf16_to_f32(o) + alu.bf16_to_f32(x))
        return np.uint32(int(r[0]) | (int(r[1]) << 16))
    if op == "pk_add_f16":
        o = np.array([old], np.uint32).view(np.float16)
        x = np.array([v], np.uint32).view(np.float16)
        return (o + x).view(np.uint32)[0]
    if op == "add_f32":
        return (np.array([old], np.uint32).view(np.float32) + np.array([v], np.uint32).view(np.float32)).view(
            np.uint32)[0]
    if op == "add":
        return np.uint32((int(old) + int(v)) & 0xFFFFFFFF)
    if op in ("max_i32", "smax"):
        return np.uint32(max(np.int32(old.view(np.int32)), np.int32(v.view(np.int32))).view(np.uint32))
    if op in ("min_i32", "smin"):
        return np.uint32(min(np.int32(old.view(np.int32)), np.int32(v.view(np.int32))).view(np.uint32))
    return {"umax": max, "umin": min}.get(op, None)(old, v) if op in ("umax", "umin") else {
        "or": np.bitwise_or, "and": np.bitwise_and, "xor": np.bitwise_xor}[op](old, v)


def compile_buffer(inst: Inst, where: str) -> Callable[[Wave], None]:
    """buffer_load/store_* through a buffer resource descriptor (V#) in four SGPRs."""
    m = inst.mnemonic
    ops = inst.operands
    if inst.modifier("lds") is not None and m in _LDS_LOADS:
        return _buffer_lds(inst, where, _LDS_LOADS[m])
    if inst.modifier("lds") is not None or "_format_" in m:
        raise refuse(f"`{where}`: {m} (buffer format conversion and direct-to-LDS loads other than "
                     f"{'/'.join(_LDS_LOADS)} are not modelled)")
    atomic = "_atomic_" in m
    if atomic:
        op = m.split("_atomic_")[1]
        if op not in ATOMICS:
            raise refuse(f"`{where}`: {m} (this atomic is not modelled)")
        size, kind, load = 4, "b", False
    else:
        load = m.startswith("buffer_load_")
        size, kind = _size(m, "buffer_load_" if load else "buffer_store_", where)
    drow, _ = _vrow(ops[0], where)
    nregs = max(1, size // 4)
    access = _buffer_access(inst, where, size)

    if load:
        def bload(w: Wave) -> None:
            lanes, addr, ok = access(w)
            if not lanes.size:
                return
            data = np.zeros((lanes.size, addr.shape[1], min(size, 4)), np.uint8)
            if ok.any():
                data[ok] = w.mem.read(addr[ok], min(size, 4), where)
            load_to_regs(w, drow, nregs, data.reshape(lanes.size, -1), kind, lanes)
        return bload

    if atomic:
        ret = inst.modifier("glc") is not None or inst.modifier("sc0") is not None

        def batomic(w: Wave) -> None:
            lanes, addr, ok = access(w)
            for k, lane in enumerate(lanes.tolist()):  # lane order; out-of-range lanes do nothing, return 0
                if not ok[k, 0]:
                    if ret:
                        w.VF[drow, lane] = 0
                    continue
                old = w.mem.read(addr[k, :1], 4, where).view(np.uint32)[0, 0]
                new = _rmw(op, old, w.VF[drow, lane])
                w.mem.write(addr[k, :1], np.array([new], np.uint32).view(np.uint8).reshape(1, 4), where)
                if ret:
                    w.VF[drow, lane] = old
        return batomic

    def bstore(w: Wave) -> None:
        lanes, addr, ok = access(w)
        if not lanes.size:
            return
        data = store_bytes(w, drow, size, kind, lanes).reshape(lanes.size, addr.shape[1], min(size, 4))
        if ok.any():
            w.mem.write(addr[ok], data[ok], where)
    return bstore


_LDS_LOADS = {"buffer_load_dword": 4, "buffer_load_dwordx4": 16}


def _buffer_lds(inst: Inst, where: str, size: int) -> Callable[[Wave], None]:
    """buffer_load_dword / _dwordx4 ... lds (CDNA3/CDNA4 ISA "Memory Buffer Load to LDS"): the memory address is
    the usual one (V#, voffset/vindex, soffset, inst_offset, num_records: out of range reads 0), and lane ``t`` of
    the wave writes its ``size`` bytes to LDS at M0 + inst_offset + t * size (4 for a dword, 16 for gfx950's
    dwordx4) in its workgroup's LDS; no VGPR is written. Lanes off in EXEC write nothing."""
    access = _buffer_access(inst, where, size, ("lds",) + tuple(inst.operands))  # LLVM prints no vdata here
    ioff = int(inst.modifier("offset", "0"), 0)
    pieces = size // 4

    def bload_lds(w: Wave) -> None:
        lanes, addr, ok = access(w)
        if not lanes.size:
            return
        data = np.zeros((lanes.size, pieces, 4), np.uint8)
        if ok.any():
            data[ok] = w.mem.read(addr[ok], 4, where)
        wv = lanes >> 6
        dst = w.s[M0][wv].astype(np.int64) + ioff + (lanes & 63) * size
        lds = w.lds
        flat = lds.locate(lanes, dst, size, where)
        lds.note(flat, size, w.index[wv], True)
        lds.write(flat, data.reshape(lanes.size, size))
    return bload_lds


def _buffer_access(inst: Inst, where: str, size: int, ops=None):
    """The per-wave addressing of a buffer instruction: wave -> (active lanes, addresses [lanes, pieces], in range
    [lanes, pieces]); a piece is a dword (or the whole access when it is smaller)."""
    ops = inst.operands if ops is None else ops
    offen, idxen = inst.modifier("offen") is not None, inst.modifier("idxen") is not None
    ioff = int(inst.modifier("offset", "0"), 0)
    vrow = None if ops[1] == "off" else _vrow(ops[1], where)[0]
    rs = parse_reg(ops[2])[1]
    soff = ssrc(ops[3], 32, where)

    def access(w: Wave) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = w.s
        lanes = np.flatnonzero(w.mask)
        wv = lanes >> 6  # each lane's wave: descriptors and soffset are per wave
        d1, d3 = s[rs + 1][wv], s[rs + 3][wv]
        base = s[rs][wv] | ((d1 & np.uint64(0xFFFF)) << np.uint64(32))
        stride = ((d1 >> np.uint64(16)) & np.uint64(0x3FFF)).astype(np.int64)
        num_records = s[rs + 2][wv].astype(np.int64)
        if ((d1 >> np.uint64(31)) & np.uint64(1)).any() or ((d3 >> np.uint64(23)) & np.uint64(1)).any():
            raise refuse(f"`{where}`: swizzled or add-tid buffer descriptors are not modelled")
        voff = np.zeros(lanes.size, np.int64)
        vidx = np.zeros(lanes.size, np.int64)
        if idxen and offen:
            vidx, voff = w.VF[vrow, lanes].astype(np.int64), w.VF[vrow + 1, lanes].astype(np.int64)
        elif idxen:
            vidx = w.VF[vrow, lanes].astype(np.int64)
        elif offen:
            voff = w.VF[vrow, lanes].astype(np.int64)
        so = soff(w)
        offset = voff + ioff + (so[wv] if np.ndim(so) else so).astype(np.int64)
        pieces = max(1, size // 4)
        psize = min(size, 4)
        poff = offset[:, None] + np.arange(pieces) * 4
        if idxen:
            ok = np.broadcast_to((vidx < num_records)[:, None], poff.shape)
        else:
            whole = (offset + size <= num_records)[:, None]
            raw = whole | (poff + psize <= num_records[:, None] - 4)
            ok = np.where((stride == 0)[:, None], raw, (vidx < num_records)[:, None])
        addr = base[:, None] + (vidx * stride)[:, None].astype(np.uint64) + poff.astype(np.uint64)
        return lanes, addr, ok
    return access


def compile_smem(inst: Inst, where: str) -> Callable[[Wave], None]:
    """s_load_dword{,x2,x4,x8,x16} and s_buffer_load_dword*: uniform loads into SGPRs."""
    m = inst.mnemonic
    ops = inst.operands
    d, n = parse_reg(ops[0])[1:]
    buffered = m.startswith("s_buffer_load_")
    bidx = parse_reg(ops[1])[1]
    off_tok = ops[2] if len(ops) > 2 else "0"
    soff = ssrc(off_tok, 32, where)
    extra = int(inst.modifier("offset", "0"), 0)
    nbytes = 4 * n

    def sload(w: Wave) -> None:
        s = w.s
        waves = w.ids if w.all else np.flatnonzero(w.act)
        so = soff(w)
        so = (so[waves] if np.ndim(so) else np.full(waves.size, so, np.uint64)) + np.uint64(extra)
        if buffered:
            base = s[bidx][waves] | ((s[bidx + 1][waves] & np.uint64(0xFFFF)) << np.uint64(32))
            num = s[bidx + 2][waves]
            o = so & np.uint64(0xFFFFFFFC)
            vals = np.zeros((waves.size, n), np.uint32)
            for i in range(n):
                ok = o + np.uint64(4 * i + 4) <= num
                if ok.any():
                    vals[ok, i] = w.mem.read(base[ok] + o[ok] + np.uint64(4 * i), 4, where).view(np.uint32)[:, 0]
        else:
            a = ((s[bidx][waves] | (s[bidx + 1][waves] << np.uint64(32))) + so) & np.uint64((1 << 64) - 4)
            vals = w.mem.read(a, nbytes, where).view(np.uint32).reshape(waves.size, n)
        if w.lm:
            forget(w, d, n)
        for i in range(n):
            s[d + i, waves] = vals[:, i]
        if d <= EXEC + 1 and d + n > EXEC:
            w.sync_exec()
    return sload


LANE_IDS = np.arange(LANES)
