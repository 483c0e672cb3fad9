"""A kernel's program: its decoded instructions compiled to closures, cached per code object sha256 + symbol.

An instruction the emulator does not model compiles to a closure that refuses by name (mnemonic, address, kernel)
when a wave reaches it, so a kernel whose unsupported instructions are never executed still runs, and one that
reaches one stops with that name.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

from flyship.errors import LoadError
from flyship.loader.emulate import decode, lds, mfma, scalar, vector, vmem
from flyship.loader.emulate.decode import Inst
from flyship.loader.emulate.errors import refuse
from flyship.loader.emulate.state import Wave


@dataclasses.dataclass
class Program:
    symbol: str
    target: str
    insts: list[Inst]
    ops: list[Callable[[Wave], int | None]]
    refused: dict[str, str]  # mnemonic -> reason, for instructions that refuse when reached

    def where(self, pc: int) -> str:
        if pc >= len(self.insts):
            return f"<end of {self.symbol}>"
        i = self.insts[pc]
        return f"{i} at 0x{i.address:x} in {self.symbol}"


def _refusing(err: LoadError) -> Callable[[Wave], None]:
    def refused(w: Wave) -> None:
        raise err
    return refused


def compile_one(inst: Inst, where: str, target: str, denorm32: int, index_of) -> Callable[[Wave], int | None]:
    m = inst.mnemonic
    if m == decode.UNDECODED:
        raise refuse(f"`{where}`: llvm-objdump could not decode this instruction ({inst.operands[0]}); use an LLVM "
                     f"that knows {target} (LLVM 20 or newer for gfx950)")
    if m.startswith("s_load_") or m.startswith("s_buffer_load_"):
        return vmem.compile_smem(inst, where)
    if m.startswith("s_") or m in scalar._NO_EFFECT:
        f = scalar.compile_scalar(inst, where, index_of)
    elif m.startswith("global_") or m.startswith("flat_"):
        f = vmem.compile_global(inst, where)
    elif m.startswith("buffer_"):
        f = vmem.compile_buffer(inst, where)
    elif m.startswith("ds_"):
        f = lds.compile_ds(inst, where)
    elif m.startswith("v_cvt_pk_fp8_f32") or m.startswith("v_cvt_pk_bf8_f32"):
        f = mfma.compile_cvt_pk_fp8(inst, where, target)
    elif m.startswith("v_mfma_") or m.startswith("v_smfmac_"):
        f = mfma.compile_mfma(inst, where, target)
    elif m.startswith("v_"):
        f = vector.compile_vector(inst, where, denorm32)
    else:
        f = None
    if f is None:
        raise refuse(f"`{where}`: unsupported instruction {m} (not modelled by the emulator; refused, never skipped)")
    return f


def build(insts: list[Inst], symbol: str, target: str, denorm32: int) -> Program:
    index = {inst.address: k for k, inst in enumerate(insts)}

    def index_of(address: int) -> int:
        if address not in index:
            raise refuse(f"branch to 0x{address:x} outside the decoded code of {symbol}")
        return index[address]
    ops: list[Callable[[Wave], int | None]] = []
    refused: dict[str, str] = {}
    for inst in insts:
        where = f"{inst} at 0x{inst.address:x} in {symbol}"
        try:
            ops.append(compile_one(inst, where, target, denorm32, index_of))
        except LoadError as e:
            refused.setdefault(inst.mnemonic, str(e))
            ops.append(_refusing(e))
    _skips(insts, ops, index, refused)
    end = refuse(f"the wave ran past the last instruction of {symbol} without s_endpgm")
    ops.append(_refusing(end))
    return Program(symbol, target, insts, ops, refused)


def _skips(insts: list[Inst], ops: list, index: dict[int, int], refused: dict[str, str]) -> None:
    """Replace each forward ``s_cbranch_execz`` over a block of lane-only instructions by ``scalar.execz_skip``."""
    for k, inst in enumerate(insts):
        if inst.mnemonic != "s_cbranch_execz":
            continue
        imm = scalar._sx(int(inst.operands[0], 0) & 0xFFFF, 16)
        target = index.get(inst.address + 4 + 4 * imm)
        if target is None or target <= k + 1:
            continue
        body = insts[k + 1:target]
        if all(scalar.lane_only(i.mnemonic) and i.mnemonic not in refused for i in body):
            ops[k] = scalar.execz_skip(target, k + 1)


_lock = threading.Lock()
_cache: dict[tuple[str, str, int], Program] = {}


def program(insts_of: Callable[[], list[Inst]], sha256: str, symbol: str, target: str, denorm32: int) -> Program:
    key = (sha256, symbol, denorm32)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    p = build(insts_of(), symbol, target, denorm32)
    with _lock:
        _cache[key] = p
    return p
