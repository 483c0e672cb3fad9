"""Scalar ALU (SOP1/SOP2/SOPC/SOPK), scalar memory (SMEM) and program control (SOPP) with ISA semantics.

Each handler is compiled from a decoded instruction to a closure ``f(wave) -> None | int``: None steps to the next
instruction, an int is the index of the next one (a taken branch), ``END`` ends the wave, ``BARRIER`` parks it.
"""

from __future__ import annotations

from typing import Callable

from flyship.loader.emulate.decode import Inst
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.state import EXEC, VCC, Wave, parse_const, parse_reg, write_s

END = -1
BARRIER = -2
M32, M64 = 0xFFFFFFFF, (1 << 64) - 1


def _sx(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) & 1 else v


def ssrc(tok: str, bits: int, where: str) -> Callable[[Wave], int]:
    """A scalar source as an unsigned int of ``bits`` (32 or 64)."""
    r = parse_reg(tok)
    if r is not None:
        file, idx, _ = r
        if file != "s":
            raise refuse(f"scalar operand {tok!r} of `{where}`: expected an SGPR or constant")
        if bits == 64:
            return lambda w: w.s[idx] | (w.s[idx + 1] << 32)
        return lambda w: w.s[idx]
    if tok == "scc":
        return lambda w: w.scc
    c = parse_const(tok, "i", bits)
    if c is None:
        raise refuse(f"scalar operand {tok!r} of `{where}` is not a register or constant the emulator models")
    if bits == 64 and tok.lstrip("-").isdigit() and int(tok) < 0:
        c = int(tok) & M64
    return lambda w: c


def _u(a, b):
    return a, b


# name -> (bits, fn(a, b, scc) -> (result, scc or None)); None keeps SCC.
def _cmp(op: Callable[[int, int], bool], signed: bool, bits: int = 32):
    if signed:
        return lambda a, b: int(op(_sx(a, bits), _sx(b, bits)))
    return lambda a, b: int(op(a, b))


_CMPS = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b,
         "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}


def _sop2_table() -> dict[str, tuple[int, Callable]]:
    t: dict[str, tuple[int, Callable]] = {}
    for bits, m in ((32, M32), (64, M64)):
        sfx = f"b{bits}"
        t[f"s_and_{sfx}"] = (bits, lambda a, b, c, m=m: (a & b, int((a & b) != 0)))
        t[f"s_or_{sfx}"] = (bits, lambda a, b, c, m=m: (a | b, int((a | b) != 0)))
        t[f"s_xor_{sfx}"] = (bits, lambda a, b, c, m=m: (a ^ b, int((a ^ b) != 0)))
        t[f"s_andn2_{sfx}"] = (bits, lambda a, b, c, m=m: (a & ~b & m, int((a & ~b & m) != 0)))
        t[f"s_orn2_{sfx}"] = (bits, lambda a, b, c, m=m: ((a | ~b) & m, int(((a | ~b) & m) != 0)))
        t[f"s_nand_{sfx}"] = (bits, lambda a, b, c, m=m: (~(a & b) & m, int((~(a & b) & m) != 0)))
        t[f"s_nor_{sfx}"] = (bits, lambda a, b, c, m=m: (~(a | b) & m, int((~(a | b) & m) != 0)))
        t[f"s_xnor_{sfx}"] = (bits, lambda a, b, c, m=m: (~(a ^ b) & m, int((~(a ^ b) & m) != 0)))
        t[f"s_cselect_{sfx}"] = (bits, lambda a, b, c: (a if c else b, None))
        sh = bits - 1
        t[f"s_lshl_{sfx}"] = (bits, lambda a, b, c, m=m, sh=sh: ((a << (b & sh)) & m, int(((a << (b & sh)) & m) != 0)))
        t[f"s_lshr_{sfx}"] = (bits, lambda a, b, c, sh=sh: (a >> (b & sh), int((a >> (b & sh)) != 0)))
        t[f"s_ashr_i{bits}"] = (bits, lambda a, b, c, m=m, sh=sh, n=bits: (
            (_sx(a, n) >> (b & sh)) & m, int(((_sx(a, n) >> (b & sh)) & m) != 0)))
        t[f"s_bfm_{sfx}"] = (bits, lambda a, b, c, m=m: (((1 << (a & 0x3F)) - 1) << (b & 0x3F) & m, None))
    t["s_add_u32"] = (32, lambda a, b, c: ((a + b) & M32, int(a + b > M32)))
    t["s_sub_u32"] = (32, lambda a, b, c: ((a - b) & M32, int(b > a)))
    t["s_addc_u32"] = (32, lambda a, b, c: ((a + b + c) & M32, int(a + b + c > M32)))
    t["s_subb_u32"] = (32, lambda a, b, c: ((a - b - c) & M32, int(b + c > a)))

    def add_i32(a, b, c):
        r = (a + b) & M32
        return r, int((a >> 31) == (b >> 31) and (r >> 31) != (a >> 31))

    def sub_i32(a, b, c):
        r = (a - b) & M32
        return r, int((a >> 31) != (b >> 31) and (r >> 31) != (a >> 31))
    t["s_add_i32"] = (32, add_i32)
    t["s_sub_i32"] = (32, sub_i32)
    t["s_mul_i32"] = (32, lambda a, b, c: ((a * b) & M32, None))
    t["s_mul_hi_u32"] = (32, lambda a, b, c: ((a * b) >> 32, None))
    t["s_mul_hi_i32"] = (32, lambda a, b, c: (((_sx(a, 32) * _sx(b, 32)) >> 32) & M32, None))
    t["s_min_i32"] = (32, lambda a, b, c: (a if _sx(a, 32) < _sx(b, 32) else b, int(_sx(a, 32) < _sx(b, 32))))
    t["s_max_i32"] = (32, lambda a, b, c: (a if _sx(a, 32) > _sx(b, 32) else b, int(_sx(a, 32) > _sx(b, 32))))
    t["s_min_u32"] = (32, lambda a, b, c: (min(a, b), int(a < b)))
    t["s_max_u32"] = (32, lambda a, b, c: (max(a, b), int(a > b)))
    t["s_absdiff_i32"] = (32, lambda a, b, c: (abs(_sx(a, 32) - _sx(b, 32)) & M32,
                                               int(abs(_sx(a, 32) - _sx(b, 32)) != 0)))
    t["s_bfe_u32"] = (32, lambda a, b, c: _bfe(a, b, False, 32))
    t["s_bfe_i32"] = (32, lambda a, b, c: _bfe(a, b, True, 32))
    t["s_bfe_u64"] = (64, lambda a, b, c: _bfe(a, b, False, 64))
    t["s_lshl1_add_u32"] = (32, lambda a, b, c: (((a << 1) + b) & M32, int(((a << 1) + b) > M32)))
    t["s_lshl2_add_u32"] = (32, lambda a, b, c: (((a << 2) + b) & M32, int(((a << 2) + b) > M32)))
    t["s_lshl3_add_u32"] = (32, lambda a, b, c: (((a << 3) + b) & M32, int(((a << 3) + b) > M32)))
    t["s_lshl4_add_u32"] = (32, lambda a, b, c: (((a << 4) + b) & M32, int(((a << 4) + b) > M32)))
    t["s_pack_ll_b32_b16"] = (32, lambda a, b, c: ((a & 0xFFFF) | ((b & 0xFFFF) << 16), None))
    t["s_pack_lh_b32_b16"] = (32, lambda a, b, c: ((a & 0xFFFF) | (b & 0xFFFF0000), None))
    t["s_pack_hh_b32_b16"] = (32, lambda a, b, c: ((a >> 16) | (b & 0xFFFF0000), None))
    return t


