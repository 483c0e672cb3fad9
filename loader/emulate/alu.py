"""Vector ALU semantics: one numpy function per operation over the 64 lanes (uint32 / uint64 bit patterns in,
bit patterns out). Floats are computed in numpy's IEEE binary32/binary64 (round to nearest even); fused
multiply-adds are computed in binary64 and rounded once to binary32 (exact product; the sum can differ from a true
fused result by double rounding in rare ties). Transcendentals (v_exp/v_log/v_rcp/v_rsq/v_sqrt/v_sin/v_cos) are
computed exactly and rounded, where the hardware is within 1 ulp.
"""

from __future__ import annotations

import numpy as np

u32, u64, f32, f64 = np.uint32, np.uint64, np.float32, np.float64
M32 = u32(0xFFFFFFFF)


def F(x):
    return np.asarray(x, u32).view(f32)


def U(y):
    return np.asarray(y, f32).view(u32)


def F64(x):
    return np.asarray(x, u64).view(f64)


def U64(y):
    return np.asarray(y, f64).view(u64)


def H(x):
    return (np.asarray(x, u32) & u32(0xFFFF)).astype(np.uint16).view(np.float16)


def UH(y):
    return np.asarray(y, np.float16).view(np.uint16).astype(u32)


def I(x):
    return np.asarray(x, u32).view(np.int32)


def bf16_to_f32(x):
    return F((np.asarray(x, u32) & u32(0xFFFF)) << u32(16))


def f32_to_bf16(y):
    """Round to nearest even; NaN stays a quiet NaN. In uint32: only NaN bit patterns can wrap, and they are
    replaced."""
    b = U(y)
    r = ((b + u32(0x7FFF) + ((b >> u32(16)) & u32(1))) >> u32(16))
    nan = (b & u32(0x7FFFFFFF)) > u32(0x7F800000)
    return np.where(nan, (b >> u32(16)) | u32(0x40), r).astype(u32)


def fma32(a, b, c):
    return U((F(a).astype(f64) * F(b).astype(f64) + F(c).astype(f64)).astype(f32))


def flush32(bits):
    """Flush binary32 denormals to signed zero (FLOAT_DENORM_MODE_32 != 3)."""
    b = np.asarray(bits, u32)
    return np.where((b & u32(0x7F800000)) == 0, b & u32(0x80000000), b).astype(u32)


def _class(x, mask, is64=False):
    v = F64(x) if is64 else F(x).astype(f64)
    bits = np.asarray(x, u64 if is64 else u32)
    m = np.asarray(mask, u32)
    neg = np.signbit(v)
    nan = np.isnan(v)
    quiet_bit = u64(1 << 51) if is64 else u32(1 << 22)
    q = nan & ((bits & quiet_bit) != 0)
    s = nan & ~q
    inf = np.isinf(v)
    zero = v == 0
    tiny = f64(2.2250738585072014e-308) if is64 else f64(1.1754943508222875e-38)
    den = ~zero & ~nan & ~inf & (np.abs(v) < tiny)
    nor = ~zero & ~nan & ~inf & ~den
    out = np.zeros(np.broadcast(bits, m).shape, bool)
    for bit, c in enumerate((s, q, inf & neg, nor & neg, den & neg, zero & neg, zero & ~neg, den & ~neg,
                             nor & ~neg, inf & ~neg)):
        out |= c & (((m >> u32(bit)) & u32(1)) != 0)
    return out


def div_fixup32(q, d, n):
    qf, df, nf = F(q), F(d), F(n)
    sign = (U(df) ^ U(nf)) & u32(0x80000000)
    inf = sign | u32(0x7F800000)
    zero = sign
    out = np.asarray(U(qf)).copy() if np.ndim(U(qf)) else np.broadcast_to(U(qf), np.broadcast(qf, df, nf).shape).copy()
    out = np.broadcast_to(out, np.broadcast(qf, df, nf).shape).copy()
    nan = np.isnan(df) | np.isnan(nf) | ((df == 0) & (nf == 0)) | (np.isinf(df) & np.isinf(nf))
    to_inf = ~nan & ((df == 0) | np.isinf(nf))
    to_zero = ~nan & ~to_inf & (np.isinf(df) | (nf == 0))
    out = np.where(to_inf, inf, out)
    out = np.where(to_zero, zero, out)
    out = np.where(nan, u32(0x7FC00000), out)
    return out.astype(u32)


