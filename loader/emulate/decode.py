"""Decode a kernel's machine code with LLVM's disassembler (``llvm-objdump``), once per code object and symbol.

The emulator never decodes instruction bits itself: ``llvm-objdump -d`` names each instruction (mnemonic with its
encoding suffix, ``_e32`` / ``_e64`` / ``_dpp`` / ``_sdwa``), prints its operands in assembler syntax and its address
and raw dwords in a comment. A line looks like::

    v_add_f32_dpp v1, v1, v1 row_bcast:15 row_mask:0xa bank_mask:0xf// 00000000130C: 020202FA AF014201

Only a few fields are read from the raw dwords where the text is less direct (the DS offset of ``ds_swizzle_b32``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from flyship import env
from flyship.errors import LoadError

# One line of disassembly: mnemonic, operand text, address, raw dwords, optional "<sym+off>" branch note.
_LINE = re.compile(r"^\s+([a-z_0-9]+)\s*(.*?)\s*//\s*([0-9A-Fa-f]+):\s*((?:[0-9A-Fa-f]{8}\s?)+)(?:<.*>)?\s*$")
_FUNC = re.compile(r"^([0-9a-fA-F]+) <(.+)>:$")
# Any instruction line (its address comment), also one the disassembler could not decode ("<unknown>").
_ANY = re.compile(r"^\s+(\S.*?)\s*//\s*([0-9A-Fa-f]+):\s*((?:[0-9A-Fa-f]{8}\s?)+)(?:<.*>)?\s*$")
UNDECODED = "<undecoded>"
OBJDUMP_TIMEOUT_S = 120
MAX_DISASSEMBLY_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class Inst:
    """One decoded instruction: its address, size in bytes, mnemonic, operands and modifiers (text), raw dwords."""

    address: int
    size: int
    mnemonic: str
    operands: tuple[str, ...]
    modifiers: tuple[str, ...]
    words: tuple[int, ...]

    def modifier(self, name: str, default: str | None = None) -> str | None:
        """The value of ``name:value`` (or ``name`` alone -> ``""``) among the modifiers, else ``default``."""
        for m in self.modifiers:
            if m == name:
                return ""
            if m.startswith(name + ":"):
                return m[len(name) + 1:]
        return default

    def __str__(self) -> str:
        return f"{self.mnemonic} {', '.join(self.operands)} {' '.join(self.modifiers)}".strip()


def _split_operands(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """LLVM separates operands by ", " and modifiers by " " (a modifier's own list, ``quad_perm:[1,0,3,2]``,
    has no spaces)."""
    if not text:
        return (), ()
    parts = text.split(", ")
    tail = parts[-1].split(" ")
    ops = parts[:-1] + [tail[0]]
    mods = tail[1:]
    # An instruction with modifiers but no operands (``s_waitcnt vmcnt(0) lgkmcnt(0)``): keep them as operands.
    return tuple(o for o in ops if o), tuple(m for m in mods if m)


def parse(text: str) -> dict[str, list[Inst]]:
    """Parse ``llvm-objdump -d`` output into function name -> instructions in address order."""
    out: dict[str, list[Inst]] = {}
    current: list[Inst] | None = None
    for line in text.splitlines():
        fm = _FUNC.match(line)
        if fm:
            current = out.setdefault(fm.group(2), [])
            continue
        if current is None:
            continue
        m = _LINE.match(line)
        if m is None:
            a = _ANY.match(line)
            if a is not None:  # kept, so that a wave reaching it is refused, never skips it
                words = tuple(int(w, 16) for w in a.group(3).split())
                current.append(Inst(int(a.group(2), 16), 4 * len(words), UNDECODED, (a.group(1),), (), words))
            continue
        words = tuple(int(w, 16) for w in m.group(4).split())
        ops, mods = _split_operands(m.group(2))
        current.append(Inst(int(m.group(3), 16), 4 * len(words), m.group(1), ops, mods, words))
    return out


def find_objdump() -> str:
    """``llvm-objdump`` from ``$FLYSHIP_LLVM_BIN``, ``$ROCM_PATH/llvm/bin``, ``/opt/rocm/llvm/bin``,
    ``/usr/lib/llvm-N/bin`` (newest first) or ``PATH``, in that order (the compile stage's order).

    Raises:
        LoadError: none of them has it; the message lists every folder tried.
    """
    tried: list[str] = []
    folders = [env.llvm_bin()]
    if os.environ.get("ROCM_PATH"):
        folders.append(str(Path(os.environ["ROCM_PATH"]) / "llvm" / "bin"))
    folders.append("/opt/rocm/llvm/bin")
    versioned = glob.glob("/usr/lib/llvm-*/bin")
    versioned.sort(key=lambda p: int(re.sub(r"\D", "", p.split("llvm-")[1]) or 0), reverse=True)
    folders += versioned
    for folder in folders:
        if not folder:
            continue
        tried.append(folder)
        exe = Path(folder) / "llvm-objdump"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    on_path = shutil.which("llvm-objdump")
    if on_path:
        return on_path
    tried.append("PATH")
    raise LoadError(f"emulate: expected llvm-objdump (LLVM's AMDGPU disassembler decodes the kernel), found none in "
                    f"{tried}; install LLVM with the AMDGPU target (Debian/Ubuntu: apt-get install llvm-22) or set "
                    "FLYSHIP_LLVM_BIN to its bin folder", kind="EmulationError")


def disassemble(image: bytes, where: str) -> dict[str, list[Inst]]:
    """Disassemble a code object's ``.text`` (``llvm-objdump`` picks the processor from the ELF header)."""
    exe = find_objdump()
    with tempfile.TemporaryDirectory(prefix="flyship-emulate-") as tmp:
        path = Path(tmp) / "code.hsaco"
        path.write_bytes(image)
        try:
            r = subprocess.run([exe, "-d", str(path)], capture_output=True, timeout=OBJDUMP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise LoadError(f"emulate {where}: llvm-objdump ran past {OBJDUMP_TIMEOUT_S} s", kind="EmulationError")
    if r.returncode != 0:
        raise LoadError(f"emulate {where}: expected llvm-objdump to disassemble the code object, it exited "
                        f"{r.returncode}: {r.stderr.decode(errors='replace')[:400]}", kind="EmulationError")
    if len(r.stdout) > MAX_DISASSEMBLY_BYTES:
        raise LoadError(f"emulate {where}: disassembly of {len(r.stdout)} bytes, at most {MAX_DISASSEMBLY_BYTES}",
                        kind="EmulationError")
    return parse(r.stdout.decode(errors="replace"))


_lock = threading.Lock()
_cache: dict[str, dict[str, list[Inst]]] = {}


def functions(image: bytes, sha256: str, where: str) -> dict[str, list[Inst]]:
    """The decoded functions of a code object, cached in memory by its sha256."""
    with _lock:
        hit = _cache.get(sha256)
    if hit is not None:
        return hit
    decoded = disassemble(image, where)
    with _lock:
        _cache[sha256] = decoded
    return decoded
