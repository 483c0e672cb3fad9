"""Scalar ALU (SOP1/SOP2/SOPC/SOPK), scalar memory (SMEM) and program control (SOPP) with ISA semantics.

Each handler is compiled from a decoded instruction to a closure ``f(batch) -> None | int | array`` over a batch of
waves (scalar values are uint64 vectors, one entry per wave): None steps to the next instruction, an int is the
index of the next one (a taken branch), ``END`` ends the waves, ``BARRIER`` parks them; a conditional branch whose
waves disagree returns each wave's next index (an int64 array).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from flyship.loader.emulate.decode import Inst
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.state import EXEC, VCC, Wave, parse_const, parse_reg, write_s, write_scc

END = -1
BARRIER = -2
u64, i64 = np.uint64, np.int64
M32, M64 = u64(0xFFFFFFFF), u64((1 << 64) - 1)
_SIGN32 = i64(0x80000000)


def _sx(v: int, bits: int) -> int:
    """Python-int sign extension (for compile-time constants)."""
    return v - (1 << bits) if v >> (bits - 1) & 1 else v


def sx32(a):
    """32-bit values (uint64) as signed int64."""
    return ((np.asarray(a, u64) & M32).astype(i64) ^ _SIGN32) - _SIGN32


def sx64(a):
    return np.asarray(a, u64).view(i64)


def _u(x, m=M32):
    """int64 results back to uint64 bit patterns of the operation's width."""
    return np.asarray(x, i64).astype(u64) & m


def ssrc(tok: str, bits: int, where: str) -> Callable[[Wave], object]:
    """A scalar source as unsigned values of ``bits`` (32 or 64): a uint64 vector [n] (one per wave) or a uint64
    scalar (a constant)."""
    r = parse_reg(tok)
    if r is not None:
        file, idx, _ = r
        if file != "s":
            raise refuse(f"scalar operand {tok!r} of `{where}`: expected an SGPR or constant")
        if bits == 64:
            return lambda w: w.s[idx] | (w.s[idx + 1] << u64(32))
        return lambda w: w.s[idx]
    if tok == "scc":
        return lambda w: w.scc
    c = parse_const(tok, "i", bits)
    if c is None:
        raise refuse(f"scalar operand {tok!r} of `{where}` is not a register or constant the emulator models")
    if bits == 64 and tok.lstrip("-").isdigit() and int(tok) < 0:
        c = int(tok) & ((1 << 64) - 1)
    cv = u64(c)
    return lambda w: cv


# name -> (bits, fn(a, b, scc) -> (result, scc or None)); None keeps SCC. a, b, scc: uint64 per wave.
def _cmp(op: Callable, signed: bool, bits: int = 32):
    if signed:
        sx = sx32 if bits == 32 else sx64
        return lambda a, b: op(sx(a), sx(b))
    return lambda a, b: op(np.asarray(a, u64), np.asarray(b, u64))


_CMPS = {"eq": np.equal, "lg": np.not_equal, "gt": np.greater, "ge": np.greater_equal, "lt": np.less,
         "le": np.less_equal}


def _nz(r):
    return r != 0


def _popcount(a):
    return np.bitwise_count(np.asarray(a, u64)).astype(u64)


def _bit_length(a):
    x = np.asarray(a, u64)
    for k in (1, 2, 4, 8, 16, 32):
        x = x | (x >> u64(k))
    return np.bitwise_count(x).astype(u64)