def perm_b32(a, b, sel):
    """v_perm_b32 (ISA "V_PERM_B32"): byte i of the result is chosen by byte i of the selector from the eight
    bytes {a, b} (b = bytes 0-3, a = bytes 4-7); 8-11 replicate the sign bit of bytes 1, 3, 5, 7; 12 gives 0x00,
    13-15 give 0xFF."""
    if np.ndim(sel) == 0:  # a constant selector (as compilers emit it): one shift and mask per byte
        return _perm_const(a, b, int(sel))
    shape = np.broadcast(np.asarray(a), np.asarray(b), np.asarray(sel)).shape
    a, b, sel = (np.ascontiguousarray(np.broadcast_to(np.asarray(x, u32), shape)).reshape(-1) for x in (a, b, sel))
    src = np.empty((16, a.size), np.uint8)
    src[0:4] = b.view(np.uint8).reshape(-1, 4).T
    src[4:8] = a.view(np.uint8).reshape(-1, 4).T
    src[8:12] = np.where(src[1:8:2] >= 0x80, 0xFF, 0)
    src[12] = 0
    src[13:16] = 0xFF
    idx = np.minimum(sel.view(np.uint8).reshape(-1, 4).T, 15).astype(np.intp)  # [4, n]
    picked = np.take_along_axis(src, idx, axis=0)
    return np.ascontiguousarray(picked.T).view(u32).reshape(shape)


def _perm_const(a, b, sel: int):
    x = (np.asarray(a, u32).astype(u64) << u64(32)) | np.asarray(b, u32).astype(u64)
    out = u64(0)
    for i in range(4):
        k = (sel >> (8 * i)) & 0xFF
        if k < 8:
            byte = (x >> u64(8 * k)) & u64(0xFF)
        elif k < 12:
            byte = ((x >> u64(8 * (2 * (k - 8) + 1) + 7)) & u64(1)) * u64(0xFF)
        else:
            byte = u64(0 if k == 12 else 0xFF)
        out = out | (byte << u64(8 * i))
    return np.asarray(out, u64).astype(u32)


def bitop3(a, b, c, table: int):
    out = np.zeros(np.broadcast(a, b, c).shape, u32)
    a, b, c = (np.asarray(x, u32) for x in (a, b, c))
    for idx in range(8):
        if table >> idx & 1:
            out |= (a if idx & 4 else ~a) & (b if idx & 2 else ~b) & (c if idx & 1 else ~c)
    return out


def bfe(a, off, width, signed):
    a = np.asarray(a, u32).astype(u64)
    o = np.asarray(off, u32).astype(u64) & u64(31)
    wd = np.asarray(width, u32).astype(u64) & u64(31)
    r = (a >> o) & ((u64(1) << wd) - u64(1))
    if signed:
        sh = (u64(64) - wd) % u64(64)
        r = np.where(wd == 0, u64(0), ((r << sh).view(np.int64) >> sh.astype(np.int64)).view(u64))
    return (r & u64(0xFFFFFFFF)).astype(u32)


def cvt_i32_f32(a):
    x = F(a).astype(f64)
    t = np.trunc(np.nan_to_num(x, nan=0.0))
    return np.clip(t, -2147483648.0, 2147483647.0).astype(np.int64).astype(np.int32).view(u32)


def cvt_u32_f32(a):
    x = F(a).astype(f64)
    t = np.trunc(np.nan_to_num(x, nan=0.0))
    return np.clip(t, 0.0, 4294967295.0).astype(np.int64).astype(u32)


def maximum3(a, b, c):
    return U(np.maximum(np.maximum(F(a), F(b)), F(c)))


def minimum3(a, b, c):
    return U(np.minimum(np.minimum(F(a), F(b)), F(c)))


def med3(x, y, z, mx=np.maximum):
    """V_MED3_* (ISA pseudo-code): if max3(S0, S1, S2) == S0, max(S1, S2); elif it == S1, max(S0, S2); else
    max(S0, S1). ``x, y, z`` are values (ints or floats), ``mx`` the type's max."""
    m = mx(mx(x, y), z)
    return np.where(m == x, mx(y, z), np.where(m == y, mx(x, z), mx(x, y)))


def med3_float(x, y, z):
    """V_MED3_F32/F16: the integer rule, except that a NaN operand gives min3(S0, S1, S2) (IEEE min: the
    smaller of the non-NaN operands)."""
    nan = np.isnan(x) | np.isnan(y) | np.isnan(z)
    return np.where(nan, np.fmin(np.fmin(x, y), z), med3(x, y, z, np.fmax)).astype(np.result_type(x, y, z))


