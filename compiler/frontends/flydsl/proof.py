"""Prove a code object flyship assembled equals FlyDSL's own, section by section.

FlyDSL's own code object is the ``bin = "..."`` string of the ``gpu.binary`` op in its
``NN_gpu_module_to_binary.mlir`` dump (MLIR string attribute: printable bytes as is, others as ``\\XX`` hex,
``\\\\`` for a backslash). One ``gpu.binary`` may hold several ``#gpu.object``s: a kernel with fast-math
hints can carry two identical code objects under different target flags.

The proof compares by section, never whole files (``.comment`` names the linker):

* ``.text`` byte for byte (required);
* each kernel descriptor (``<symbol>.kd``, 64 bytes) field by field; ``kernel_code_entry_byte_offset``
  may differ when a linker places ``.text`` elsewhere, but must land on the kernel symbol in both, at the
  same offset into the identical ``.text`` (``identical-but-entry-offset``);
* ``.rodata`` (and ``.data`` when either has one) byte for byte, apart from those entry-offset bytes;
* the kernel's AMDGPU metadata map (``NT_AMDGPU_METADATA`` msgpack), plus ``amdhsa.target`` and
  ``amdhsa.version``; ELF ``e_flags`` (processor and features).

The ELF ABI version (code object v5 vs v6) is allowed to differ: flyship can assemble v5 from FlyDSL's v6.

A target ID with features (``gfx942:sramecc+:xnack-``): FlyDSL compiles for the bare processor, whose code
object has xnack and sramecc "any"; flyship declares the requested settings (assemble.set_target_features).
Then exactly two things may differ, and the proof names both in ``Proof.differences``: the xnack/sramecc
fields of ``e_flags`` (FlyDSL's "any" -> the requested on/off; every other bit equal) and ``amdhsa.target``
(FlyDSL's string plus the features). Everything else is compared as above.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

from flyship.bundle.codeobject import KERNEL_DESCRIPTOR_FIELDS, CodeObjectFile
from flyship.bundle.errors import CodeObjectError
from flyship.bundle.manifest import Proof

_BIN_RE = re.compile(r'\bbin\s*=\s*"((?:[^"\\]|\\.)*)"', re.DOTALL)
_OBJECT_RE = re.compile(r"#gpu\.object<\s*(#[\w.]+<[^>]*>|[^,]*)")
_ESCAPE_RE = re.compile(r"\\([0-9A-Fa-f]{2}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"\\": 0x5C, '"': 0x22, "n": 0x0A, "t": 0x09}
_ENTRY_FIELD = next((off, struct) for name, off, struct in KERNEL_DESCRIPTOR_FIELDS
                    if name == "kernel_code_entry_byte_offset")
_ENTRY_SIZE = 8
PROOF_METHOD = "flydsl-binary"
# ELF e_flags feature fields of code object v4+ (LLVM BinaryFormat/ELF.h, EF_AMDGPU_FEATURE_*_V4).
_FEATURE_FIELDS = {"xnack": (0x300, 8), "sramecc": (0xC00, 10)}
_FEATURE_SETTINGS = {0: "unsupported", 1: "any", 2: "off", 3: "on"}


# The kind of the CodeObjectError saying our code object differs from the frontend's own (the message names the
# section or field, both sizes and the first differing offset): a failure reason reads "ProofError: ...", and the
# build's next step for it is chosen by that word (compiler/pipeline/running.py).
PROOF = "ProofError"


@dataclasses.dataclass(frozen=True)
class FlydslObject:
    """One ``#gpu.object`` of a ``gpu.binary``.

    Attributes:
        target: the object's target attribute as written (``#rocdl.target<chip = "gfx942">``).
        data: the code object bytes.
    """

    target: str
    data: bytes


def _unescape(body: str, where: str) -> bytes:
    out = bytearray()
    pos = 0
    for m in _ESCAPE_RE.finditer(body):
        out += body[pos:m.start()].encode("latin-1")
        esc = m.group(1)
        if len(esc) == 2:
            out.append(int(esc, 16))
        elif esc in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[esc])
        else:
            raise CodeObjectError(f"read FlyDSL binary {where}: expected \\XX hex escapes in the bin string, "
                                  f"got '\\{esc}' at character {m.start()}", kind=PROOF)
        pos = m.end()
    out += body[pos:].encode("latin-1")
    return bytes(out)


def extract_flydsl_objects(mlir_text: str, where: str = "<gpu_module_to_binary.mlir>") -> list[FlydslObject]:
    """Every ``#gpu.object`` of the ``gpu.binary`` ops in FlyDSL's ``NN_gpu_module_to_binary.mlir``.

    Args:
        mlir_text: the dump's text.
        where: a name for error messages.

    Returns:
        The objects in file order, each with its target attribute text and bytes.

    Raises:
        CodeObjectError (kind PROOF): no ``bin = "..."`` string, or a string that is not an ELF.
    """
    objects = []
    for m in _BIN_RE.finditer(mlir_text):
        start = mlir_text.rfind("#gpu.object<", 0, m.start())
        t = _OBJECT_RE.match(mlir_text, start) if start >= 0 else None
        data = _unescape(m.group(1), where)
        if not data.startswith(b"\x7fELF"):
            raise CodeObjectError(f"read FlyDSL binary {where}: expected an ELF code object in bin string "
                                  f"{len(objects)}, got {data[:8]!r}...", kind=PROOF)
        objects.append(FlydslObject(t.group(1).strip() if t else "", data))
    if not objects:
        raise CodeObjectError(f"read FlyDSL binary {where}: expected a gpu.binary with bin = \"...\", got none; pass "
                              "the NN_gpu_module_to_binary.mlir that FlyDSL dumps with FLYDSL_DUMP_IR=1", kind=PROOF)
    return objects


def extract_flydsl_binary(gpu_module_to_binary_mlir_text: str) -> list[bytes]:
    """FlyDSL's own code object(s): the bytes of each ``bin = "..."`` in a ``gpu_module_to_binary`` dump.

    Args:
        gpu_module_to_binary_mlir_text: the text of FlyDSL's ``NN_gpu_module_to_binary.mlir``.

    Returns:
        One ``bytes`` per ``#gpu.object``, in file order (usually one; two identical ones for some
        fast-math kernels).

    Raises:
        CodeObjectError (kind PROOF): no binary in the text.
    """
    return [o.data for o in extract_flydsl_objects(gpu_module_to_binary_mlir_text)]


def _first_difference(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _compare_bytes(what: str, ours: bytes, theirs: bytes, ignore: set[int] = frozenset()) -> bool:
    """True when equal; False when equal except at ``ignore`` offsets; raise otherwise."""
    if ours == theirs:
        return True
    if len(ours) != len(theirs):
        raise CodeObjectError(f"prove {what}: expected {len(theirs)} bytes like FlyDSL's, got {len(ours)}; first "
                              f"difference at offset 0x{_first_difference(ours, theirs):x}", kind=PROOF)
    diffs = [i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y]
    outside = [i for i in diffs if i not in ignore]
    if outside:
        raise CodeObjectError(f"prove {what}: expected bytes identical to FlyDSL's (both {len(ours)} bytes), got a "
                              f"difference at offset 0x{outside[0]:x} ({ours[outside[0]]:#04x} vs "
                              f"{theirs[outside[0]]:#04x}, {len(outside)} bytes differ)", kind=PROOF)
    return not diffs


def _section(co: CodeObjectFile, name: str) -> bytes | None:
    sec = co.elf.get_section_by_name(name)
    return None if sec is None else bytes(sec.data())


def _first_map_difference(a: Any, b: Any, path: str) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}{k}: {'missing' if k not in a else a[k]!r} vs {'missing' if k not in b else b[k]!r}"
            d = _first_map_difference(a[k], b[k], f"{path}{k}.")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path.rstrip('.')}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_map_difference(x, y, f"{path.rstrip('.')}[{i}].")
            if d:
                return d
        return None
    return None if a == b else f"{path.rstrip('.')}: {a!r} vs {b!r}"


def _kernel_symbols(co: CodeObjectFile) -> list[str]:
    return [str(k.get(".symbol", str(k.get(".name")) + ".kd"))[:-3] for k in co.kernels()]


def _prove_descriptor(ours: CodeObjectFile, theirs: CodeObjectFile, kernel: str) -> bool:
    """Compare ``<kernel>.kd`` field by field; True when all 64 bytes are equal, False when only the entry
    offset differs (and both entries land on the kernel at the same offset into ``.text``)."""
    try:
        kd_o, kd_t = ours.kernel_descriptor(kernel), theirs.kernel_descriptor(kernel)
    except CodeObjectError as e:
        raise CodeObjectError(f"prove kernel descriptor {kernel}.kd: {e}", kind=PROOF) from None
    for field, _, _ in KERNEL_DESCRIPTOR_FIELDS:
        if field != "kernel_code_entry_byte_offset" and kd_o[field] != kd_t[field]:
            raise CodeObjectError(f"prove kernel descriptor {kernel}.kd: expected field {field} = {kd_t[field]!r} "
                                  f"like FlyDSL's, got {kd_o[field]!r}", kind=PROOF)
    if kd_o["kernel_code_entry_byte_offset"] == kd_t["kernel_code_entry_byte_offset"]:
        return True
    lands = []
    for co, kd in ((ours, kd_o), (theirs, kd_t)):
        entry = int(kd["_entry"])
        sym = co.symbol_at(entry)
        lands.append((sym, entry - co.section_addr(".text")))
    if lands[0] != lands[1] or lands[0][0] != kernel:
        raise CodeObjectError(f"prove kernel descriptor {kernel}.kd: expected field kernel_code_entry_byte_offset to "
                              f"reach {kernel} at the same .text offset in both, got ours -> {lands[0][0]} at .text+"
                              f"0x{lands[0][1]:x}, FlyDSL's -> {lands[1][0]} at .text+0x{lands[1][1]:x}", kind=PROOF)
    return False


def _entry_offset_bytes(co: CodeObjectFile, kernels: list[str], section: str) -> set[int]:
    """Offsets in ``section`` of the entry-offset field of every kernel descriptor it holds."""
    out: set[int] = set()
    base = co.section_addr(section)
    for k in kernels:
        kd = co.get_symbol(k + ".kd")
        if kd.section == section:
            start = kd.value - base + _ENTRY_FIELD[0]
            out.update(range(start, start + _ENTRY_SIZE))
    return out


def _feature_differences(flags_ours: int, flags_theirs: int, target: str | None, symbol: str) -> list[str]:
    """Why ``e_flags`` may differ: only the xnack/sramecc fields, from FlyDSL's "any" to what ``target`` asks.

    Raises:
        CodeObjectError (kind PROOF): any other difference, or one the target ID does not ask for.
    """
    if flags_ours == flags_theirs:
        return []
    asked = {f[:-1]: "on" if f.endswith("+") else "off" for f in (target or "").split(":")[1:]}
    mask = sum(m for m, _ in _FEATURE_FIELDS.values())
    changes = []
    for name, (m, shift) in _FEATURE_FIELDS.items():
        o, t = _FEATURE_SETTINGS[(flags_ours & m) >> shift], _FEATURE_SETTINGS[(flags_theirs & m) >> shift]
        if o != t:
            if t != "any" or asked.get(name) != o:
                break
            changes.append(f"{name} {t} -> {o}")
    else:
        if (flags_ours & ~mask) == (flags_theirs & ~mask):
            return [f"e_flags 0x{flags_theirs:x} -> 0x{flags_ours:x}: {', '.join(changes)}, as target ID {target} "
                    "asks (FlyDSL compiles for the processor, whose 'any' code is correct under either setting)"]
    also = f", or only its any-settings set as {target} asks" if target and ":" in target else ""
    raise CodeObjectError(f"prove ELF header of {symbol}: expected e_flags 0x{flags_theirs:x} (processor and features) "
                          f"like FlyDSL's{also}, got 0x{flags_ours:x}", kind=PROOF)


def prove(ours: bytes, theirs: bytes, symbol: str, target: str | None = None) -> Proof:
    """Show that our code object equals FlyDSL's own, section by section (module docstring).

    Args:
        ours: the code object flyship assembled.
        theirs: FlyDSL's own (from :func:`extract_flydsl_binary`).
        symbol: the kernel symbol (``add_kernel_0``; its descriptor is ``add_kernel_0.kd``).
        target: the target ID ours was assembled for; with features, the differences they make are allowed
            and recorded (module docstring).

    Returns:
        The manifest's :class:`~flyship.bundle.manifest.Proof`: method ``flydsl-binary``, FlyDSL's sha256,
        the sections found identical, ``identical`` or ``identical-but-entry-offset``, metadata ``equal``.

    Raises:
        CodeObjectError (kind PROOF): a difference, naming the section or field, both sizes and the first
            differing offset.
    """
    try:
        co_o, co_t = CodeObjectFile(ours, "ours"), CodeObjectFile(theirs, "FlyDSL's")
    except CodeObjectError as e:
        raise CodeObjectError(f"prove {symbol}: {e}", kind=PROOF) from None
    identical = []
    text_o, text_t = _section(co_o, ".text"), _section(co_t, ".text")
    if text_o is None or text_t is None:
        raise CodeObjectError(f"prove .text of {symbol}: expected a .text section in both, got "
                              f"{'none' if text_o is None else len(text_o)} bytes in ours, "
                              f"{'none' if text_t is None else len(text_t)} in FlyDSL's", kind=PROOF)
    _compare_bytes(".text", text_o, text_t)
    identical.append(".text")

    differences = _feature_differences(int(co_o.elf["e_flags"]), int(co_t.elf["e_flags"]), target, symbol)

    try:
        meta_o, meta_t = co_o.metadata, co_t.metadata
        k_o, k_t = co_o.kernel(symbol), co_t.kernel(symbol)
    except CodeObjectError as e:
        raise CodeObjectError(f"prove metadata of {symbol}: {e}", kind=PROOF) from None
    t_o, t_t = meta_o.get("amdhsa.target"), meta_t.get("amdhsa.target")
    if differences and target and isinstance(t_t, str) and t_o == t_t + target[len(target.split(":")[0]):]:
        differences.append(f"amdhsa.target {t_t} -> {t_o}: the metadata names the target ID the e_flags declare")
    elif t_o != t_t:
        raise CodeObjectError(f"prove metadata of {symbol}: expected amdhsa.target = {t_t!r} like FlyDSL's, "
                              f"got {t_o!r}",
                              kind=PROOF)
    for key in ("amdhsa.version",):
        if meta_o.get(key) != meta_t.get(key):
            raise CodeObjectError(f"prove metadata of {symbol}: expected {key} = {meta_t.get(key)!r} like FlyDSL's, "
                                  f"got {meta_o.get(key)!r}", kind=PROOF)
    diff = _first_map_difference(k_o, k_t, "")
    if diff:
        raise CodeObjectError(f"prove metadata of {symbol}: expected the kernel's metadata map equal to FlyDSL's, "
                              f"got a difference at {diff} (ours vs FlyDSL's)", kind=PROOF)
    kernels = _kernel_symbols(co_t)
    if sorted(_kernel_symbols(co_o)) != sorted(kernels):
        raise CodeObjectError(f"prove metadata of {symbol}: expected kernels {sorted(kernels)} like FlyDSL's, got "
                              f"{sorted(_kernel_symbols(co_o))}", kind=PROOF)

    descriptors_identical = all([_prove_descriptor(co_o, co_t, k) for k in kernels])
    for name in (".rodata", ".data"):
        sec_o, sec_t = _section(co_o, name), _section(co_t, name)
        if sec_o is None and sec_t is None:
            continue
        if sec_o is None or sec_t is None:
            raise CodeObjectError(f"prove {name} of {symbol}: expected the section in both, got "
                                  f"{'none' if sec_o is None else len(sec_o)} bytes in ours, "
                                  f"{'none' if sec_t is None else len(sec_t)} in FlyDSL's", kind=PROOF)
        ignore = _entry_offset_bytes(co_o, kernels, name) & _entry_offset_bytes(co_t, kernels, name)
        if _compare_bytes(name, sec_o, sec_t, ignore):
            identical.append(name)
    return Proof(
        method=PROOF_METHOD,
        reference_sha256=hashlib.sha256(theirs).hexdigest(),
        identical_sections=tuple(identical),
        kernel_descriptor="identical" if descriptors_identical else "identical-but-entry-offset",
        metadata="equal",
        differences=tuple(differences),
    )


__all__ = ["PROOF", "FlydslObject", "extract_flydsl_objects", "extract_flydsl_binary", "prove", "PROOF_METHOD"]