def _sop2_table() -> dict[str, tuple[int, Callable]]:
    t: dict[str, tuple[int, Callable]] = {}
    for bits, m in ((32, M32), (64, M64)):
        sfx = f"b{bits}"
        t[f"s_and_{sfx}"] = (bits, lambda a, b, c: ((a & b), _nz(a & b)))
        t[f"s_or_{sfx}"] = (bits, lambda a, b, c: ((a | b), _nz(a | b)))
        t[f"s_xor_{sfx}"] = (bits, lambda a, b, c: ((a ^ b), _nz(a ^ b)))
        t[f"s_andn2_{sfx}"] = (bits, lambda a, b, c, m=m: (a & ~b & m, _nz(a & ~b & m)))
        t[f"s_orn2_{sfx}"] = (bits, lambda a, b, c, m=m: ((a | ~b) & m, _nz((a | ~b) & m)))
        t[f"s_nand_{sfx}"] = (bits, lambda a, b, c, m=m: (~(a & b) & m, _nz(~(a & b) & m)))
        t[f"s_nor_{sfx}"] = (bits, lambda a, b, c, m=m: (~(a | b) & m, _nz(~(a | b) & m)))
        t[f"s_xnor_{sfx}"] = (bits, lambda a, b, c, m=m: (~(a ^ b) & m, _nz(~(a ^ b) & m)))
        t[f"s_cselect_{sfx}"] = (bits, lambda a, b, c: (np.where(c != 0, a, b), None))
        sh = u64(bits - 1)
        t[f"s_lshl_{sfx}"] = (bits, lambda a, b, c, m=m, sh=sh: ((a << (b & sh)) & m, _nz((a << (b & sh)) & m)))
        t[f"s_lshr_{sfx}"] = (bits, lambda a, b, c, sh=sh: (a >> (b & sh), _nz(a >> (b & sh))))
        sxf = sx32 if bits == 32 else sx64
        t[f"s_ashr_i{bits}"] = (bits, lambda a, b, c, m=m, sh=sh, sxf=sxf: (
            _u(sxf(a) >> (b & sh).astype(i64), m), _nz(_u(sxf(a) >> (b & sh).astype(i64), m))))
        t[f"s_bfm_{sfx}"] = (bits, lambda a, b, c, m=m: ((((u64(1) << (a & u64(0x3F))) - u64(1)) << (b & u64(0x3F)))
                                                          & m, None))
    t["s_add_u32"] = (32, lambda a, b, c: ((a + b) & M32, a + b > M32))
    t["s_sub_u32"] = (32, lambda a, b, c: ((a - b) & M32, b > a))
    t["s_addc_u32"] = (32, lambda a, b, c: ((a + b + c) & M32, a + b + c > M32))
    t["s_subb_u32"] = (32, lambda a, b, c: ((a - b - c) & M32, b + c > a))

    def add_i32(a, b, c):
        r = (a + b) & M32
        return r, ((a >> u64(31)) == (b >> u64(31))) & ((r >> u64(31)) != (a >> u64(31)))

    def sub_i32(a, b, c):
        r = (a - b) & M32
        return r, ((a >> u64(31)) != (b >> u64(31))) & ((r >> u64(31)) != (a >> u64(31)))
    t["s_add_i32"] = (32, add_i32)
    t["s_sub_i32"] = (32, sub_i32)
    t["s_mul_i32"] = (32, lambda a, b, c: ((a * b) & M32, None))
    t["s_mul_hi_u32"] = (32, lambda a, b, c: ((a * b) >> u64(32), None))
    t["s_mul_hi_i32"] = (32, lambda a, b, c: (_u((sx32(a) * sx32(b)) >> 32), None))
    t["s_min_i32"] = (32, lambda a, b, c: (np.where(sx32(a) < sx32(b), a, b), sx32(a) < sx32(b)))
    t["s_max_i32"] = (32, lambda a, b, c: (np.where(sx32(a) > sx32(b), a, b), sx32(a) > sx32(b)))
    t["s_min_u32"] = (32, lambda a, b, c: (np.minimum(a, b), a < b))
    t["s_max_u32"] = (32, lambda a, b, c: (np.maximum(a, b), a > b))
    t["s_absdiff_i32"] = (32, lambda a, b, c: (_u(np.abs(sx32(a) - sx32(b))), _nz(_u(np.abs(sx32(a) - sx32(b))))))
    t["s_bfe_u32"] = (32, lambda a, b, c: _bfe(a, b, False, 32))
    t["s_bfe_i32"] = (32, lambda a, b, c: _bfe(a, b, True, 32))
    t["s_bfe_u64"] = (64, lambda a, b, c: _bfe(a, b, False, 64))
    for k in (1, 2, 3, 4):
        t[f"s_lshl{k}_add_u32"] = (32, lambda a, b, c, k=u64(k): (((a << k) + b) & M32, ((a << k) + b) > M32))
    t["s_pack_ll_b32_b16"] = (32, lambda a, b, c: ((a & u64(0xFFFF)) | ((b & u64(0xFFFF)) << u64(16)), None))
    t["s_pack_lh_b32_b16"] = (32, lambda a, b, c: ((a & u64(0xFFFF)) | (b & u64(0xFFFF0000)), None))
    t["s_pack_hh_b32_b16"] = (32, lambda a, b, c: ((a >> u64(16)) | (b & u64(0xFFFF0000)), None))
    return t