def med3_f32(a, b, c):
    return U(med3_float(F(a), F(b), F(c)))


def _sh(x, n):
    return np.asarray(x, u32) << (np.asarray(n, u32) & u32(31))


def _i24(x):
    return ((np.asarray(x, u32) << u32(8)).view(np.int32) >> 8).astype(np.int64)


def _u24(x):
    return (np.asarray(x, u32) & u32(0xFFFFFF)).astype(np.int64)


def _w(x):
    return (np.asarray(x, np.int64) & 0xFFFFFFFF).astype(u32) if np.ndim(x) else np.uint32(int(x) & 0xFFFFFFFF)


# name -> (source types, destination type, fn). Types: f32 u32 i32 b32 f16 b16 f64 u64 b64.
# A few ops also need the wave's denorm mode (handled by the caller: f32 results of ops marked "f32" are flushed).
OPS: dict[str, tuple[tuple[str, ...], str, object]] = {
    "v_mov_b32": (("b32",), "b32", lambda a: a),
    "v_mov_b64": (("b64",), "b64", lambda a: a),
    "v_accvgpr_read_b32": (("b32",), "b32", lambda a: a),
    "v_accvgpr_write_b32": (("b32",), "b32", lambda a: a),
    "v_accvgpr_mov_b32": (("b32",), "b32", lambda a: a),
    "v_not_b32": (("b32",), "b32", lambda a: ~np.asarray(a, u32)),
    "v_bfrev_b32": (("b32",), "b32", lambda a: np.asarray(
        [int(f"{int(v):032b}"[::-1], 2) for v in np.atleast_1d(a)], u32).reshape(np.shape(a))),
    "v_ffbh_u32": (("u32",), "u32", lambda a: np.where(np.asarray(a, u32) == 0, M32, u32(31) - np.floor(
        np.log2(np.maximum(np.asarray(a, u32), 1).astype(f64))).astype(u32))),
    "v_ffbl_b32": (("b32",), "b32", lambda a: np.where(np.asarray(a, u32) == 0, M32, np.log2(
        (np.asarray(a, u32).astype(np.int64) & -np.asarray(a, u32).astype(np.int64)).astype(f64) + (
            np.asarray(a, u32) == 0)).astype(u32))),
    "v_cvt_f32_i32": (("i32",), "f32", lambda a: U(I(a).astype(f32))),
    "v_cvt_f32_u32": (("u32",), "f32", lambda a: U(np.asarray(a, u32).astype(f32))),
    "v_cvt_i32_f32": (("f32",), "i32", cvt_i32_f32),
    "v_cvt_u32_f32": (("f32",), "u32", cvt_u32_f32),
    "v_cvt_f32_f16": (("f16",), "f32", lambda a: U(H(a).astype(f32))),
    "v_cvt_f16_f32": (("f32",), "b32", lambda a: UH(F(a).astype(np.float16))),
    "v_cvt_f32_bf16": (("b16",), "f32", lambda a: U(bf16_to_f32(a))),
    "v_cvt_f32_ubyte0": (("u32",), "f32", lambda a: U((np.asarray(a, u32) & u32(0xFF)).astype(f32))),
    "v_cvt_f32_ubyte1": (("u32",), "f32", lambda a: U(((np.asarray(a, u32) >> u32(8)) & u32(0xFF)).astype(f32))),
    "v_cvt_f32_ubyte2": (("u32",), "f32", lambda a: U(((np.asarray(a, u32) >> u32(16)) & u32(0xFF)).astype(f32))),
    "v_cvt_f32_ubyte3": (("u32",), "f32", lambda a: U((np.asarray(a, u32) >> u32(24)).astype(f32))),
    "v_cvt_f64_f32": (("f32",), "f64", lambda a: U64(F(a).astype(f64))),
    "v_cvt_f32_f64": (("f64",), "f32", lambda a: U(F64(a).astype(f32))),
    "v_exp_f32": (("f32",), "f32", lambda a: U(np.exp2(F(a).astype(f64)).astype(f32))),
    "v_log_f32": (("f32",), "f32", lambda a: U(np.log2(F(a).astype(f64)).astype(f32))),
    "v_rcp_f32": (("f32",), "f32", lambda a: U((1.0 / F(a).astype(f64)).astype(f32))),
    "v_rcp_iflag_f32": (("f32",), "f32", lambda a: U((1.0 / F(a).astype(f64)).astype(f32))),
    "v_rsq_f32": (("f32",), "f32", lambda a: U((1.0 / np.sqrt(F(a).astype(f64))).astype(f32))),
    "v_sqrt_f32": (("f32",), "f32", lambda a: U(np.sqrt(F(a).astype(f64)).astype(f32))),
    "v_sin_f32": (("f32",), "f32", lambda a: U(np.sin(2 * np.pi * F(a).astype(f64)).astype(f32))),
    "v_cos_f32": (("f32",), "f32", lambda a: U(np.cos(2 * np.pi * F(a).astype(f64)).astype(f32))),
    "v_fract_f32": (("f32",), "f32", lambda a: U(F(a) - np.floor(F(a)))),
    "v_trunc_f32": (("f32",), "f32", lambda a: U(np.trunc(F(a)))),
    "v_ceil_f32": (("f32",), "f32", lambda a: U(np.ceil(F(a)))),
    "v_floor_f32": (("f32",), "f32", lambda a: U(np.floor(F(a)))),
    "v_rndne_f32": (("f32",), "f32", lambda a: U(np.rint(F(a)))),
    "v_add_f32": (("f32", "f32"), "f32", lambda a, b: U(F(a) + F(b))),
    "v_sub_f32": (("f32", "f32"), "f32", lambda a, b: U(F(a) - F(b))),
    "v_subrev_f32": (("f32", "f32"), "f32", lambda a, b: U(F(b) - F(a))),
    "v_mul_f32": (("f32", "f32"), "f32", lambda a, b: U(F(a) * F(b))),
    "v_max_f32": (("f32", "f32"), "f32", lambda a, b: U(np.fmax(F(a), F(b)))),
    "v_min_f32": (("f32", "f32"), "f32", lambda a, b: U(np.fmin(F(a), F(b)))),
    "v_ldexp_f32": (("f32", "i32"), "f32", lambda a, b: U(np.ldexp(F(a).astype(f64), np.clip(I(b), -400, 400)
                                                                   ).astype(f32))),
    "v_add_f64": (("f64", "f64"), "f64", lambda a, b: U64(F64(a) + F64(b))),
    "v_mul_f64": (("f64", "f64"), "f64", lambda a, b: U64(F64(a) * F64(b))),
    "v_fma_f64": (("f64", "f64", "f64"), "f64", lambda a, b, c: U64(F64(a) * F64(b) + F64(c))),
    "v_fma_f32": (("f32", "f32", "f32"), "f32", fma32),
    "v_mad_f32": (("f32", "f32", "f32"), "f32", lambda a, b, c: U(F(a) * F(b) + F(c))),
    "v_max3_f32": (("f32", "f32", "f32"), "f32", lambda a, b, c: U(np.fmax(np.fmax(F(a), F(b)), F(c)))),
    "v_min3_f32": (("f32", "f32", "f32"), "f32", lambda a, b, c: U(np.fmin(np.fmin(F(a), F(b)), F(c)))),
    "v_maximum3_f32": (("f32", "f32", "f32"), "f32", maximum3),
    "v_minimum3_f32": (("f32", "f32", "f32"), "f32", minimum3),
    "v_med3_f32": (("f32", "f32", "f32"), "f32", med3_f32),
    "v_div_fixup_f32": (("f32", "f32", "f32"), "f32", div_fixup32),
    "v_add_f16": (("f16", "f16"), "b32", lambda a, b: UH(H(a) + H(b))),
    "v_mul_f16": (("f16", "f16"), "b32", lambda a, b: UH(H(a) * H(b))),
    "v_cvt_pkrtz_f16_f32": (("f32", "f32"), "b32", lambda a, b: _pkrtz(a) | (_pkrtz(b) << u32(16))),
    "v_cvt_pk_bf16_f32": (("f32", "f32"), "b32", lambda a, b: f32_to_bf16(F(a)) | (f32_to_bf16(F(b)) << u32(16))),
    "v_cvt_pk_f16_f32": (("f32", "f32"), "b32", lambda a, b: UH(F(a).astype(np.float16)) | (
        UH(F(b).astype(np.float16)) << u32(16))),  # gfx950: round to nearest even
    "v_pack_b32_f16": (("b32", "b32"), "b32", lambda a, b: (np.asarray(a, u32) & u32(0xFFFF)) | (
        np.asarray(b, u32) << u32(16))),
    "v_and_b32": (("b32", "b32"), "b32", lambda a, b: np.asarray(a, u32) & b),
    "v_or_b32": (("b32", "b32"), "b32", lambda a, b: np.asarray(a, u32) | b),
    "v_xor_b32": (("b32", "b32"), "b32", lambda a, b: np.asarray(a, u32) ^ b),
    "v_lshlrev_b32": (("u32", "b32"), "b32", lambda a, b: _sh(b, a)),
    "v_lshrrev_b32": (("u32", "b32"), "b32", lambda a, b: np.asarray(b, u32) >> (np.asarray(a, u32) & u32(31))),
    "v_ashrrev_i32": (("u32", "i32"), "b32", lambda a, b: (I(b) >> (np.asarray(a, u32) & u32(31)).astype(
        np.int32)).view(u32)),
    "v_lshlrev_b64": (("u32", "b64"), "b64", lambda a, b: np.asarray(b, u64) << (np.asarray(a, u32) & u32(63)
                                                                               ).astype(u64)),
    "v_lshrrev_b64": (("u32", "b64"), "b64", lambda a, b: np.asarray(b, u64) >> (np.asarray(a, u32) & u32(63)
                                                                               ).astype(u64)),
    "v_ashrrev_i64": (("u32", "b64"), "b64", lambda a, b: (np.asarray(b, u64).view(np.int64) >> (
        np.asarray(a, u32) & u32(63)).astype(np.int64)).view(u64)),
    "v_add_u32": (("u32", "u32"), "u32", lambda a, b: np.asarray(a, u32) + b),
    "v_sub_u32": (("u32", "u32"), "u32", lambda a, b: np.asarray(a, u32) - b),
    "v_subrev_u32": (("u32", "u32"), "u32", lambda a, b: np.asarray(b, u32) - a),
    "v_max_i32": (("i32", "i32"), "i32", lambda a, b: np.maximum(I(a), I(b)).view(u32)),
    "v_min_i32": (("i32", "i32"), "i32", lambda a, b: np.minimum(I(a), I(b)).view(u32)),
    "v_max_u32": (("u32", "u32"), "u32", lambda a, b: np.maximum(np.asarray(a, u32), b)),
    "v_min_u32": (("u32", "u32"), "u32", lambda a, b: np.minimum(np.asarray(a, u32), b)),
    "v_mul_lo_u32": (("u32", "u32"), "u32", lambda a, b: np.asarray(a, u32) * np.asarray(b, u32)),
    "v_mul_hi_u32": (("u32", "u32"), "u32", lambda a, b: ((np.asarray(a, u32).astype(u64) * np.asarray(
        b, u32).astype(u64)) >> u64(32)).astype(u32)),
    "v_mul_hi_i32": (("i32", "i32"), "u32", lambda a, b: ((I(a).astype(np.int64) * I(b).astype(np.int64)) >> 32
                                                          ).astype(np.int32).view(u32)),
    "v_mul_u32_u24": (("u32", "u32"), "u32", lambda a, b: _w(_u24(a) * _u24(b))),
    "v_mul_i32_i24": (("u32", "u32"), "u32", lambda a, b: _w(_i24(a) * _i24(b))),
    "v_mul_hi_u32_u24": (("u32", "u32"), "u32", lambda a, b: _w((_u24(a) * _u24(b)) >> 32)),
    "v_mad_u32_u24": (("u32", "u32", "u32"), "u32", lambda a, b, c: _w(_u24(a) * _u24(b) + np.asarray(
        c, u32).astype(np.int64))),
    "v_mad_i32_i24": (("u32", "u32", "u32"), "u32", lambda a, b, c: _w(_i24(a) * _i24(b) + I(c).astype(np.int64))),
    "v_bfe_u32": (("u32", "u32", "u32"), "u32", lambda a, b, c: bfe(a, b, c, False)),
    "v_bfe_i32": (("u32", "u32", "u32"), "u32", lambda a, b, c: bfe(a, b, c, True)),
    "v_bfi_b32": (("b32", "b32", "b32"), "b32", lambda a, b, c: (np.asarray(a, u32) & b) | (~np.asarray(a, u32) & c)),
    "v_alignbit_b32": (("b32", "b32", "u32"), "b32", lambda a, b, c: ((
        (np.asarray(a, u32).astype(u64) << u64(32)) | np.asarray(b, u32).astype(u64)) >> (
        np.asarray(c, u32) & u32(31)).astype(u64)).astype(u32)),
    "v_alignbyte_b32": (("b32", "b32", "u32"), "b32", lambda a, b, c: ((
        (np.asarray(a, u32).astype(u64) << u64(32)) | np.asarray(b, u32).astype(u64)) >> (
        (np.asarray(c, u32) & u32(3)) * u32(8)).astype(u64)).astype(u32)),
    "v_perm_b32": (("b32", "b32", "b32"), "b32", perm_b32),
    "v_lshl_add_u32": (("u32", "u32", "u32"), "u32", lambda a, b, c: _sh(a, b) + np.asarray(c, u32)),
    "v_add_lshl_u32": (("u32", "u32", "u32"), "u32", lambda a, b, c: _sh(np.asarray(a, u32) + b, c)),
    "v_lshl_or_b32": (("b32", "u32", "b32"), "b32", lambda a, b, c: _sh(a, b) | np.asarray(c, u32)),
    "v_and_or_b32": (("b32", "b32", "b32"), "b32", lambda a, b, c: (np.asarray(a, u32) & b) | c),
    "v_or3_b32": (("b32", "b32", "b32"), "b32", lambda a, b, c: np.asarray(a, u32) | b | c),
    "v_xor3_b32": (("b32", "b32", "b32"), "b32", lambda a, b, c: np.asarray(a, u32) ^ b ^ c),
    "v_add3_u32": (("u32", "u32", "u32"), "u32", lambda a, b, c: np.asarray(a, u32) + b + c),
    "v_xad_u32": (("u32", "u32", "u32"), "u32", lambda a, b, c: (np.asarray(a, u32) ^ b) + c),
    "v_max3_i32": (("i32", "i32", "i32"), "i32", lambda a, b, c: np.maximum(np.maximum(I(a), I(b)), I(c)).view(u32)),
    "v_min3_i32": (("i32", "i32", "i32"), "i32", lambda a, b, c: np.minimum(np.minimum(I(a), I(b)), I(c)).view(u32)),
    "v_max3_u32": (("u32", "u32", "u32"), "u32", lambda a, b, c: np.maximum(np.maximum(np.asarray(a, u32), b), c)),
    "v_med3_i32": (("i32", "i32", "i32"), "i32", lambda a, b, c: med3(I(a), I(b), I(c)).astype(np.int32).view(u32)),
    "v_med3_u32": (("u32", "u32", "u32"), "u32", lambda a, b, c: med3(
        np.asarray(a, u32), np.asarray(b, u32), np.asarray(c, u32)).astype(u32)),
    "v_min3_u32": (("u32", "u32", "u32"), "u32", lambda a, b, c: np.minimum(np.minimum(np.asarray(a, u32), b), c)),
    "v_lshl_add_u64": (("u64", "u32", "u64"), "u64", lambda a, b, c: (np.asarray(a, u64) << (
        np.asarray(b, u32) & u32(63)).astype(u64)) + np.asarray(c, u64)),
    "v_lshlrev_b16": (("u32", "b32"), "b32", lambda a, b: (np.asarray(b, u32) << (np.asarray(a, u32) & u32(15))
                                                          ) & u32(0xFFFF)),
    # 16-bit VOP2 (GFX9: the low halves of the sources; the result zero-extended, as LLVM's zeroesHigh16BitsOfDest
    # says of GFX9). Typed u32 so that SDWA's source selects apply.
    "v_lshrrev_b16": (("u32", "u32"), "u32", lambda a, b: (np.asarray(b, u32) & u32(0xFFFF)) >> (
        np.asarray(a, u32) & u32(15))),
    "v_ashrrev_i16": (("u32", "u32"), "u32", lambda a, b: _lo16((_s16(b) >> (np.asarray(a, u32) & u32(15)
                                                                         ).astype(np.int32)))),
    "v_add_u16": (("u32", "u32"), "u32", lambda a, b: _lo16(np.asarray(a, u32) + b)),
    "v_sub_u16": (("u32", "u32"), "u32", lambda a, b: _lo16(np.asarray(a, u32) - b)),
    "v_subrev_u16": (("u32", "u32"), "u32", lambda a, b: _lo16(np.asarray(b, u32) - a)),
    "v_mul_lo_u16": (("u32", "u32"), "u32", lambda a, b: _lo16(np.asarray(a, u32) * b)),
    "v_max_u16": (("u32", "u32"), "u32", lambda a, b: np.maximum(_lo16(a), _lo16(b))),
    "v_min_u16": (("u32", "u32"), "u32", lambda a, b: np.minimum(_lo16(a), _lo16(b))),
    "v_max_i16": (("u32", "u32"), "u32", lambda a, b: _lo16(np.maximum(_s16(a), _s16(b)))),
    "v_min_i16": (("u32", "u32"), "u32", lambda a, b: _lo16(np.minimum(_s16(a), _s16(b)))),
}


