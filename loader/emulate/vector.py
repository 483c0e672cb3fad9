"""Compile VALU instructions (VOP1/VOP2/VOP3/VOPC/VOP3P, with DPP) into closures over a wave.

DPP (ISA "Data Parallel Primitives", GFX9 encoding, read from the DPP dword): src0 is read from another lane of
the same wave: quad_perm, row_shl/shr/ror:1-15, wave_shl/shr/rol/ror:1, row_mirror, row_half_mirror,
row_bcast:15 (each row r >= 1 reads lane 16r-1) and row_bcast:31 (rows 2 and 3 read lane 31). Every lane reads
the value its source lane held *before* the instruction (so ``v_add_f32_dpp v1, v1, v1 row_shr:1`` is pairwise).
A lane whose source lane is out of range or inactive is written with 0 when bound_ctrl is set, else not written;
lanes of rows/banks off in row_mask/bank_mask are not written.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from flyship.loader.emulate import alu, packed, sdwa
from flyship.loader.emulate.decode import Inst
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.state import (EXEC, LANES, VCC, Wave, pack_mask, parse_reg, sreg, src, vdst,
                                          write_s, write_v, write_v64)

LANE = np.arange(LANES)
ROW_BASE = LANE & ~15
_KIND = {"f": "f", "i": "i", "u": "u", "b": "b"}


def dpp_source(ctrl: int) -> tuple[np.ndarray, np.ndarray]:
    """(source lane, valid) per lane for a GFX9 dpp_ctrl value."""
    r = LANE & 15
    if ctrl <= 0xFF:
        sel = np.array([(ctrl >> (2 * i)) & 3 for i in range(4)])
        return (LANE & ~3) | sel[LANE & 3], np.ones(LANES, bool)
    if 0x101 <= ctrl <= 0x10F:
        n = ctrl & 15
        return np.minimum(LANE + n, 63), r + n < 16
    if 0x111 <= ctrl <= 0x11F:
        n = ctrl & 15
        return np.maximum(LANE - n, 0), r - n >= 0
    if 0x121 <= ctrl <= 0x12F:
        n = ctrl & 15
        return ROW_BASE | ((r - n) & 15), np.ones(LANES, bool)
    if ctrl == 0x130:
        return np.minimum(LANE + 1, 63), LANE + 1 < 64
    if ctrl == 0x134:
        return (LANE + 1) & 63, np.ones(LANES, bool)
    if ctrl == 0x138:
        return np.maximum(LANE - 1, 0), LANE >= 1
    if ctrl == 0x13C:
        return (LANE - 1) & 63, np.ones(LANES, bool)
    if ctrl == 0x140:
        return ROW_BASE | (15 - r), np.ones(LANES, bool)
    if ctrl == 0x141:
        return (LANE & ~7) | (7 - (LANE & 7)), np.ones(LANES, bool)
    if ctrl == 0x142:
        return np.maximum(ROW_BASE - 1, 0), ROW_BASE >= 16
    if ctrl == 0x143:
        return np.full(LANES, 31), LANE >= 32
    raise refuse(f"DPP control 0x{ctrl:x} is not a GFX9 DPP control")


class Dpp:
    """The DPP word of an instruction: how src0 is read and which lanes are written."""

    def __init__(self, word: int) -> None:
        self.row = word & 0xFF
        ctrl = (word >> 8) & 0x1FF
        self.bound_ctrl = bool(word >> 19 & 1)
        bank_mask, row_mask = (word >> 24) & 15, (word >> 28) & 15
        self.source, self.valid = dpp_source(ctrl)
        self.enabled = (((row_mask >> (LANE >> 4)) & 1) != 0) & (((bank_mask >> ((LANE >> 2) & 3)) & 1) != 0)

    def read(self, w: Wave) -> tuple[np.ndarray, np.ndarray]:
        """(src0 values per lane, lanes to write)."""
        ok = self.valid & w.mask[:, self.source]
        vals = w.V[self.row][:, self.source]
        write = w.mask & self.enabled
        if self.bound_ctrl:
            vals = np.where(ok, vals, np.uint32(0))
        else:
            write = write & ok
        return vals, write


def _kind_bits(ty: str) -> tuple[str, int]:
    return _KIND[ty[0]], int(ty[1:])


def strip(mnemonic: str) -> tuple[str, str]:
    for sfx in ("_e32", "_e64", "_dpp", "_sdwa", "_e64_dpp"):
        if mnemonic.endswith(sfx):
            return mnemonic[: -len(sfx)], sfx
    return mnemonic, ""


def compile_vector(inst: Inst, where: str, denorm32: int) -> Callable[[Wave], None] | None:
    """The closure of a VALU instruction, or None when it is not one (the caller refuses by name)."""
    name, enc = strip(inst.mnemonic)
    if enc == "_sdwa":
        return sdwa.compile_sdwa(name, inst, where, denorm32)
    dpp = Dpp(inst.words[1]) if enc == "_dpp" else None
    ops = inst.operands
    for special in (_lanes, _vopc, _carry, packed.compile_packed):
        f = special(name, inst, ops, where, dpp, denorm32)
        if f is not None:
            return f
    if name in alu.OPS16:
        return _op16(name, inst, ops, where, dpp)
    if name not in alu.OPS:
        return None
    if inst.modifier("op_sel") is not None:
        raise refuse(f"`{where}`: op_sel on {name} (a 16-bit half select) is not modelled")
    stypes, dty, fn = alu.OPS[name]
    readers = [src(t, *_kind_bits(ty), where) for t, ty in zip(ops[1:], stypes)]
    if len(ops) - 1 != len(stypes):
        raise refuse(f"`{where}`: expected {len(stypes)} source operands for {name}, got {len(ops) - 1}")
    return _finish(inst, name, ops[0], dty, fn, readers, where, dpp, denorm32, stypes)


def _post(inst: Inst, dty: str, denorm32: int, where: str, stypes=()) -> Callable | None:
    """clamp / omod (output modifiers) and the f32 denorm flush, as one function on the result bits."""
    steps = []
    flush = dty == "f32" and denorm32 != 3  # FLOAT_DENORM_MODE_32: 0 flush in+out, 1 out, 2 in, 3 none
    omod = inst.modifier("mul") or inst.modifier("div")
    if omod:
        if dty != "f32":
            raise refuse(f"`{where}`: output modifier on a non-f32 result is not modelled")
        k = {"mul:2": 2.0, "mul:4": 4.0, "div:2": 0.5}[("mul:" if inst.modifier("mul") else "div:") + omod]
        steps.append(lambda r: alu.U(alu.F(r) * np.float32(k)))
    if inst.modifier("clamp") is not None:
        if dty != "f32":
            raise refuse(f"`{where}`: clamp on a {dty} result is not modelled")
        steps.append(lambda r: alu.U(np.clip(np.nan_to_num(alu.F(r), nan=0.0), np.float32(0), np.float32(1))))
    if flush and denorm32 in (0, 1):
        steps.append(alu.flush32)
    if not steps:
        return None

    def post(r):
        for s in steps:
            r = s(r)
        return r
    return post


def _finish(inst, name, dtok, dty, fn, readers, where, dpp, denorm32, stypes):
    drow, n = vdst(dtok, where)
    wide = dty.endswith("64")
    post = _post(inst, dty, denorm32, where, stypes)
    if denorm32 in (0, 2) and any(t == "f32" for t in stypes):
        readers = [(lambda r: lambda w: alu.flush32(r(w)))(r) if t == "f32" else r for r, t in zip(readers, stypes)]
    nsrc = len(readers)
    r0 = readers[0]
    if dpp is not None:
        if wide:
            raise refuse(f"`{where}`: DPP on a 64-bit operation is not modelled")
        neg = inst.operands[1].startswith("-")
        absv = "|" in inst.operands[1]

        def dpp_run(w: Wave) -> None:
            v0, write = dpp.read(w)
            if absv:
                v0 = v0 & np.uint32(0x7FFFFFFF)
            if neg:
                v0 = v0 ^ np.uint32(0x80000000)
            r = fn(v0, *[rd(w) for rd in readers[1:]])
            if post is not None:
                r = post(r)
            np.copyto(w.V[drow], r, where=write, casting="unsafe")
        return dpp_run
    writer = write_v64 if wide else write_v
    if nsrc == 1:
        if post is None:
            return lambda w: writer(w, drow, fn(r0(w)))
        return lambda w: writer(w, drow, post(fn(r0(w))))
    if nsrc == 2:
        r1 = readers[1]
        if post is None:
            return lambda w: writer(w, drow, fn(r0(w), r1(w)))
        return lambda w: writer(w, drow, post(fn(r0(w), r1(w))))
    r1, r2 = readers[1], readers[2]
    if post is None:
        return lambda w: writer(w, drow, fn(r0(w), r1(w), r2(w)))
    return lambda w: writer(w, drow, post(fn(r0(w), r1(w), r2(w))))


def _lanes(name, inst, ops, where, dpp, denorm32):
    """v_readlane / v_writelane / v_readfirstlane, fmac, fmamk/fmaak, v_cndmask, permlane swaps, bitop3."""
    if name == "v_readlane_b32":
        d, _ = sreg(ops[0], where)
        row, _ = vdst(ops[1], where)
        lane = _lane_sel(ops[2], where)
        return lambda w: write_s(w, d, 1, w.V[row, w.ids, lane(w) & 63])
    if name == "v_readfirstlane_b32":
        d, _ = sreg(ops[0], where)
        r = src(ops[1], "b", 32, where)

        def rfl(w: Wave) -> None:
            first = np.argmax(w.mask, axis=1)  # the first active lane (lane 0 when none is)
            v = np.broadcast_to(r(w), w.mask.shape)
            write_s(w, d, 1, v[w.ids, first])
        return rfl
    if name == "v_writelane_b32":
        row, _ = vdst(ops[0], where)
        r = src(ops[1], "b", 32, where)
        lane = _lane_sel(ops[2], where)

        def wl(w: Wave) -> None:  # ignores EXEC (ISA "V_WRITELANE_B32")
            v = np.broadcast_to(r(w), w.mask.shape)[:, 0]
            ln = np.broadcast_to(np.asarray(lane(w)) & 63, v.shape).astype(np.intp)
            sel = w.ids if w.all else w.ids[w.act]
            w.V[row, sel, ln[sel]] = v[sel]
        return wl
    if name in ("v_fmac_f32", "v_mac_f32"):
        row, _ = vdst(ops[0], where)
        fn = alu.fma32 if name == "v_fmac_f32" else (lambda a, b, c: alu.U(alu.F(a) * alu.F(b) + alu.F(c)))
        acc = src(ops[0], "f", 32, where)
        readers = [src(t, "f", 32, where) for t in ops[1:3]]
        return _finish(inst, name, ops[0], "f32", fn, readers + [acc], where, dpp, denorm32, ("f32",) * 3)
    if name in ("v_fmamk_f32", "v_fmaak_f32", "v_madmk_f32", "v_madak_f32"):
        a, b, c = (src(t, "f", 32, where) for t in ops[1:4])
        fused = name.startswith("v_fma")
        f3 = alu.fma32 if fused else (lambda x, y, z: alu.U(alu.F(x) * alu.F(y) + alu.F(z)))
        # LLVM prints the operands in product-then-addend order: v_fmamk_f32 d, a, K, b is a * K + b and
        # v_fmaak_f32 d, a, b, K is a * b + K.
        return _finish(inst, name, ops[0], "f32", f3, [a, b, c], where, dpp, denorm32, ("f32",) * 3)
    if name == "v_cndmask_b32":
        sel = ops[3] if len(ops) > 3 else "vcc"
        mi, _ = sreg(sel, where)
        readers = [src(t, "b", 32, where) for t in ops[1:3]]
        return _cndmask(inst, ops, readers, mi, where, dpp)
    if name in ("v_mbcnt_lo_u32_b32", "v_mbcnt_hi_u32_b32"):
        a, c = src(ops[1], "u", 32, where), src(ops[2], "u", 32, where)
        hi = name == "v_mbcnt_hi_u32_b32"
        # ISA "V_MBCNT_LO/HI_U32_B32": count the bits of S0 set below this lane (lo: mask bits 31:0 for lanes
        # 0-31, all 32 for lanes 32-63; hi: bits 63:32 below lane - 32), plus S1.
        below = np.array([((1 << l) - 1) >> (32 if hi else 0) & 0xFFFFFFFF for l in range(LANES)], np.uint32)
        drow = vdst(ops[0], where)[0]

        def mbcnt(w: Wave) -> None:
            cnt = np.bitwise_count(np.asarray(a(w), np.uint32) & below)
            write_v(w, drow, cnt.astype(np.uint32) + np.asarray(c(w), np.uint32))
        return mbcnt
    if name in ("v_fma_mix_f32", "v_fma_mixlo_f16", "v_fma_mixhi_f16"):
        return packed.compile_fma_mix(name, inst, where, denorm32)
    if name in ("v_permlane16_swap_b32", "v_permlane32_swap_b32"):
        return _permlane_swap(name, ops, where)
    if name == "v_bitop3_b32":
        table = int(inst.modifier("bitop3", "0"), 0)
        readers = [src(t, "b", 32, where) for t in ops[1:4]]
        return _finish(inst, name, ops[0], "b32", lambda a, b, c: alu.bitop3(a, b, c, table), readers, where, dpp,
                       denorm32, ("b32",) * 3)
    return None


def _cndmask(inst, ops, readers, mi, where, dpp):
    drow, _ = vdst(ops[0], where)
    r0, r1 = readers
    neg = ops[1].startswith("-")

    def cnd(w: Wave) -> None:
        sel = w.lanemask(mi)
        if dpp is not None:
            v0, write = dpp.read(w)
            if neg:
                v0 = v0 ^ np.uint32(0x80000000)
            np.copyto(w.V[drow], np.where(sel, r1(w), v0), where=write, casting="unsafe")
            return
        write_v(w, drow, np.where(sel, r1(w), r0(w)))
    return cnd


def _lane_sel(tok: str, where: str):
    r = parse_reg(tok)
    if r is not None and r[0] == "s":
        idx = r[1]
        return lambda w: w.s[idx].astype(np.intp)
    k = int(tok, 0)
    return lambda w: k


def _permlane_swap(name, ops, where):
    """gfx950 (CDNA4 ISA): v_permlane16_swap_b32 swaps the odd 16-lane rows of vdst with the even rows of vsrc;
    v_permlane32_swap_b32 swaps the upper 32 lanes of vdst with the lower 32 lanes of vsrc. Both registers are
    written (lanes under EXEC)."""
    a, _ = vdst(ops[0], where)
    b, _ = vdst(ops[1], where)
    if name == "v_permlane16_swap_b32":
        da = np.array([l for l in range(LANES) if (l >> 4) & 1])  # odd rows of vdst
        db = da - 16                                                  # even rows of vsrc
    else:
        da = np.arange(32, 64)
        db = da - 32

    def swap(w: Wave) -> None:
        A, B = w.V[a].copy(), w.V[b].copy()
        na, nb = A.copy(), B.copy()
        na[:, da], nb[:, db] = B[:, db], A[:, da]
        write_v(w, a, na)
        write_v(w, b, nb)
    return swap


def _vopc(name, inst, ops, where, dpp, denorm32):
    if not (name.startswith("v_cmp_") or name.startswith("v_cmpx_")):
        return None
    parts = name.split("_")
    rel, ty = parts[2], parts[3]
    cmpx = parts[1] == "cmpx"
    if rel == "class":
        fn = alu.class_fn(ty)
        k1, b1 = "u", 32
    else:
        fn = alu.cmp_fn(rel, ty)
        k1, b1 = _kind_bits(ty)
    k0, b0 = _kind_bits(ty)
    if len(ops) == 3:
        dtok, s0, s1 = ops
    elif len(ops) == 2:  # gfx9 VOPC e32 with implicit vcc printed? keep explicit
        dtok, (s0, s1) = "vcc", ops
    else:
        raise refuse(f"`{where}`: unexpected operands for {name}")
    d, _ = sreg(dtok, where) if dtok != "exec" else (126, 2)
    r0 = src(s0, k0, b0, where)
    r1 = src(s1, k1, b1, where)
    flush = ty == "f32" and denorm32 in (0, 2)

    def vopc(w: Wave) -> None:
        if dpp is not None:
            v0, write = dpp.read(w)
            res = fn(v0, r1(w)) & write
        else:
            a, b = r0(w), r1(w)
            if flush:
                a, b = alu.flush32(a), alu.flush32(b)
            res = fn(a, b)
            res = res & w.mask
        bits = pack_mask(res)
        write_s(w, d, 2, bits)
        if w.all and d != EXEC:
            w.lm[d] = res  # the lanes just packed: a v_cndmask reading them need not unpack
        if cmpx:
            w.set_exec(bits)
    return vopc


def _carry(name, inst, ops, where, dpp, denorm32):
    """Ops with a carry/borrow (or VCC-like) lane-mask output: v_add_co/addc/sub_co/subb(rev)_co_u32,
    v_mad_u64_u32 / v_mad_i64_i32, v_div_scale_f32, v_div_fmas_f32 (reads VCC)."""
    if name in ("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_addc_co_u32", "v_subb_co_u32",
                "v_subbrev_co_u32", "v_add_i32", "v_sub_i32"):
        if dpp is not None:
            raise refuse(f"`{where}`: DPP on carry operations is not modelled")
        drow, _ = vdst(ops[0], where)
        cd, _ = sreg(ops[1], where)
        a, b = src(ops[2], "u", 32, where), src(ops[3], "u", 32, where)
        cin = sreg(ops[4], where)[0] if len(ops) > 4 else None

        def carry(w: Wave) -> None:
            x, y = np.asarray(a(w), np.int64), np.asarray(b(w), np.int64)
            c = w.lanemask(cin).astype(np.int64) if cin is not None else 0
            if name in ("v_sub_co_u32", "v_subb_co_u32", "v_sub_i32"):
                r = x - y - c
            elif name in ("v_subrev_co_u32", "v_subbrev_co_u32"):
                r = y - x - c
            else:
                r = x + y + c
            out = ((r < 0) | (r > 0xFFFFFFFF)) & w.mask
            write_v(w, drow, (r & 0xFFFFFFFF).astype(np.uint32))
            write_s(w, cd, 2, pack_mask(out))
        return carry
    if name in ("v_mad_u64_u32", "v_mad_i64_i32"):
        drow, _ = vdst(ops[0], where)
        cd, _ = sreg(ops[1], where)
        signed = name == "v_mad_i64_i32"
        a, b = src(ops[2], "u", 32, where), src(ops[3], "u", 32, where)
        c = src(ops[4], "u", 64, where)

        def mad64(w: Wave) -> None:
            x, y, z = a(w), b(w), c(w)
            zz = np.asarray(z, np.uint64)
            if signed:  # the 64-bit product of two i32 is exact in int64; the sum overflows iff signs say so
                prod = alu.I(x).astype(np.int64) * alu.I(y).astype(np.int64)
                zs = zz.view(np.int64) if zz.ndim else np.int64(zz.view(np.int64))
                full = prod + zs
                ovf = ((prod < 0) == (zs < 0)) & ((full < 0) != (prod < 0))
                lo = full.view(np.uint64) if np.ndim(full) else np.uint64(full.view(np.uint64))
            else:
                prod = np.asarray(x, np.uint32).astype(np.uint64) * np.asarray(y, np.uint32).astype(np.uint64)
                lo = prod + zz
                ovf = lo < zz
            write_v64(w, drow, lo)
            write_s(w, cd, 2, pack_mask(np.broadcast_to(ovf, w.mask.shape) & w.mask))
        return mad64
    if name == "v_div_scale_f32":
        drow, _ = vdst(ops[0], where)
        cd, _ = sreg(ops[1], where)
        s0, s1, s2 = (src(t, "f", 32, where) for t in ops[2:5])

        def div_scale(w: Wave) -> None:
            # No scaling: exact for numerator/denominator exponents well inside the binary32 range; refuse where
            # the hardware would scale (ISA "V_DIV_SCALE_F32").
            x, den, num = alu.F(s0(w)), alu.F(s1(w)), alu.F(s2(w))
            e_d = np.frexp(np.broadcast_to(den, w.mask.shape))[1]
            e_n = np.frexp(np.broadcast_to(num, w.mask.shape))[1]
            risky = w.mask & np.isfinite(den) & np.isfinite(num) & (den != 0) & (num != 0) & (
                (np.abs(e_n - e_d) >= 96) | (e_d <= -125) | (e_d >= 126) | (e_n <= -103))
            if risky.any():
                raise refuse(f"`{where}`: v_div_scale_f32 would scale (operands near the binary32 range limits); "
                             "not modelled")
            write_v(w, drow, alu.U(x))
            write_s(w, cd, 2, 0)
        return div_scale
    if name == "v_div_fmas_f32":
        drow, _ = vdst(ops[0], where)
        s0, s1, s2 = (src(t, "f", 32, where) for t in ops[1:4])

        def div_fmas(w: Wave) -> None:
            if (w.lanemask(VCC) & w.mask).any():
                raise refuse(f"`{where}`: v_div_fmas_f32 with VCC set (scaled division) is not modelled")
            write_v(w, drow, alu.fma32(s0(w), s1(w), s2(w)))
        return div_fmas
    return None


def _op16(name, inst, ops, where, dpp):
    """16-bit VOP3 ops with op_sel (GFX9 VOP3 "OPSEL": bit i picks the high half of source i, bit 3 writes the
    result to the destination's high half). The other half of the destination keeps its value: LLVM never relies
    on these ops zeroing it (GCNSubtarget::zeroesHigh16BitsOfDest does not list them)."""
    kind, fn = alu.OPS16[name]
    if dpp is not None or inst.modifier("clamp") is not None or len(ops) != 4:
        raise refuse(f"`{where}`: {name} with DPP, clamp or other than three sources is not modelled")
    sel = [int(b) for b in inst.modifier("op_sel", "[0,0,0,0]").strip("[]").split(",")]
    sel += [0] * (4 - len(sel))
    readers = [_half(t, kind, bool(sel[i]), where) for i, t in enumerate(ops[1:])]
    drow, _ = vdst(ops[0], where)
    ty = alu.HALF_TYPES[kind]
    hi = bool(sel[3])
    keep = np.uint32(0xFFFF if hi else 0xFFFF0000)

    def op16(w: Wave) -> None:
        x, y, z = (np.asarray(r(w), np.uint32).astype(np.uint16).view(ty) for r in readers)
        r = np.asarray(fn(x, y, z), ty).view(np.uint16).astype(np.uint32)
        write_v(w, drow, (w.V[drow] & keep) | (r << np.uint32(16) if hi else r))
    return op16


def _half(tok: str, kind: str, hi: bool, where: str):
    """A 16-bit source: the low or (op_sel) high half of a register, or a constant; ``-x`` / ``|x|`` act on the
    selected half's sign bit (binary16 operands only)."""
    neg = absv = False
    t = tok
    if kind == "f" and t.startswith("-") and not t[1:2].isdigit():
        neg, t = True, t[1:]
    if kind == "f" and t.startswith("|") and t.endswith("|"):
        absv, t = True, t[1:-1]
    if hi and parse_reg(t) is None:
        raise refuse(f"`{where}`: op_sel high half of the constant {tok!r} is not modelled")
    base = src(t, kind, 16, where)
    shift = np.uint32(16 if hi else 0)

    def rd(w: Wave):
        x = (np.asarray(base(w), np.uint32) >> shift) & np.uint32(0xFFFF)
        if absv:
            x = x & np.uint32(0x7FFF)
        if neg:
            x = x ^ np.uint32(0x8000)
        return x
    return rd