def _bfe(a: int, b: int, signed: bool, bits: int) -> tuple[int, int]:
    off, width = b & (bits - 1), (b >> 16) & 0x7F
    r = (a >> off) & ((1 << width) - 1)
    if signed and width and r >> (width - 1) & 1:
        r -= 1 << width
    r &= (1 << bits) - 1
    return r, int(r != 0)


SOP2 = _sop2_table()
# shift operands (b) of 64-bit shifts are 32-bit.
_B32_SECOND = {"s_lshl_b64", "s_lshr_b64", "s_ashr_i64", "s_bfe_u64", "s_bfm_b64"}


def _sop1_table() -> dict[str, tuple[int, Callable]]:
    t: dict[str, tuple[int, Callable]] = {}
    for bits, m in ((32, M32), (64, M64)):
        sfx = f"b{bits}"
        t[f"s_mov_{sfx}"] = (bits, lambda a: (a, None))
        t[f"s_not_{sfx}"] = (bits, lambda a, m=m: (~a & m, int((~a & m) != 0)))
        t[f"s_brev_{sfx}"] = (bits, lambda a, n=bits: (int(f"{a:0{n}b}"[::-1], 2), None))
        t[f"s_bcnt1_i32_{sfx}"] = (bits, lambda a: (bin(a).count("1"), int(a != 0)))
        t[f"s_ff1_i32_{sfx}"] = (bits, lambda a: (((a & -a).bit_length() - 1) & M32 if a else M32, None))
        t[f"s_flbit_i32_{sfx}"] = (bits, lambda a, n=bits: (n - a.bit_length() if a else M32, None))
    t["s_abs_i32"] = (32, lambda a: (abs(_sx(a, 32)) & M32, int(a != 0)))
    t["s_sext_i32_i8"] = (32, lambda a: (_sx(a & 0xFF, 8) & M32, None))
    t["s_sext_i32_i16"] = (32, lambda a: (_sx(a & 0xFFFF, 16) & M32, None))
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
                w.scc = c
        return sop2
    if m in SOP1:
        bits, fn = SOP1[m]
        d, n = _dst(ops[0], where)
        a = ssrc(ops[1], bits, where)

        def sop1(w: Wave) -> None:
            r, c = fn(a(w))
            write_s(w, d, n, r)
            if c is not None:
                w.scc = c
        return sop1
    if m.endswith("_saveexec_b64"):
        op = _SAVEEXEC.get(m[2:-len("_saveexec_b64")])
        if op is None:
            return None
        d, n = _dst(ops[0], where)
        a = ssrc(ops[1], 64, where)

        def saveexec(w: Wave) -> None:
            old = w.s[EXEC] | (w.s[EXEC + 1] << 32)
            v = a(w)
            new = op(old, v)
            write_s(w, d, n, old)
            w.set_exec(new)
            w.scc = int(new != 0)
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
            kv = (_sx(kv, 16) & M32) if ty[0] == "i" else kv
            b = (lambda w: kv)
        else:
            b = ssrc(ops[1], bits, where)
        f = _cmp(_CMPS[rel], ty[0] == "i", bits)

        def cmp(w: Wave) -> None:
            w.scc = f(a(w), b(w))
        return cmp
    if m in ("s_bitcmp0_b32", "s_bitcmp1_b32", "s_bitcmp0_b64", "s_bitcmp1_b64"):
        bits = 64 if m.endswith("64") else 32
        a = ssrc(ops[0], bits, where)
        b = ssrc(ops[1], 32, where)
        want = int(m[8])

        def bitcmp(w: Wave) -> None:
            w.scc = int(((a(w) >> (b(w) & (bits - 1))) & 1) == want)
        return bitcmp
    if m in ("s_movk_i32", "s_addk_i32", "s_mulk_i32", "s_cmovk_i32"):
        d, n = _dst(ops[0], where)
        k = _sx(int(ops[1], 0) & 0xFFFF, 16) & M32
        if m == "s_movk_i32":
            return lambda w: write_s(w, d, 1, k)
        if m == "s_mulk_i32":
            return lambda w: write_s(w, d, 1, (w.s[d] * k) & M32)
        if m == "s_cmovk_i32":
            return lambda w: write_s(w, d, 1, k) if w.scc else None

        def addk(w: Wave) -> None:
            r, c = SOP2["s_add_i32"][1](w.s[d], k, 0)
            w.s[d] = r
            w.scc = c
        return addk
    if m in ("s_bitset0_b32", "s_bitset1_b32", "s_bitset0_b64", "s_bitset1_b64"):
        bits = 64 if m.endswith("64") else 32
        d, n = _dst(ops[0], where)
        b = ssrc(ops[1], 32, where)
        one = m[8] == "1"

        def bitset(w: Wave) -> None:
            cur = w.s[d] | ((w.s[d + 1] << 32) if n == 2 else 0)
            bit = 1 << (b(w) & (bits - 1))
            write_s(w, d, n, cur | bit if one else cur & ~bit)
        return bitset
    if m == "s_cmov_b32" or m == "s_cmov_b64":
        bits = 64 if m.endswith("64") else 32
        d, n = _dst(ops[0], where)
        a = ssrc(ops[1], bits, where)
        return lambda w: write_s(w, d, n, a(w)) if w.scc else None
    return None


