"""SDWA (sub-dword addressing, GFX9 VOP1/VOP2).

SDWA: each source reads the field its ``srcN_sel`` names (BYTE_0-3, WORD_0/1, DWORD), zero-extended (``sext(x)``:
sign-extended); float ``-x`` / ``|x|`` apply to the field. The result's low bits go to the field ``dst_sel`` names;
the other bits follow ``dst_unused``: UNUSED_PAD = 0, UNUSED_SEXT = sign extension of the field, UNUSED_PRESERVE =
the destination's old bits.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from flyship.loader.emulate import alu
from flyship.loader.emulate.decode import Inst
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.state import Wave, sreg, src, vdst, write_v

_SEL = {"BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8), "WORD_0": (0, 16),
        "WORD_1": (16, 16), "DWORD": (0, 32)}
u32 = np.uint32


def _field(x, sel: str, sext: bool):
    off, width = _SEL[sel]
    x = np.asarray(x, u32)
    if width == 32:
        return x
    v = (x >> u32(off)) & u32((1 << width) - 1)
    if sext:
        v = ((v << u32(32 - width)).view(np.int32) >> (32 - width)).view(u32)
    return v


def _reader(tok: str, sel: str, where: str):
    sext = tok.startswith("sext(") and tok.endswith(")")
    t = tok[5:-1] if sext else tok
    neg = t.startswith("-")
    t = t.lstrip("-")
    absv = t.startswith("|")
    t = t.strip("|")
    base = src(t, "b", 32, where)
    off, width = _SEL[sel]
    sign = u32(1 << (width - 1)) if width in (16, 32) else u32(0)

    def read(w: Wave):
        v = _field(base(w), sel, sext)
        if absv:
            v = v & ~sign
        if neg:
            v = v ^ sign
        return v
    return read


def compile_sdwa(name: str, inst: Inst, where: str, denorm32: int) -> Callable[[Wave], None]:
    ops = inst.operands
    dst_sel = inst.modifier("dst_sel", "DWORD")
    unused = inst.modifier("dst_unused", "UNUSED_PAD")
    s0 = inst.modifier("src0_sel", "DWORD")
    s1 = inst.modifier("src1_sel", "DWORD")
    if inst.modifier("clamp") is not None or inst.modifier("mul") or inst.modifier("div"):
        raise refuse(f"`{where}`: SDWA with clamp/omod is not modelled")
    if name.startswith("v_cmp"):
        raise refuse(f"`{where}`: VOPC SDWA is not modelled")
    drow, _ = vdst(ops[0], where)
    if name == "v_cndmask_b32":
        mi, _ = sreg(ops[3], where)
        r0, r1 = _reader(ops[1], s0, where), _reader(ops[2], s1, where)

        def fn_w(w: Wave):
            return np.where(w.lanemask(mi), r1(w), r0(w))
    else:
        if name not in alu.OPS:
            raise refuse(f"`{where}`: unsupported instruction {inst.mnemonic} (not modelled by the emulator)")
        stypes, dty, fn = alu.OPS[name]
        if dty.endswith("64") or any(t.endswith("64") or t.endswith("16") for t in stypes):
            raise refuse(f"`{where}`: SDWA on {name} is not modelled")
        readers = [_reader(t, sel, where) for t, sel in zip(ops[1:], (s0, s1))]

        def fn_w(w: Wave):
            return fn(*[r(w) for r in readers])
    off, width = _SEL[dst_sel]

    def run(w: Wave) -> None:
        r = np.asarray(fn_w(w), u32)
        if width == 32:
            write_v(w, drow, r)
            return
        field = r & u32((1 << width) - 1)
        if unused == "UNUSED_PRESERVE":
            keep = w.V[drow] & ~u32(((1 << width) - 1) << off)
            out = keep | (field << u32(off))
        elif unused == "UNUSED_SEXT":
            sx = ((field << u32(32 - width)).view(np.int32) >> (32 - width)).view(u32)
            out = (sx << u32(off)) | np.where(((field >> u32(width - 1)) & u32(1)) != 0,
                                                u32((1 << off) - 1), u32(0))
        else:
            out = field << u32(off)
        write_v(w, drow, out)
    return run