def _bfe(a, b, signed: bool, bits: int):
    a, b = np.asarray(a, u64), np.asarray(b, u64)
    off, width = b & u64(bits - 1), np.minimum((b >> u64(16)) & u64(0x7F), u64(64))
    mask = np.where(width >= 64, M64, (u64(1) << (width & u64(63))) - u64(1))
    r = (a >> off) & mask
    if signed:
        sh = (u64(64) - width) & u64(63)
        r = np.where(width == 0, u64(0), ((r << sh).view(i64) >> sh.astype(i64)).view(u64))
    r = r & (M32 if bits == 32 else M64)
    return r, r != 0


SOP2 = _sop2_table()
# shift operands (b) of 64-bit shifts are 32-bit.
_B32_SECOND = {"s_lshl_b64", "s_lshr_b64", "s_ashr_i64", "s_bfe_u64", "s_bfm_b64"}


def _brev(a, n: int):
    a = np.asarray(a, u64)
    return np.array([int(f"{int(v):0{n}b}"[::-1], 2) for v in a.reshape(-1)], u64).reshape(a.shape)


def _ff1(a, m):
    a = np.asarray(a, u64)
    low = a & (~a + u64(1))
    return np.where(a == 0, M32, _popcount(low - u64(1)) & M32)


def _sop1_table() -> dict[str, tuple[int, Callable]]:
    t: dict[str, tuple[int, Callable]] = {}
    for bits, m in ((32, M32), (64, M64)):
        sfx = f"b{bits}"
        t[f"s_mov_{sfx}"] = (bits, lambda a: (a, None))
        t[f"s_not_{sfx}"] = (bits, lambda a, m=m: (~a & m, _nz(~a & m)))
        t[f"s_brev_{sfx}"] = (bits, lambda a, n=bits: (_brev(a, n), None))
        t[f"s_bcnt1_i32_{sfx}"] = (bits, lambda a: (_popcount(a), _nz(a)))
        t[f"s_ff1_i32_{sfx}"] = (bits, lambda a, m=m: (_ff1(a, m), None))
        t[f"s_flbit_i32_{sfx}"] = (bits, lambda a, n=bits: (np.where(np.asarray(a) == 0, M32,
                                                                      u64(n) - _bit_length(a)), None))
    t["s_abs_i32"] = (32, lambda a: (_u(np.abs(sx32(a))), _nz(a)))
    t["s_sext_i32_i8"] = (32, lambda a: (_u(((np.asarray(a, u64) & u64(0xFF)).astype(i64) ^ 0x80) - 0x80), None))
    t["s_sext_i32_i16"] = (32, lambda a: (_u(((np.asarray(a, u64) & u64(0xFFFF)).astype(i64) ^ 0x8000) - 0x8000),
                                          None))
    return t


SOP1 = _sop1_table()
_SAVEEXEC = {"and": lambda e, a: a & e, "or": lambda e, a: a | e, "xor": lambda e, a: a ^ e,
             "andn2": lambda e, a: a & ~e & M64, "orn2": lambda e, a: (a | ~e) & M64,
             "nand": lambda e, a: ~(a & e) & M64, "nor": lambda e, a: ~(a | e) & M64,
             "xnor": lambda e, a: ~(a ^ e) & M64}


def compile_scalar(inst: Inst, where: str, index_of: Callable[[int], int]) -> Callable[[Wave], int | None] | None:
    """The closure for a scalar instruction, or None when ``inst`` is not one this module knows."""
    m = inst.mnemonic
    ops = inst.operands
    if m in SOP2:
        bits, fn = SOP2[m]
        d, n = _dst(ops[0], where)
        a = ssrc(ops[1], bits, where)
        b = ssrc(ops[2], 32 if m in _B32_SECOND else bits, where)

        def sop2(w: Wave) -> None:
            r, c = fn(a(w), b(w), w.scc)
            write_s(w, d, n, r)
            if c is not None:
                write_scc(w, c)
        return sop2
    if m in SOP1:
        bits, fn = SOP1[m]
        d, n = _dst(ops[0], where)
        a = ssrc(ops[1], bits, where)

        def sop1(w: Wave) -> None:
            r, c = fn(a(w))
            write_s(w, d, n, r)
            if c is not None:
                write_scc(w, c)
        return sop1
    if m.endswith("_saveexec_b64"):
        op = _SAVEEXEC.get(m[2:-len("_saveexec_b64")])
        if op is None:
            return None
        d, n = _dst(ops[0], where)
        a = ssrc(ops[1], 64, where)

        def saveexec(w: Wave) -> None:
            old = w.s[EXEC] | (w.s[EXEC + 1] << u64(32))
            new = op(old, a(w))
            write_s(w, d, n, old)
            w.set_exec(new)
            write_scc(w, new != 0)
        return saveexec
    f = _compare_and_k(inst, where)
    if f is not None:
        return f
    return _control(inst, where, index_of)