def _dst(tok: str, where: str) -> tuple[int, int]:
    r = parse_reg(tok)
    if r is None or r[0] != "s":
        raise refuse(f"destination {tok!r} of `{where}`: expected a scalar register")
    return r[1], r[2]


_BRANCH_COND: dict[str, Callable[[Wave], bool]] = {
    "s_branch": lambda w: True,
    "s_cbranch_scc0": lambda w: w.scc == 0,
    "s_cbranch_scc1": lambda w: w.scc == 1,
    "s_cbranch_vccz": lambda w: (w.s[VCC] | w.s[VCC + 1]) == 0,
    "s_cbranch_vccnz": lambda w: (w.s[VCC] | w.s[VCC + 1]) != 0,
    "s_cbranch_execz": lambda w: (w.s[EXEC] | w.s[EXEC + 1]) == 0,
    "s_cbranch_execnz": lambda w: (w.s[EXEC] | w.s[EXEC + 1]) != 0,
}
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
    if m in _BRANCH_COND:
        imm = _sx(int(inst.operands[0], 0) & 0xFFFF, 16)
        target = index_of(inst.address + 4 + 4 * imm)
        cond = _BRANCH_COND[m]
        if m == "s_branch":
            return lambda w: target
        return lambda w: target if cond(w) else None
    if m in ("s_trap", "s_sethalt", "s_setpc_b64", "s_swappc_b64", "s_getpc_b64", "s_rfe_b64", "s_sendmsg",
             "s_icache_inv"):
        raise refuse(f"`{where}`: {m} (traps, messages and computed jumps are not modelled)")
    return None
