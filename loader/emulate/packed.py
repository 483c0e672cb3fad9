"""VOP3P: packed math (v_pk_*_f32 on 64-bit register pairs, v_pk_*_f16/u16 on dword halves) and the
mixed-precision v_fma_mix_f32 / v_fma_mixlo_f16 / v_fma_mixhi_f16.

Packed: op_sel picks the half each source gives the low result, op_sel_hi the one for the high result; neg_lo /
neg_hi negate. An inline constant feeds both halves.

v_fma_mix*: source i is binary16 when op_sel_hi[i] is 1 (its high half when op_sel[i] is 1, else its low half),
else binary32; the fused product-sum is rounded once to binary32 (mix_f32) or binary16 written to the low (mixlo)
or high (mixhi) half, the other half kept.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from flyship.loader.emulate import alu
from flyship.loader.emulate.decode import Inst
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.state import AGPR_BASE, Wave, parse_reg, src, vdst, write_v

u32 = np.uint32


def compile_packed(name, inst, ops, where, dpp, denorm32):
    """VOP3P: v_pk_{add,mul,fma,mov}_f32 (two binary32 lanes in a 64-bit pair) and v_pk_*_f16 (two halves of a
    dword). op_sel picks the half each source gives the low result, op_sel_hi the one for the high result;
    neg_lo/neg_hi negate."""
    if not name.startswith("v_pk_"):
        return None
    if dpp is not None:
        raise refuse(f"`{where}`: DPP on packed math is not modelled")
    nsrc = len(ops) - 1

    def bits(mod: str, default: int) -> list[int]:
        v = inst.modifier(mod)
        if v is None:
            return [default] * nsrc
        return [int(x) for x in v.strip("[]").split(",")]
    op_sel, op_sel_hi = bits("op_sel", 0), bits("op_sel_hi", 1)
    neg_lo, neg_hi = bits("neg_lo", 0), bits("neg_hi", 0)
    if inst.modifier("clamp") is not None:
        raise refuse(f"`{where}`: clamp on packed math is not modelled")
    drow, _ = vdst(ops[0], where)
    if name.endswith("_f32") or name == "v_pk_mov_b32":
        fns = {"v_pk_add_f32": lambda a, b: alu.U(alu.F(a) + alu.F(b)),
               "v_pk_mul_f32": lambda a, b: alu.U(alu.F(a) * alu.F(b)),
               "v_pk_fma_f32": alu.fma32, "v_pk_mov_b32": lambda a, b: (a, b)}
        if name not in fns:
            return None
        fn = fns[name]
        flush = denorm32 != 3 and name != "v_pk_mov_b32"
        if name != "v_pk_mov_b32":
            pairs = [_pk32_pair(t, op_sel[i], op_sel_hi[i], neg_lo[i], neg_hi[i], where) for i, t in enumerate(ops[1:])]
            if flush and denorm32 in (0, 2):
                pairs = [(lambda r: lambda w: alu.flush32(r(w)))(r) for r in pairs]
            post = alu.flush32 if flush and denorm32 in (0, 1) else None

            def pk32_pair(w: Wave) -> None:  # both halves at once: [2, n, 64] arrays
                r = fn(*[p(w) for p in pairs])
                if post is not None:
                    r = post(r)
                if w.full:
                    w.V[drow:drow + 2] = r
                else:
                    np.copyto(w.V[drow:drow + 2], r, where=w.mask, casting="unsafe")
            return pk32_pair
        readers = [_pk32_reader(t, where) for t in ops[1:]]

        def half(w, i, hi):
            lo_v, hi_v = readers[i](w)
            v = hi_v if (op_sel_hi[i] if hi else op_sel[i]) else lo_v
            if (neg_hi[i] if hi else neg_lo[i]):
                v = np.asarray(v, np.uint32) ^ np.uint32(0x80000000)
            return alu.flush32(v) if flush and denorm32 in (0, 2) else v

        def pk32(w: Wave) -> None:
            if name == "v_pk_mov_b32":
                lo = half(w, 0, False)
                hi = half(w, 1, False)
            else:
                lo = fn(*[half(w, i, False) for i in range(nsrc)])
                hi = fn(*[half(w, i, True) for i in range(nsrc)])
                if flush and denorm32 in (0, 1):
                    lo, hi = alu.flush32(lo), alu.flush32(hi)
            write_v(w, drow, lo)
            write_v(w, drow + 1, hi)
        return pk32
    return _pk16(name, ops, where, drow, op_sel, op_sel_hi, neg_lo, neg_hi)


def _pk16(name, ops, where, drow, op_sel, op_sel_hi, neg_lo, neg_hi):
    """v_pk_*_f16 / _u16: two 16-bit halves of a dword."""
    nsrc = len(ops) - 1
    fns16 = {"v_pk_add_f16": lambda a, b: alu.UH(alu.H(a) + alu.H(b)),
             "v_pk_mul_f16": lambda a, b: alu.UH(alu.H(a) * alu.H(b)),
             "v_pk_fma_f16": lambda a, b, c: alu.UH((alu.H(a).astype(np.float64) * alu.H(b) + alu.H(c)).astype(
                 np.float16)),
             "v_pk_max_f16": lambda a, b: alu.UH(np.fmax(alu.H(a), alu.H(b))),
             "v_pk_min_f16": lambda a, b: alu.UH(np.fmin(alu.H(a), alu.H(b))),
             "v_pk_add_u16": lambda a, b: (np.asarray(a, np.uint32) + b) & np.uint32(0xFFFF),
             "v_pk_mul_lo_u16": lambda a, b: (np.asarray(a, np.uint32) * b) & np.uint32(0xFFFF)}
    if name not in fns16:
        return None
    fn = fns16[name]
    readers = [_pk16_reader(t, where) for t in ops[1:]]

    def half16(w, i, hi):
        v = readers[i](w)
        v = (v >> np.uint32(16)) if (op_sel_hi[i] if hi else op_sel[i]) else v
        v = np.asarray(v, np.uint32) & np.uint32(0xFFFF)
        if (neg_hi[i] if hi else neg_lo[i]):
            v = v ^ np.uint32(0x8000)
        return v

    def pk16(w: Wave) -> None:
        lo = fn(*[half16(w, i, False) for i in range(nsrc)])
        hi = fn(*[half16(w, i, True) for i in range(nsrc)])
        write_v(w, drow, (np.asarray(lo, np.uint32) & np.uint32(0xFFFF)) | (np.asarray(hi, np.uint32) << np.uint32(16)))
    return pk16


def _pk32_pair(tok: str, sel_lo: int, sel_hi: int, neg_l: int, neg_h: int, where: str):
    """A packed-f32 source as a [2, n, 64] (or [2, n, 1], [2, 1, 1]) uint32 array: row 0 the dword op_sel picks for the low result,
    row 1 the one op_sel_hi picks for the high result, each negated by neg_lo / neg_hi; an inline constant feeds
    both."""
    r = parse_reg(tok)
    if r is None:
        c = src(tok, "f", 32, where)

        def read(w):
            return np.full((2, 1, 1), c(w), u32)
    elif r[0] == "s":
        idx = r[1]

        def read(w):
            return w.s[[idx + sel_lo, idx + sel_hi]].astype(u32)[:, :, None]
    else:
        row = r[1] + (AGPR_BASE if r[0] == "a" else 0)
        if (sel_lo, sel_hi) == (0, 1):
            def read(w):
                return w.V[row:row + 2]
        else:
            rows = [row + sel_lo, row + sel_hi]

            def read(w):
                return w.V[rows]
    if not (neg_l or neg_h):
        return read
    sign = np.array(((neg_l << 31,), (neg_h << 31,)), u32)[:, :, None]
    return lambda w: read(w) ^ sign


def _pk32_reader(tok: str, where: str):
    """A 64-bit packed-f32 source as (low dword, high dword); an inline constant feeds both halves."""
    r = parse_reg(tok)
    if r is None:
        c = src(tok, "f", 32, where)
        return lambda w: (c(w), c(w))
    file, idx, _ = r
    if file == "s":
        return lambda w: (w.s[idx].astype(u32)[:, None], w.s[idx + 1].astype(u32)[:, None])
    row = idx + (AGPR_BASE if file == "a" else 0)
    return lambda w: (w.V[row], w.V[row + 1])


def _pk16_reader(tok: str, where: str):
    r = parse_reg(tok)
    if r is None:
        c = src(tok, "f", 16, where)
        return lambda w: np.asarray(c(w), np.uint32) | (np.asarray(c(w), np.uint32) << np.uint32(16))
    return src(tok, "b", 32, where)


def compile_fma_mix(name: str, inst: Inst, where: str, denorm32: int) -> Callable[[Wave], None]:
    ops = inst.operands

    def bits(mod: str) -> list[int]:
        v = inst.modifier(mod)
        return [0, 0, 0] if v is None else [int(x) for x in v.strip("[]").split(",")]
    op_sel, op_sel_hi = bits("op_sel"), bits("op_sel_hi")
    if inst.modifier("clamp") is not None:
        raise refuse(f"`{where}`: {name} with clamp is not modelled")
    drow, _ = vdst(ops[0], where)
    readers = []
    for i, tok in enumerate(ops[1:4]):
        neg = tok.startswith("-")
        t = tok.lstrip("-")
        absv = t.startswith("|")
        t = t.strip("|")
        is16 = bool(op_sel_hi[i])
        r = parse_reg(t)
        base = src(t, "f", 16 if (is16 and r is None) else 32, where)
        readers.append((base, is16, bool(op_sel[i]), neg, absv))

    def value(w: Wave, spec) -> np.ndarray:
        base, is16, hi, neg, absv = spec
        x = np.asarray(base(w), u32)
        if is16:
            v = alu.H(x >> u32(16) if hi else x).astype(np.float64)
        else:
            v = alu.F(alu.flush32(x) if denorm32 in (0, 2) else x).astype(np.float64)
        if absv:
            v = np.abs(v)
        return -v if neg else v

    def run(w: Wave) -> None:
        a, b, c = (value(w, s) for s in readers)
        r = a * b + c
        if name == "v_fma_mix_f32":
            out = alu.U(r.astype(np.float32))
            if denorm32 in (0, 1):
                out = alu.flush32(out)
        else:
            h = alu.UH(r.astype(np.float32).astype(np.float16))
            old = w.V[drow]
            out = (old & u32(0xFFFF0000)) | h if name.endswith("lo_f16") else (old & u32(0xFFFF)) | (h << u32(16))
        write_v(w, drow, out)
    return run