def _compare_and_k(inst: Inst, where: str) -> Callable[[Wave], None] | None:
    """SOPC compares (s_cmp*, s_cmpk*, s_bitcmp*) and the SOPK ops with a 16-bit constant."""
    m = inst.mnemonic
    ops = inst.operands
    if m.startswith("s_cmp_") or m.startswith("s_cmpk_"):
        parts = m.split("_")
        rel, ty = parts[2], parts[3]
        bits = 64 if ty.endswith("64") else 32
        a = ssrc(ops[0], bits, where)
        if m.startswith("s_cmpk_"):
            k = int(ops[1], 0)
            kv = k & 0xFFFF
            kv = u64((_sx(kv, 16) & 0xFFFFFFFF) if ty[0] == "i" else kv)
            b = (lambda w: kv)
        else:
            b = ssrc(ops[1], bits, where)
        f = _cmp(_CMPS[rel], ty[0] == "i", bits)

        def cmp(w: Wave) -> None:
            write_scc(w, f(a(w), b(w)))
        return cmp
    if m in ("s_bitcmp0_b32", "s_bitcmp1_b32", "s_bitcmp0_b64", "s_bitcmp1_b64"):
        bits = 64 if m.endswith("64") else 32
        a = ssrc(ops[0], bits, where)
        b = ssrc(ops[1], 32, where)
        want = u64(int(m[8]))

        def bitcmp(w: Wave) -> None:
            write_scc(w, ((a(w) >> (b(w) & u64(bits - 1))) & u64(1)) == want)
        return bitcmp
    if m in ("s_movk_i32", "s_addk_i32", "s_mulk_i32", "s_cmovk_i32"):
        d, n = _dst(ops[0], where)
        k = u64(_sx(int(ops[1], 0) & 0xFFFF, 16) & 0xFFFFFFFF)
        if m == "s_movk_i32":
            return lambda w: write_s(w, d, 1, k)
        if m == "s_mulk_i32":
            return lambda w: write_s(w, d, 1, (w.s[d] * k) & M32)
        if m == "s_cmovk_i32":
            return lambda w: write_s(w, d, 1, np.where(w.scc != 0, k, w.s[d]))

        def addk(w: Wave) -> None:
            r, c = SOP2["s_add_i32"][1](w.s[d], k, 0)
            write_s(w, d, 1, r)
            write_scc(w, c)
        return addk
    if m in ("s_bitset0_b32", "s_bitset1_b32", "s_bitset0_b64", "s_bitset1_b64"):
        bits = 64 if m.endswith("64") else 32
        d, n = _dst(ops[0], where)
        b = ssrc(ops[1], 32, where)
        one = m[8] == "1"

        def bitset(w: Wave) -> None:
            cur = w.s[d] | ((w.s[d + 1] << u64(32)) if n == 2 else u64(0))
            bit = u64(1) << (b(w) & u64(bits - 1))
            write_s(w, d, n, cur | bit if one else cur & ~bit)
        return bitset
    if m == "s_cmov_b32" or m == "s_cmov_b64":
        bits = 64 if m.endswith("64") else 32
        d, n = _dst(ops[0], where)
        a = ssrc(ops[1], bits, where)
        cur = ssrc(ops[0], bits, where)
        return lambda w: write_s(w, d, n, np.where(w.scc != 0, a(w), cur(w)))
    return None


def _dst(tok: str, where: str) -> tuple[int, int]:
    r = parse_reg(tok)
    if r is None or r[0] != "s":
        raise refuse(f"destination {tok!r} of `{where}`: expected a scalar register")
    return r[1], r[2]


