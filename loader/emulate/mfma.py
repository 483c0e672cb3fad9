"""MFMA (v_mfma_f32_<M>x<N>x<K>_<type>): matrix fused multiply-add over the wave, accumulating in binary32.

Layouts (CDNA3/CDNA4 ISA guides, "Matrix fused multiply-add", single-block shapes): the 64 lanes form G = 64/M
groups; lane l holds row ``i = l % M`` of A (column ``j = l % N`` of B) for the K/G consecutive ``k`` starting at
``(l // M) * K/G``, packed low element first. D/C (f32) are M*N/64 registers; register r of lane l holds column
``l % N``, row ``(r // 4) * 4G + 4 (l // N) + r % 4``. Products and sums are computed in binary64 and rounded once
to binary32 (the hardware's internal order of accumulation is unspecified; results agree within f32 rounding).

fp8 per target: gfx942 (CDNA3) decodes fp8/bf8 as E4M3FNUZ/E5M2FNUZ (exponent bias 8/16, 0x80 = NaN, no infinity);
gfx950 (CDNA4) as OCP E4M3FN/E5M2 (bias 7/15).

gfx950's ``v_mfma_f32_{16x16x128,32x32x64}_f8f6f4`` and the block-scaled ``v_mfma_scale_f32_*_f8f6f4`` take each
operand's format from ``cbsz`` (A) and ``blgp`` (B): 0 = fp8 E4M3, 1 = bf8 E5M2, 2/3 = fp6 E2M3/E3M2, 4 = fp4 E2M1
(LLVM's encoding). Each lane holds 32 elements of its row/column. Which ``k`` lane group g (lane // M, of G = 64 / M)
holds (AMD's CDNA4 matrix-core layouts: the "Matrix Core Programming on CDNA3 and CDNA4" blog's 32x32x64 figures,
the opus mxfp tests' 16x16x128 loads): 8-bit formats (8 VGPRs) hold element e at k = 32 (e // c) + c g + e % c with
c = 32 / G (16 for 32x32x64, 8 for 16x16x128: a slice of every 32-wide k block); fp4 (4 VGPRs, low nibble first)
holds k = 32 g + e (the whole block g). fp6 (6 VGPRs, packing not modelled) is refused by name.

The scaled form adds an E8M0 scale (2**(s - 127); 255 = NaN) per 32-wide k block of each row of A and column of B:
lane l supplies the scale of row/column l % M for block l // M, from byte op_sel[i] + 2 op_sel_hi[i] of its scale
VGPR (i = 0 for A, 1 for B; how LLVM encodes the intrinsic's scale opsel). D = C + sum over blocks b of
scaleA[i, b] scaleB[b, j] sum_{k in b} A[i, k] B[k, j].
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from flyship.loader.emulate.decode import Inst
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.state import LANES, Wave, vdst, write_v

_NAME = re.compile(r"^v_mfma_(scale_)?f32_(\d+)x(\d+)x(\d+)_?(f32|xf32|f16|bf16|fp8_fp8|fp8_bf8|bf8_fp8|bf8_bf8|f8f6f4)(_1k)?$")
_F8F6F4 = {0: "fp8", 1: "bf8", 4: "fp4"}  # cbsz/blgp format codes modelled (2/3 = fp6: refused)
_BITS = {"f32": 32, "f16": 16, "bf16": 16, "fp8": 8, "bf8": 8, "fp4": 4}
# OCP E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; no inf/NaN
_FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def fp8_table(fmt: str) -> np.ndarray:
    """The 256 values of an 8-bit float format: ``e4m3fnuz``, ``e5m2fnuz`` (gfx942), ``e4m3fn``, ``e5m2`` (OCP)."""
    ebits, mbits = (4, 3) if fmt.startswith("e4m3") else (5, 2)
    bias = {"e4m3fnuz": 8, "e5m2fnuz": 16, "e4m3fn": 7, "e5m2": 15}[fmt]
    out = np.empty(256, np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
        if e == 0:
            v = m / (1 << mbits) * 2.0 ** (1 - bias)
        else:
            v = (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
        v = -v if s else v
        if fmt.endswith("fnuz") and b == 0x80:
            v = np.nan
        elif fmt == "e4m3fn" and e == 15 and m == 7:
            v = np.nan
        elif fmt == "e5m2" and e == 31:
            v = np.nan if m else (-np.inf if s else np.inf)
        out[b] = v
    return out


_FP8 = {"gfx942": {"fp8": fp8_table("e4m3fnuz"), "bf8": fp8_table("e5m2fnuz")},
        "gfx950": {"fp8": fp8_table("e4m3fn"), "bf8": fp8_table("e5m2")}}


def _elements(rows: np.ndarray, ty: str, target: str) -> np.ndarray:
    """Registers [nregs, waves, 64] (uint32) -> per-lane elements [waves, 64, n] as float64."""
    raw = np.ascontiguousarray(rows.transpose(1, 2, 0)).view(np.uint8)  # [waves, 64, 4*nregs], little-endian
    if ty == "f32":
        return raw.view(np.float32).astype(np.float64)
    if ty == "f16":
        return raw.view(np.float16).astype(np.float64)
    if ty == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if ty == "fp4":
        return _FP4[np.stack([raw & 15, raw >> 4], axis=-1).reshape(*raw.shape[:-1], -1)]
    arch = "gfx950" if target.startswith("gfx95") else "gfx942"
    return _FP8[arch][ty][raw]


def _k_of(ty: str, lane: np.ndarray, M: int, kpl: int, f8f6f4: bool) -> np.ndarray:
    """k of each (lane, element) of an A/B operand."""
    g = (lane // M)[:, None]
    e = np.arange(kpl)[None, :]
    if not f8f6f4:
        return g * kpl + e
    if ty == "fp4":
        return 32 * g + e
    c = 32 * M // LANES
    return 32 * (e // c) + c * g + e % c


def _scales(inst: Inst, where: str):
    """The scaled MFMA's E8M0 scale readers: wave -> per-lane scale factors [waves, 64] for A and for B."""
    from flyship.loader.emulate.state import src
    sel, hi = (inst.modifier(mod) for mod in ("op_sel", "op_sel_hi"))
    if hi is None:
        raise refuse(f"`{where}`: {inst.mnemonic} without op_sel_hi in the disassembly is not modelled")
    bits = [[int(b) for b in (v or "[0,0,0]").strip("[]").split(",")] for v in (sel, hi)]
    readers = []
    for i, tok in enumerate(inst.operands[4:6]):
        shift = np.uint32(8 * (bits[0][i] + 2 * bits[1][i]))
        readers.append((src(tok, "b", 32, where), shift))

    def factors(w: Wave):
        out = []
        for rd, shift in readers:
            e = (np.broadcast_to(np.asarray(rd(w), np.uint32), w.mask.shape) >> shift) & np.uint32(0xFF)
            out.append(np.where(e == 255, np.nan, np.ldexp(1.0, e.astype(np.int64) - 127)))
        return out
    return factors


