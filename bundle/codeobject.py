"""Read AMDGPU code objects (hsaco): the ``NT_AMDGPU_METADATA`` note, kernel descriptors, symbols.

Sources: LLVM AMDGPUUsage, "Code Object Metadata" (the note of type ``NT_AMDGPU_METADATA`` = 32,
owner ``"AMDGPU"``, a msgpack map with ``amdhsa.version`` and ``amdhsa.kernels``) and
"Kernel Descriptor" (64 bytes at symbol ``<kernel>.kd`` in ``.rodata``). ELF parsing is pyelftools',
the note payload msgpack's.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from typing import Any, Iterator

import msgpack
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from flyship.bundle.errors import CodeObjectError
from flyship.bundle.model import KernelMetadata, MetadataArg

NT_AMDGPU_METADATA = 32
EM_AMDGPU = 224
KERNEL_DESCRIPTOR_SIZE = 64
# Kernel descriptor layout (AMDGPUUsage, "Kernel Descriptor for GFX6-GFX12"): name, offset, struct format.
KERNEL_DESCRIPTOR_FIELDS: tuple[tuple[str, int, str], ...] = (
    ("group_segment_fixed_size", 0, "<I"),
    ("private_segment_fixed_size", 4, "<I"),
    ("kernarg_size", 8, "<I"),
    ("reserved0", 12, "<4s"),
    ("kernel_code_entry_byte_offset", 16, "<q"),
    ("reserved1", 24, "<20s"),
    ("compute_pgm_rsrc3", 44, "<I"),
    ("compute_pgm_rsrc1", 48, "<I"),
    ("compute_pgm_rsrc2", 52, "<I"),
    ("kernel_code_properties", 56, "<H"),
    ("kernarg_preload", 58, "<H"),
    ("reserved2", 60, "<4s"),
)


@dataclasses.dataclass(frozen=True)
class Symbol:
    """An ELF symbol: name, value (address), size, section index name and binding."""

    name: str
    value: int
    size: int
    section: str
    bind: str
    type: str


class CodeObjectFile:
    """A parsed AMDGPU code object.

    Args:
        data: the whole ELF image (bytes of a ``.hsaco``).
        name: a label for error messages (usually the file path).

    Raises:
        CodeObjectError: not an ELF, not an AMDGPU ELF, or no metadata note.
    """

    def __init__(self, data: bytes, name: str = "<code object>") -> None:
        self.data = bytes(data)
        self.name = name
        try:
            self.elf = ELFFile(io.BytesIO(self.data))
        except ELFError as e:
            raise CodeObjectError(f"read code object {name}: expected an ELF file, got unparseable data ({e})") from None
        if self.elf["e_machine"] not in ("EM_AMDGPU", EM_AMDGPU):
            raise CodeObjectError(f"read code object {name}: expected an AMDGPU ELF (e_machine EM_AMDGPU), "
                                  f"got {self.elf['e_machine']}")
        self._meta: dict[str, Any] | None = None

    # -- notes -------------------------------------------------------------------------------
    def iter_notes(self) -> Iterator[tuple[str, int, bytes]]:
        """Yield ``(owner, type, descriptor bytes)`` for each ELF note."""
        for sec in self.elf.iter_sections():
            if sec["sh_type"] != "SHT_NOTE":
                continue
            for note in sec.iter_notes():
                desc = note["n_descdata"]
                if isinstance(desc, str):
                    desc = desc.encode("latin-1")
                ntype = note["n_type"]
                if isinstance(ntype, str):  # pyelftools names some AMDGPU note types
                    ntype = NT_AMDGPU_METADATA if "AMDGPU_METADATA" in ntype else -1
                yield note["n_name"], ntype, bytes(desc)

    @property
    def metadata(self) -> dict[str, Any]:
        """The decoded ``NT_AMDGPU_METADATA`` msgpack map (``amdhsa.version``, ``amdhsa.kernels``, ...)."""
        if self._meta is None:
            for owner, ntype, desc in self.iter_notes():
                if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
                    self._meta = msgpack.unpackb(desc, raw=False, strict_map_key=False)
                    break
            else:
                raise CodeObjectError(f"read code object {self.name}: no NT_AMDGPU_METADATA note; expected a "
                                      "code object v3 or later (FlyDSL and Triton emit v5/v6)")
        return self._meta

    @property
    def target(self) -> str:
        """``amdhsa.target`` without the triple, e.g. ``gfx942`` or ``gfx942:sramecc+:xnack-``."""
        t = str(self.metadata.get("amdhsa.target", ""))
        # "<arch>-<vendor>-<os>-<environment>-<target id>": the environment may be empty and the target ID may
        # hold dashes (gfx9-4-generic, gfx942:sramecc-:xnack-), so split on the first four dashes only.
        parts = t.split("-", 4)
        return parts[4] if len(parts) == 5 else t.rsplit("-", 1)[-1]

    @property
    def code_object_version(self) -> int:
        """AMDHSA code object version from ``e_ident[EI_ABIVERSION]`` (ELFABIVERSION_AMDGPU_HSA_V5 = 3,
        V6 = 4; AMDGPUUsage "ELF Header")."""
        abi = self.elf["e_ident"]["EI_ABIVERSION"]
        return {2: 4, 3: 5, 4: 6}.get(int(abi), -1)

    def kernels(self) -> list[dict[str, Any]]:
        return list(self.metadata.get("amdhsa.kernels", []))

    def kernel(self, symbol: str | None = None) -> dict[str, Any]:
        """The metadata map of one kernel (``.symbol`` is ``<name>.kd``); the only one if ``symbol`` is None.

        Raises:
            CodeObjectError: no such kernel, or several and none named; lists the kernels.
        """
        ks = self.kernels()
        names = [str(k.get(".name")) for k in ks]
        if symbol is None:
            if len(ks) != 1:
                raise CodeObjectError(f"code object {self.name}: expected exactly one kernel, found {names}; "
                                      "name the kernel symbol")
            return ks[0]
        for k in ks:
            if k.get(".name") == symbol or k.get(".symbol") == symbol + ".kd":
                return k
        raise CodeObjectError(f"code object {self.name}: no kernel {symbol!r}; it has {names}")

    def kernel_metadata(self, symbol: str | None = None) -> KernelMetadata:
        """The kernel's metadata as the manifest records it."""
        k = self.kernel(symbol)
        req = k.get(".reqd_workgroup_size")
        return KernelMetadata(
            kernarg_segment_size=int(k[".kernarg_segment_size"]),
            kernarg_segment_align=int(k[".kernarg_segment_align"]),
            group_segment_fixed_size=int(k[".group_segment_fixed_size"]),
            private_segment_fixed_size=int(k[".private_segment_fixed_size"]),
            sgpr_count=int(k.get(".sgpr_count", 0)),
            vgpr_count=int(k.get(".vgpr_count", 0)),
            agpr_count=int(k.get(".agpr_count", 0)),
            wavefront_size=int(k[".wavefront_size"]),
            max_flat_workgroup_size=int(k.get(".max_flat_workgroup_size", 1024)),
            reqd_workgroup_size=tuple(int(x) for x in req) if req else None,
            args=tuple(
                MetadataArg(offset=int(a[".offset"]), size=int(a[".size"]), value_kind=str(a[".value_kind"]),
                            name=a.get(".name"))
                for a in k.get(".args", [])
            ),
        )

    # -- symbols and sections --------------------------------------------------------------
    def symbols(self) -> list[Symbol]:
        """Every named symbol of the symbol tables (read once per object: the proof asks many times)."""
        cached = self.__dict__.get("_symbols")
        if cached is None:
            cached = self.__dict__["_symbols"] = tuple(self._read_symbols())
        return list(cached)

    def _read_symbols(self) -> list[Symbol]:
        out = []
        for sec in self.elf.iter_sections():
            if sec["sh_type"] not in ("SHT_SYMTAB", "SHT_DYNSYM"):
                continue
            for s in sec.iter_symbols():
                if not s.name:
                    continue
                shndx = s["st_shndx"]
                secname = self.elf.get_section(shndx).name if isinstance(shndx, int) else str(shndx)
                out.append(Symbol(s.name, int(s["st_value"]), int(s["st_size"]), secname,
                                  s["st_info"]["bind"], s["st_info"]["type"]))
        return out

    def get_symbol(self, name: str) -> Symbol:
        """Raises CodeObjectError listing the defined symbols when ``name`` is absent."""
        for s in self.symbols():
            if s.name == name and s.section != "SHN_UNDEF":
                return s
        raise CodeObjectError(f"code object {self.name}: no symbol {name!r}; defined: "
                              f"{sorted({s.name for s in self.symbols() if s.section != 'SHN_UNDEF'})}")

    def undefined_symbols(self) -> list[str]:
        """Names of symbols referenced but not defined (a linked code object must have none)."""
        return sorted({s.name for s in self.symbols() if s.section == "SHN_UNDEF"})

    def section_bytes(self, name: str) -> bytes:
        sec = self.elf.get_section_by_name(name)
        if sec is None:
            raise CodeObjectError(f"code object {self.name}: no section {name!r}")
        return bytes(sec.data())

    def section_addr(self, name: str) -> int:
        sec = self.elf.get_section_by_name(name)
        if sec is None:
            raise CodeObjectError(f"code object {self.name}: no section {name!r}")
        return int(sec["sh_addr"])

    def kernel_descriptor(self, symbol: str) -> dict[str, int | bytes]:
        """Decode the 64-byte kernel descriptor at ``<symbol>.kd``.

        Returns:
            field name -> value, plus ``"_address"`` (the descriptor's address) and
            ``"_entry"`` (the address its code entry offset resolves to).
        """
        kd = self.get_symbol(symbol + ".kd")
        raw = self._bytes_at(kd.value, KERNEL_DESCRIPTOR_SIZE, kd.section)
        out: dict[str, int | bytes] = {}
        for name, off, fmt in KERNEL_DESCRIPTOR_FIELDS:
            out[name] = struct.unpack_from(fmt, raw, off)[0]
        out["_address"] = kd.value
        out["_entry"] = kd.value + int(out["kernel_code_entry_byte_offset"])
        return out

    def _bytes_at(self, addr: int, size: int, section: str) -> bytes:
        sec = self.elf.get_section_by_name(section)
        if sec is None:
            raise CodeObjectError(f"code object {self.name}: no section {section!r}")
        start = addr - int(sec["sh_addr"])
        data = sec.data()
        if start < 0 or start + size > len(data):
            raise CodeObjectError(f"code object {self.name}: {size} bytes at 0x{addr:x} lie outside {section}")
        return bytes(data[start:start + size])

    def symbol_at(self, addr: int) -> str | None:
        """Name of a function symbol whose address is ``addr``, if any."""
        for s in self.symbols():
            if s.value == addr and s.type == "STT_FUNC":
                return s.name
        return None