_BRANCH_COND: dict[str, Callable[[Wave], np.ndarray]] = {
    "s_cbranch_scc0": lambda w: w.scc == 0,
    "s_cbranch_scc1": lambda w: w.scc != 0,
    "s_cbranch_vccz": lambda w: (w.s[VCC] | w.s[VCC + 1]) == 0,
    "s_cbranch_vccnz": lambda w: (w.s[VCC] | w.s[VCC + 1]) != 0,
    "s_cbranch_execz": lambda w: (w.s[EXEC] | w.s[EXEC + 1]) == 0,
    "s_cbranch_execnz": lambda w: (w.s[EXEC] | w.s[EXEC + 1]) != 0,
}
# Instructions whose only effects are on lanes under EXEC (VGPRs, LDS, memory) in this emulator, so that a wave
# whose EXEC is zero executes them as no-ops: the body of an ``s_cbranch_execz`` skip made only of these can be run
# by the whole batch while some waves would have skipped it (see ``execz_skip``).
_LANE_ONLY_PREFIXES = ("v_", "global_load_", "global_store_", "buffer_load_", "buffer_store_", "flat_load_",
                       "flat_store_", "ds_read", "ds_write", "ds_load_", "ds_store_")
_SGPR_WRITERS = ("v_cmp", "v_readlane", "v_readfirstlane", "v_writelane", "v_add_co_", "v_sub_co_", "v_subrev_co_",
                 "v_addc_co_", "v_subb_co_", "v_subbrev_co_", "v_add_i32", "v_sub_i32", "v_mad_u64_u32",
                 "v_mad_i64_i32", "v_div_scale_")


def lane_only(mnemonic: str) -> bool:
    """Whether ``mnemonic``'s effects in this emulator are all on lanes under EXEC (a no-op when EXEC is 0)."""
    if mnemonic in ("s_nop", "s_waitcnt", "s_waitcnt_vscnt", "s_waitcnt_lgkmcnt", "s_waitcnt_vmcnt"):
        return True
    return mnemonic.startswith(_LANE_ONLY_PREFIXES) and not mnemonic.startswith(_SGPR_WRITERS)


def execz_skip(target: int, nxt: int) -> Callable[[Wave], object]:
    """``s_cbranch_execz`` over a straight block of lane-only instructions (``lane_only``): when the batch's waves
    disagree, every wave falls through (the waves with EXEC = 0 execute the block as no-ops, the same state as
    skipping it) and the block's instructions are taken off their count (``w.phantom``), so that the batch does not
    split for a guarded tail."""
    length = target - nxt

    def branch(w: Wave):
        taken = (w.s[EXEC] | w.s[EXEC + 1]) == 0
        t = taken if w.all else taken[w.act]
        if t.all():
            return target
        k = int(t.sum())
        if k:
            w.phantom += k * length
        return None
    return branch


# Program-order and performance hints with no effect on results when memory operations complete in order.
_NO_EFFECT = {"s_nop", "s_waitcnt", "s_waitcnt_vscnt", "s_setprio", "s_sleep", "s_dcache_wb", "s_dcache_inv",
              "s_icache_inv", "s_sched_barrier", "s_set_gpr_idx_off", "s_inst_prefetch", "s_waitcnt_lgkmcnt",
              "s_waitcnt_vmcnt", "s_buffer_wbinvl1", "buffer_wbinvl1_vol", "buffer_wbl2", "buffer_inv"}


def _control(inst: Inst, where: str, index_of: Callable[[int], int]) -> Callable[[Wave], int | None] | None:
    m = inst.mnemonic
    if m in _NO_EFFECT:
        return lambda w: None
    if m == "s_endpgm":
        return lambda w: END
    if m == "s_barrier":
        return lambda w: BARRIER
    if m == "s_branch" or m in _BRANCH_COND:
        imm = _sx(int(inst.operands[0], 0) & 0xFFFF, 16)
        target = index_of(inst.address + 4 + 4 * imm)
        if m == "s_branch":
            return lambda w: target
        cond = _BRANCH_COND[m]
        nxt = index_of(inst.address) + 1

        def branch(w: Wave):
            taken = cond(w)
            t = taken if w.all else taken[w.act]
            if t.all():
                return target
            if not t.any():
                return None
            return np.where(taken, target, nxt)  # waves disagree: each wave's next PC
        return branch
    if m in ("s_trap", "s_sethalt", "s_setpc_b64", "s_swappc_b64", "s_getpc_b64", "s_rfe_b64", "s_sendmsg",
             "s_icache_inv"):
        raise refuse(f"`{where}`: {m} (traps, messages and computed jumps are not modelled)")
    return None