def compile_mfma(inst: Inst, where: str, target: str) -> Callable[[Wave], None]:
    m = _NAME.match(inst.mnemonic)
    if m is None:
        raise refuse(f"`{where}`: {inst.mnemonic} (this MFMA shape/type is not modelled)")
    M, N, K = int(m.group(2)), int(m.group(3)), int(m.group(4))
    scaled = m.group(1) is not None
    tys = m.group(5)
    if scaled and (tys != "f8f6f4" or len(inst.operands) != 6):
        raise refuse(f"`{where}`: {inst.mnemonic} (expected D, A, B, C and two scale operands) is not modelled")
    f8f6f4 = tys == "f8f6f4"
    if f8f6f4:
        fmts = [int(inst.modifier(mod, "0"), 0) for mod in ("cbsz", "blgp")]
        if not target.startswith("gfx95") or any(f not in _F8F6F4 for f in fmts):
            raise refuse(f"`{where}`: {inst.mnemonic} with formats cbsz:{fmts[0]} blgp:{fmts[1]} on {target} is not "
                         "modelled (only fp8/bf8/fp4 operands on gfx950)")
        tys = "_".join(_F8F6F4[f] for f in fmts)
        if int(inst.modifier("abid", "0"), 0) != 0:
            raise refuse(f"`{where}`: {inst.mnemonic} with abid is not modelled")
    else:
        for mod in ("cbsz", "abid", "blgp"):
            if int(inst.modifier(mod, "0"), 0) != 0:
                raise refuse(f"`{where}`: {inst.mnemonic} with {mod} (broadcast controls) is not modelled")
    if tys == "xf32":
        raise refuse(f"`{where}`: {inst.mnemonic} (xf32) is not modelled")
    ta, tb = (tys.split("_") if "_" in tys else (tys, tys))
    if M != N or M not in (16, 32):
        raise refuse(f"`{where}`: {inst.mnemonic}: only single-block 16x16 and 32x32 shapes are modelled")
    G = LANES // M
    kpl = K // G
    drow, dn = vdst(inst.operands[0], where)
    arow, an = vdst(inst.operands[1], where)
    brow, bn = vdst(inst.operands[2], where)
    if inst.operands[3] in ("0", "0.0"):
        crow, cn = -1, dn
    else:
        crow, cn = vdst(inst.operands[3], where)
    if dn != M * N // LANES or an * 32 != kpl * _BITS[ta] or bn * 32 != kpl * _BITS[tb]:
        raise refuse(f"`{where}`: {inst.mnemonic}: operand sizes do not match a single-block layout "
                     f"(D {dn} regs, A {an}, B {bn})")
    lane = np.arange(LANES)
    i_of = lane % M
    ka, kb = (_k_of(t, lane, M, kpl, f8f6f4) for t in (ta, tb))
    r = np.arange(dn)
    drow_of = (r[:, None] // 4) * 4 * G + 4 * (lane[None, :] // N) + r[:, None] % 4  # [dn, 64]
    dcol_of = np.broadcast_to(lane % N, (dn, LANES))

    # Each layout is a bijection between (lane, element) and the matrix's entries: gather with its inverse.
    a_of = np.argsort((i_of[:, None] * K + ka).reshape(-1))             # A[i, k] <- lane-major element a_of[i*K+k]
    b_of = np.argsort((kb * N + (lane % N)[:, None]).reshape(-1))       # B[k, j]
    scales = _scales(inst, where) if scaled else None
    blocks = np.arange(K) // 32  # the scale block of each k
    d_flat = (drow_of * N + dcol_of).reshape(-1)                        # D entry of register-major (r, lane)
    c_of = np.argsort(d_flat)

    def mfma(w: Wave) -> None:  # every wave of the batch at once: [waves, M, K] @ [waves, K, N]
        n = w.n
        A = _elements(w.V[arow:arow + an], ta, target).reshape(n, -1)[:, a_of].reshape(n, M, K)
        B = _elements(w.V[brow:brow + bn], tb, target).reshape(n, -1)[:, b_of].reshape(n, K, N)
        if scales is not None:  # lane l: row/column l % M, block l // M
            sa, sb = (f.reshape(n, K // 32, M) for f in scales(w))
            A = A * sa.transpose(0, 2, 1)[:, :, blocks]
            B = B * sb[:, blocks, :]
        D = A @ B
        if crow >= 0:
            D += w.V[crow:crow + cn].view(np.float32).transpose(1, 0, 2).reshape(n, -1)[:, c_of].reshape(n, M, N)
        out = D.astype(np.float32).reshape(n, -1)[:, d_flat].view(np.uint32).reshape(n, dn, LANES)
        for q in range(dn):
            write_v(w, drow + q, out[:, q])
    return mfma


def fp8_encode(x: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    """binary32 -> 8-bit float codes, round to nearest even (ties to the even code); NaN -> the format's NaN;
    beyond the largest finite value: saturate to it (``clamp``), else NaN (infinity for OCP E5M2)."""
    table = fp8_table(fmt)
    pos = np.arange(128)
    finite = pos[np.isfinite(table[:128])]
    vals = table[finite]
    order = np.argsort(vals, kind="stable")
    vals, codes = vals[order], finite[order]
    vals, first = np.unique(vals, return_index=True)  # +0 once
    codes = codes[first]
    x = np.asarray(x, np.float32).astype(np.float64)
    a = np.abs(x)
    hi = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)
    lo = hi - 1
    dl, dh = a - vals[lo], vals[hi] - a
    pick = np.where((dh < dl) | ((dh == dl) & (codes[hi] % 2 == 0)), codes[hi], codes[lo])
    top = vals[-1]
    half_ulp = (vals[-1] - vals[-2]) / 2
    over = a >= top + half_ulp
    nan_code = 0x80 if fmt.endswith("fnuz") else 0x7F
    over_code = codes[-1] if saturate else (0x7C if fmt == "e5m2" else nan_code)
    pick = np.where(over, over_code, pick)
    sign = np.where(np.signbit(x) & (pick != 0) | (np.signbit(x) & ~fmt.endswith("fnuz")), 0x80, 0)
    out = (pick | sign) & 0xFF
    if fmt.endswith("fnuz"):
        out = np.where((pick == 0), 0, out)  # FNUZ has no negative zero
    out = np.where(np.isnan(x), nan_code, out)
    if not saturate and fmt.endswith("fnuz"):
        out = np.where(over, nan_code, out)
    return out.astype(np.uint32)


def compile_cvt_pk_fp8(inst: Inst, where: str, target: str) -> Callable[[Wave], None]:
    """v_cvt_pk_fp8_f32 / v_cvt_pk_bf8_f32 d, a, b [op_sel:[0,0,1]]: two binary32 values to fp8/bf8 codes in
    bytes 0-1 (or 2-3 with the destination op_sel bit) of d, the other half kept; the format per target."""
    from flyship.loader.emulate.state import src
    m = inst.mnemonic.replace("_e64", "")
    kind = "fp8" if "fp8" in m else "bf8"
    arch = "gfx950" if target.startswith("gfx95") else "gfx942"
    fmt = {("gfx942", "fp8"): "e4m3fnuz", ("gfx942", "bf8"): "e5m2fnuz", ("gfx950", "fp8"): "e4m3fn",
           ("gfx950", "bf8"): "e5m2"}[(arch, kind)]
    sel = inst.modifier("op_sel")
    word = int(sel.strip("[]").split(",")[-1]) if sel else 0
    sat = inst.modifier("clamp") is not None
    drow, _ = vdst(inst.operands[0], where)
    a, b = (src(t, "f", 32, where) for t in inst.operands[1:3])

    def cvt(w: Wave) -> None:
        lo = fp8_encode(np.asarray(a(w), np.uint32).view(np.float32), fmt, sat)
        hi = fp8_encode(np.asarray(b(w), np.uint32).view(np.float32), fmt, sat)
        pair = lo | (hi << np.uint32(8))
        old = w.V[drow]
        out = (old & np.uint32(0xFFFF0000)) | pair if word == 0 else (old & np.uint32(0xFFFF)) | (pair << np.uint32(16))
        write_v(w, drow, out)
    return cvt