def _lo16(x):
    return (np.asarray(x).astype(np.int64) & 0xFFFF).astype(u32)


def _s16(x):
    return (np.asarray(x, u32) & u32(0xFFFF)).astype(np.uint16).view(np.int16).astype(np.int32)


def _pkrtz(a):
    x = F(a)
    h = x.astype(np.float16)
    # round toward zero: step back one f16 ulp where rounding went away from zero
    hb = np.asarray(h).view(np.uint16).astype(np.int32)
    away = np.isfinite(x) & np.isfinite(np.asarray(h, f32)) & (np.abs(np.asarray(h, f32)) > np.abs(x))
    hb = np.where(away, hb - 1, hb)
    ovf = np.isfinite(x) & np.isinf(np.asarray(h, f32))
    hb = np.where(ovf, (hb & 0x8000) | 0x7BFF, hb)
    return (hb & 0xFFFF).astype(u32)


def cmp_fn(rel: str, ty: str):
    """The per-lane predicate of v_cmp_<rel>_<ty> (ISA "VOPC": ordered/unordered float compares)."""
    fl = ty.startswith("f")
    conv = {"f32": F, "f64": F64, "f16": H, "i32": I, "u32": lambda x: np.asarray(x, u32),
            "i64": lambda x: np.asarray(x, u64).view(np.int64), "u64": lambda x: np.asarray(x, u64),
            "i16": lambda x: (np.asarray(x, u32) & u32(0xFFFF)).astype(np.uint16).view(np.int16),
            "u16": lambda x: (np.asarray(x, u32) & u32(0xFFFF)).astype(np.uint16)}[ty]
    base = {"lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater, "lg": np.not_equal,
            "ne": np.not_equal, "ge": np.greater_equal}
    if rel in ("f", "t", "tru"):
        val = rel != "f"
        return lambda a, b: np.full(np.broadcast(a, b).shape, val)
    if fl and rel == "o":
        return lambda a, b: ~(np.isnan(conv(a)) | np.isnan(conv(b)))
    if fl and rel == "u":
        return lambda a, b: np.isnan(conv(a)) | np.isnan(conv(b))
    if fl and rel.startswith("n") and rel != "ne":
        inner = base[rel[1:]]
        return lambda a, b: ~inner(conv(a), conv(b))
    if fl and rel == "lg":
        return lambda a, b: (conv(a) != conv(b)) & ~(np.isnan(conv(a)) | np.isnan(conv(b)))
    if fl and rel == "neq":
        return lambda a, b: ~np.equal(conv(a), conv(b))
    op = base[rel]
    return lambda a, b: op(conv(a), conv(b))


def class_fn(ty: str):
    return (lambda a, b: _class(a, b, ty == "f64"))


# 16-bit three-operand ops (VOP3 with op_sel): name -> (operand kind, fn over numpy values of the type).
OPS16 = {
    "v_med3_f16": ("f", med3_float), "v_med3_i16": ("i", med3), "v_med3_u16": ("u", med3),
    "v_max3_f16": ("f", lambda x, y, z: np.fmax(np.fmax(x, y), z)),
    "v_min3_f16": ("f", lambda x, y, z: np.fmin(np.fmin(x, y), z)),
    "v_max3_i16": ("i", lambda x, y, z: np.maximum(np.maximum(x, y), z)),
    "v_min3_i16": ("i", lambda x, y, z: np.minimum(np.minimum(x, y), z)),
    "v_max3_u16": ("u", lambda x, y, z: np.maximum(np.maximum(x, y), z)),
    "v_min3_u16": ("u", lambda x, y, z: np.minimum(np.minimum(x, y), z)),
}
HALF_TYPES = {"f": np.float16, "i": np.int16, "u": np.uint16}
