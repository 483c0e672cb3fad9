"""Read NVIDIA cubins: kernel parameters, registers, shared memory and thread limits from ``.nv.info``.

A cubin is an ELF file (``e_machine`` EM_CUDA = 190). NVIDIA does not publish its layout; what this
module decodes was checked field by field against ``cuobjdump -elf`` (CUDA 12.8, shipped inside the
``triton`` wheel as ``triton/backends/nvidia/bin/cuobjdump``) on cubins that ptxas 12.8 / 12.9 made
for sm_80, sm_90a, sm_100a and sm_120a (``tests/bundle/test_cubin.py`` repeats the comparison).

* ``.nv.info`` (global) and ``.nv.info.<kernel>`` (per kernel, ``sh_info`` = its ``.text`` section) are
  sequences of *EIATTR* records: ``u8 format, u8 attribute``, then for format EIFMT_HVAL (3) a ``u16``
  value, for EIFMT_SVAL (4) a ``u16`` length and that many payload bytes (EIFMT_NVAL (1): no value;
  EIFMT_BVAL (2): one byte, both padded to 4 bytes).
* ``EIATTR_KPARAM_INFO`` (0x17, 12 bytes): ``u32 index, u16 ordinal, u16 offset, u32 flags`` where
  ``flags`` packs the pointee's log2 alignment (bits 0-7), the pointee's state space (bits 8-11; 4 for
  ``.ptr .global`` params, 0 for values), the constant bank (bits 12-16), a bit meaning "not in a
  constant bank" (bit 17) and the size in bytes (bits 18-31).
* ``EIATTR_CBANK_PARAM_SIZE`` (0x19, HVAL): bytes of parameters; ``EIATTR_PARAM_CBANK`` (0x0a):
  ``u32 symbol index of .nv.constant0.<kernel>, u16 offset, u16 size`` of the parameter window.
* ``EIATTR_REGCOUNT`` (0x2f), ``EIATTR_FRAME_SIZE`` (0x11), ``EIATTR_MIN_STACK_SIZE`` (0x12) live in
  the global ``.nv.info`` as ``u32 symbol index, u32 value``.
* ``EIATTR_REQNTID`` (0x10) and ``EIATTR_MAX_THREADS`` (0x05): three ``u32`` (x, y, z) from PTX
  ``.reqntid`` / ``.maxntid``.
* ``.nv.shared.<kernel>`` (NOBITS): static shared memory of the kernel, bytes.
* ``e_flags``: ELF ABI version 7 (up to CUDA 12.8 for sm_90 and older) keeps the SM in bits 0-7 and the
  arch-specific ``a`` flag in bit 11 (0x800); ABI version 8 (sm_100 and newer) keeps the SM in bits 8-15
  and ``a`` in bit 3 (0x8).
"""

from __future__ import annotations

import dataclasses
import io
import struct
from typing import Iterator, Optional, Sequence

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from flyship.bundle.errors import CodeObjectError
from flyship.bundle.model import KernelMetadata, MetadataArg

EM_CUDA = 190
WARP_SIZE = 32

EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_MAX_THREADS = 0x05
EIATTR_PARAM_CBANK = 0x0A
EIATTR_REQNTID = 0x10
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_MAXREG_COUNT = 0x1B
EIATTR_REGCOUNT = 0x2F
EIATTR_KPARAM_INFO_V2 = 0x45

# Attribute names as cuobjdump prints them (the numbering is public through open-source cubin tools
# and was checked against cuobjdump for every attribute Triton's kernels carry).
EIATTR_NAMES: dict[int, str] = {
    0x01: "EIATTR_PAD", 0x02: "EIATTR_IMAGE_SLOT", 0x03: "EIATTR_JUMPTABLE_RELOCS", 0x04: "EIATTR_CTAIDZ_USED",
    0x05: "EIATTR_MAX_THREADS", 0x06: "EIATTR_IMAGE_OFFSET", 0x07: "EIATTR_IMAGE_SIZE",
    0x08: "EIATTR_TEXTURE_NORMALIZED", 0x09: "EIATTR_SAMPLER_INIT", 0x0A: "EIATTR_PARAM_CBANK",
    0x0B: "EIATTR_SMEM_PARAM_OFFSETS", 0x0C: "EIATTR_CBANK_PARAM_OFFSETS", 0x0D: "EIATTR_SYNC_STACK",
    0x0E: "EIATTR_TEXID_SAMPID_MAP", 0x0F: "EIATTR_EXTERNS", 0x10: "EIATTR_REQNTID", 0x11: "EIATTR_FRAME_SIZE",
    0x12: "EIATTR_MIN_STACK_SIZE", 0x13: "EIATTR_SAMPLER_FORCE_UNNORMALIZED",
    0x14: "EIATTR_BINDLESS_IMAGE_OFFSETS", 0x15: "EIATTR_BINDLESS_TEXTURE_BANK",
    0x16: "EIATTR_BINDLESS_SURFACE_BANK", 0x17: "EIATTR_KPARAM_INFO", 0x18: "EIATTR_SMEM_PARAM_SIZE",
    0x19: "EIATTR_CBANK_PARAM_SIZE", 0x1A: "EIATTR_QUERY_NUMATTRIB", 0x1B: "EIATTR_MAXREG_COUNT",
    0x1C: "EIATTR_EXIT_INSTR_OFFSETS", 0x1D: "EIATTR_S2RCTAID_INSTR_OFFSETS", 0x1E: "EIATTR_CRS_STACK_SIZE",
    0x1F: "EIATTR_NEED_CNP_WRAPPER", 0x20: "EIATTR_NEED_CNP_PATCH", 0x21: "EIATTR_EXPLICIT_CACHING",
    0x22: "EIATTR_ISTYPEP_USED", 0x23: "EIATTR_MAX_STACK_SIZE", 0x24: "EIATTR_SUQ_USED",
    0x25: "EIATTR_LD_CACHEMOD_INSTR_OFFSETS", 0x26: "EIATTR_LOAD_CACHE_REQUEST",
    0x27: "EIATTR_ATOM_SYS_INSTR_OFFSETS", 0x28: "EIATTR_COOP_GROUP_INSTR_OFFSETS",
    0x29: "EIATTR_COOP_GROUP_MASK_REGIDS", 0x2A: "EIATTR_SW1850030_WAR", 0x2B: "EIATTR_WMMA_USED",
    0x2C: "EIATTR_HAS_PRE_V10_OBJECT", 0x2D: "EIATTR_ATOMF16_EMUL_INSTR_OFFSETS",
    0x2E: "EIATTR_ATOM16_EMUL_INSTR_REG_MAP", 0x2F: "EIATTR_REGCOUNT", 0x30: "EIATTR_SW2393858_WAR",
    0x31: "EIATTR_INT_WARP_WIDE_INSTR_OFFSETS", 0x32: "EIATTR_SHARED_SCRATCH", 0x33: "EIATTR_STATISTICS",
    0x34: "EIATTR_INDIRECT_BRANCH_TARGETS", 0x35: "EIATTR_SW2861232_WAR", 0x36: "EIATTR_SW_WAR",
    0x37: "EIATTR_CUDA_API_VERSION", 0x38: "EIATTR_NUM_MBARRIERS", 0x39: "EIATTR_MBARRIER_INSTR_OFFSETS",
    0x3A: "EIATTR_COROUTINE_RESUME_ID_OFFSETS", 0x3B: "EIATTR_SAM_REGION_STACK_SIZE",
    0x3C: "EIATTR_PER_REG_TARGET_PERF_STATS", 0x3D: "EIATTR_CTA_PER_CLUSTER", 0x3E: "EIATTR_EXPLICIT_CLUSTER",
    0x3F: "EIATTR_MAX_CLUSTER_RANK", 0x40: "EIATTR_INSTR_REG_MAP", 0x41: "EIATTR_RESERVED_SMEM_USED",
    0x42: "EIATTR_RESERVED_SMEM_0_SIZE", 0x43: "EIATTR_UCODE_SECTION_DATA",
    0x44: "EIATTR_UNUSED_LOAD_BYTE_OFFSET", 0x45: "EIATTR_KPARAM_INFO_V2", 0x46: "EIATTR_SYSCALL_OFFSETS",
    0x47: "EIATTR_SW_WAR_MEMBAR_SYS_INSTR_OFFSETS", 0x48: "EIATTR_GRAPHICS_GLOBAL_CBANK",
    0x49: "EIATTR_SHADER_TYPE", 0x4A: "EIATTR_VRC_CTA_INIT_COUNT", 0x4B: "EIATTR_TOOLS_PATCH_FUNC",
    0x4C: "EIATTR_NUM_BARRIERS", 0x4D: "EIATTR_TEXMODE_INDEPENDENT", 0x4E: "EIATTR_PERF_STATISTICS",
    0x4F: "EIATTR_AT_ENTRY_FRAGMENTS", 0x50: "EIATTR_SPARSE_MMA_MASK", 0x51: "EIATTR_TCGEN05_1CTA_USED",
    0x52: "EIATTR_TCGEN05_2CTA_USED", 0x53: "EIATTR_GEN_ERRBAR_AT_EXIT", 0x54: "EIATTR_REG_RECONFIG",
    0x55: "EIATTR_ANNOTATIONS", 0x56: "EIATTR_SANITIZE", 0x57: "EIATTR_STACK_CANARY_TRAP_OFFSETS",
    0x58: "EIATTR_STUB_FUNCTION_KIND", 0x59: "EIATTR_LOCAL_CTA_ASYNC_STORE_OFFSETS",
    0x5A: "EIATTR_MERCURY_FINALIZER_OPTIONS",
}

# e_flags (see the module docstring).
_V7_SM_MASK, _V7_ARCH_SPECIFIC = 0xFF, 0x800
_V8_SM_SHIFT, _V8_ARCH_SPECIFIC = 8, 0x8


@dataclasses.dataclass(frozen=True)
class NvInfoAttribute:
    """One EIATTR record of a ``.nv.info`` section.

    Attributes:
        code: attribute number (``EIATTR_*``).
        format: ``EIFMT_NVAL`` / ``EIFMT_BVAL`` / ``EIFMT_HVAL`` / ``EIFMT_SVAL``.
        value: the inline value for NVAL (0), BVAL and HVAL records, else None.
        payload: the payload bytes of an SVAL record (empty otherwise).
        offset: where the record starts in its section, bytes.
    """

    code: int
    format: int
    value: Optional[int]
    payload: bytes
    offset: int

    @property
    def name(self) -> str:
        """The attribute's name as cuobjdump prints it (``EIATTR_UNKNOWN_0x..`` if unknown)."""
        return EIATTR_NAMES.get(self.code, f"EIATTR_UNKNOWN_0x{self.code:02x}")

    def words(self) -> tuple[int, ...]:
        """The SVAL payload as little-endian ``u32`` words."""
        n = len(self.payload) // 4
        return struct.unpack_from(f"<{n}I", self.payload) if n else ()


@dataclasses.dataclass(frozen=True)
class KernelParam:
    """One kernel parameter from ``EIATTR_KPARAM_INFO``.

    Attributes:
        ordinal: position in the kernel's parameter list (PTX ``.param`` order).
        offset: byte offset in the parameter buffer (what ``CU_LAUNCH_PARAM_BUFFER_POINTER`` points to).
        size: bytes.
        log_alignment: log2 of the pointee's alignment (0 when not declared).
        space: the pointee's state space (4 for ``.ptr .global`` pointers, 0 for values).
        cbank: constant bank holding the parameter (0x1f for the parameter bank).
        in_cbank: the parameter lives in a constant bank (always true from sm_20 on).
    """

    ordinal: int
    offset: int
    size: int
    log_alignment: int
    space: int
    cbank: int
    in_cbank: bool


class CubinFile:
    """A parsed NVIDIA cubin.

    Args:
        data: the whole ELF image (bytes of a ``.cubin``).
        name: a label for error messages (usually the file path).

    Raises:
        CodeObjectError: not an ELF, or not a CUDA ELF (``e_machine`` EM_CUDA).

    Example::

        cubin = CubinFile(Path("add.sm_90a.cubin").read_bytes())
        meta = cubin.kernel_metadata("add_kernel", pointer_ordinals={0, 1, 2, 4, 5})
    """

    def __init__(self, data: bytes, name: str = "<cubin>") -> None:
        self.data = bytes(data)
        self.name = name
        try:
            self.elf = ELFFile(io.BytesIO(self.data))
        except ELFError as e:
            raise CodeObjectError(f"read cubin {name}: expected an ELF file, got unparseable data ({e})") from None
        if self.elf["e_machine"] not in ("EM_CUDA", EM_CUDA):
            raise CodeObjectError(f"read cubin {name}: expected a CUDA ELF (e_machine EM_CUDA = 190), "
                                  f"got {self.elf['e_machine']}")

    # -- header --------------------------------------------------------------------------------
    @property
    def abi_version(self) -> int:
        """``e_ident[EI_ABIVERSION]`` (7 for sm_90 and older from CUDA 12.8, 8 for sm_100 and newer)."""
        return int(self.elf["e_ident"]["EI_ABIVERSION"])

    @property
    def target(self) -> str:
        """The SM the code runs on, as a target ID: ``sm_80``, ``sm_90a``, ``sm_100a``.

        Raises:
            CodeObjectError: an ELF ABI version this reader does not know.
        """
        flags = int(self.elf["e_flags"])
        if self.abi_version <= 7:
            sm, arch_specific = flags & _V7_SM_MASK, bool(flags & _V7_ARCH_SPECIFIC)
        elif self.abi_version == 8:
            sm, arch_specific = (flags >> _V8_SM_SHIFT) & 0xFF, bool(flags & _V8_ARCH_SPECIFIC)
        else:
            raise CodeObjectError(f"cubin {self.name}: ELF ABI version {self.abi_version} is newer than this "
                                  "reader knows (7, 8); update flyship.bundle.cubin")
        return f"sm_{sm}" + ("a" if arch_specific else "")

    # -- symbols and sections ------------------------------------------------------------------
    def _symtab(self):
        sec = self.elf.get_section_by_name(".symtab")
        if sec is None:
            raise CodeObjectError(f"cubin {self.name}: no .symtab section")
        return sec

    def kernel_names(self) -> list[str]:
        """Names of the kernels (entry functions): every ``.text.<name>`` with a ``.nv.info.<name>``."""
        names = []
        for sec in self.elf.iter_sections():
            if sec.name.startswith(".nv.info.") and self.elf.get_section_by_name(".text." + sec.name[9:]):
                names.append(sec.name[9:])
        return names

    def _kernel(self, kernel: Optional[str]) -> str:
        names = self.kernel_names()
        if kernel is None:
            if len(names) != 1:
                raise CodeObjectError(f"cubin {self.name}: expected exactly one kernel, found {names}; name it")
            return names[0]
        if kernel not in names:
            raise CodeObjectError(f"cubin {self.name}: no kernel {kernel!r}; it has {names}")
        return kernel

    def symbol_index(self, name: str) -> int:
        """Index in ``.symtab`` of the function symbol ``name``.

        Raises:
            CodeObjectError: no such function symbol; lists the function symbols.
        """
        funcs = []
        for i, s in enumerate(self._symtab().iter_symbols()):
            if s["st_info"]["type"] == "STT_FUNC":
                funcs.append(s.name)
                if s.name == name:
                    return i
        raise CodeObjectError(f"cubin {self.name}: no function symbol {name!r}; functions: {funcs}")

    def section_size(self, name: str) -> int:
        """``sh_size`` of a section (NOBITS included), or 0 when the cubin has no such section."""
        sec = self.elf.get_section_by_name(name)
        return int(sec["sh_size"]) if sec is not None else 0

    # -- .nv.info --------------------------------------------------------------------------------
    def iter_attributes(self, section: str = ".nv.info") -> Iterator[NvInfoAttribute]:
        """Yield the EIATTR records of ``section`` (``.nv.info`` or ``.nv.info.<kernel>``) in file order.

        Raises:
            CodeObjectError: the section is missing, or a record is truncated or of an unknown format.
        """
        sec = self.elf.get_section_by_name(section)
        if sec is None:
            raise CodeObjectError(f"cubin {self.name}: no section {section!r}")
        data = bytes(sec.data())
        pos = 0
        while pos < len(data):
            if pos + 2 > len(data):
                raise CodeObjectError(f"cubin {self.name}: {section} truncated at byte {pos}")
            fmt, code = data[pos], data[pos + 1]
            if fmt == EIFMT_NVAL:
                yield NvInfoAttribute(code, fmt, 0, b"", pos)
                pos += 4
            elif fmt == EIFMT_BVAL:
                yield NvInfoAttribute(code, fmt, data[pos + 2], b"", pos)
                pos += 4
            elif fmt == EIFMT_HVAL:
                yield NvInfoAttribute(code, fmt, struct.unpack_from("<H", data, pos + 2)[0], b"", pos)
                pos += 4
            elif fmt == EIFMT_SVAL:
                (size,) = struct.unpack_from("<H", data, pos + 2)
                if pos + 4 + size > len(data):
                    raise CodeObjectError(f"cubin {self.name}: {section}: record at byte {pos} claims {size} "
                                          f"bytes, {len(data) - pos - 4} remain")
                yield NvInfoAttribute(code, fmt, None, data[pos + 4:pos + 4 + size], pos)
                pos += 4 + size
            else:
                raise CodeObjectError(f"cubin {self.name}: {section}: record at byte {pos} has unknown format "
                                      f"{fmt}; expected 1 (NVAL), 2 (BVAL), 3 (HVAL) or 4 (SVAL)")

    def _indexed(self, code: int, sym: int) -> Optional[int]:
        """Value of an ``.nv.info`` record of ``code`` whose payload is ``u32 symbol, u32 value``."""
        if self.elf.get_section_by_name(".nv.info") is None:
            return None
        for a in self.iter_attributes(".nv.info"):
            if a.code == code and len(a.payload) == 8:
                s, v = struct.unpack("<II", a.payload)
                if s == sym:
                    return v
        return None

    def kernel_params(self, kernel: Optional[str] = None) -> list[KernelParam]:
        """The kernel's parameters from ``EIATTR_KPARAM_INFO``, sorted by ordinal.

        Raises:
            CodeObjectError: no parameter records, a malformed record, a parameter outside a constant
                bank, an ``EIATTR_KPARAM_INFO_V2`` record (not produced by the ptxas Triton ships, and its
                layout is not verified here), or ordinals that are not 0..n-1.
        """
        k = self._kernel(kernel)
        out: dict[int, KernelParam] = {}
        for a in self.iter_attributes(".nv.info." + k):
            if a.code == EIATTR_KPARAM_INFO_V2:
                raise CodeObjectError(f"cubin {self.name}: kernel {k} describes its parameters with "
                                      "EIATTR_KPARAM_INFO_V2, whose layout flyship has not verified against "
                                      "cuobjdump; refusing rather than guessing")
            if a.code != EIATTR_KPARAM_INFO:
                continue
            if len(a.payload) != 12:
                raise CodeObjectError(f"cubin {self.name}: kernel {k}: EIATTR_KPARAM_INFO at byte {a.offset} "
                                      f"has {len(a.payload)} payload bytes, expected 12")
            _index, ordinal, offset, flags = struct.unpack("<IHHI", a.payload)
            p = KernelParam(ordinal=ordinal, offset=offset, size=flags >> 18, log_alignment=flags & 0xFF,
                            space=(flags >> 8) & 0xF, cbank=(flags >> 12) & 0x1F, in_cbank=not (flags >> 17) & 1)
            if not p.in_cbank:
                raise CodeObjectError(f"cubin {self.name}: kernel {k}: parameter {ordinal} is not in a constant "
                                      "bank; only sm_20+ cubins (parameters in cbank 0) are supported")
            if ordinal in out:
                raise CodeObjectError(f"cubin {self.name}: kernel {k}: parameter ordinal {ordinal} described twice")
            out[ordinal] = p
        if sorted(out) != list(range(len(out))):
            raise CodeObjectError(f"cubin {self.name}: kernel {k}: parameter ordinals {sorted(out)} are not "
                                  f"0..{len(out) - 1}")
        return [out[i] for i in range(len(out))]

    def param_bytes(self, kernel: Optional[str] = None) -> int:
        """Bytes of parameters: ``EIATTR_CBANK_PARAM_SIZE``, checked against ``EIATTR_PARAM_CBANK``.

        Raises:
            CodeObjectError: both records missing, or they disagree.
        """
        k = self._kernel(kernel)
        size, window = None, None
        for a in self.iter_attributes(".nv.info." + k):
            if a.code == EIATTR_CBANK_PARAM_SIZE:
                size = a.value
            elif a.code == EIATTR_PARAM_CBANK and len(a.payload) == 8:
                window = struct.unpack("<IHH", a.payload)[2]
        if size is None and window is None:
            if not self.kernel_params(k):
                return 0
            raise CodeObjectError(f"cubin {self.name}: kernel {k} has parameters but neither "
                                  "EIATTR_CBANK_PARAM_SIZE nor EIATTR_PARAM_CBANK")
        if size is not None and window is not None and size != window:
            raise CodeObjectError(f"cubin {self.name}: kernel {k}: EIATTR_CBANK_PARAM_SIZE {size} != "
                                  f"EIATTR_PARAM_CBANK size {window}")
        return int(size if size is not None else window)

    def _threads(self, kernel: str, code: int) -> Optional[tuple[int, int, int]]:
        for a in self.iter_attributes(".nv.info." + kernel):
            if a.code == code:
                w = a.words()
                if len(w) != 3:
                    raise CodeObjectError(f"cubin {self.name}: kernel {kernel}: {a.name} has {len(w)} words, "
                                          "expected 3 (x, y, z)")
                return (int(w[0]), int(w[1]), int(w[2]))
        return None

    def reqntid(self, kernel: Optional[str] = None) -> Optional[tuple[int, int, int]]:
        """The block size the kernel requires (PTX ``.reqntid``, ``EIATTR_REQNTID``), or None."""
        return self._threads(self._kernel(kernel), EIATTR_REQNTID)

    def maxntid(self, kernel: Optional[str] = None) -> Optional[tuple[int, int, int]]:
        """The largest block the kernel supports (PTX ``.maxntid``, ``EIATTR_MAX_THREADS``), or None."""
        return self._threads(self._kernel(kernel), EIATTR_MAX_THREADS)

    def registers(self, kernel: Optional[str] = None) -> int:
        """Registers per thread (``EIATTR_REGCOUNT`` in ``.nv.info``).

        Raises:
            CodeObjectError: the cubin records no register count for the kernel.
        """
        k = self._kernel(kernel)
        v = self._indexed(EIATTR_REGCOUNT, self.symbol_index(k))
        if v is None:
            raise CodeObjectError(f"cubin {self.name}: kernel {k} has no EIATTR_REGCOUNT record")
        return v

    def frame_size(self, kernel: Optional[str] = None) -> int:
        """Per-thread stack frame (local memory, spills included), bytes (``EIATTR_FRAME_SIZE``; 0 if absent)."""
        k = self._kernel(kernel)
        return self._indexed(EIATTR_FRAME_SIZE, self.symbol_index(k)) or 0

    # Shared memory the system reserves per block on sm_80 and newer (CUDA C++ Programming Guide,
    # cudaDevAttrReservedSharedMemoryPerBlock: 1 KiB). ptxas places it at the start of the kernel's
    # ``.nv.shared.<kernel>`` window and references it through ``.nv.reservedSmem.*`` symbols; the driver's
    # CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES does not count it (tests/gpu/test_cubin_driver.py checks this).
    RESERVED_SHARED_PER_BLOCK = 1024

    def reserved_shared(self) -> int:
        """Bytes of the kernel's shared window that are the system's reservation (0 when not referenced)."""
        for s in self._symtab().iter_symbols():
            if s.name.startswith(".nv.reservedSmem"):
                return self.RESERVED_SHARED_PER_BLOCK
        return 0

    def static_shared(self, kernel: Optional[str] = None) -> int:
        """Static shared memory the kernel itself declares, bytes: the size of ``.nv.shared.<kernel>`` less
        the system's reservation (:meth:`reserved_shared`); 0 when the section is absent."""
        size = self.section_size(".nv.shared." + self._kernel(kernel))
        return max(0, size - self.reserved_shared()) if size else 0

    # -- the manifest's view -----------------------------------------------------------------------
    def kernel_metadata(self, kernel: Optional[str] = None, pointer_ordinals: Sequence[int] = (),
                        names: Optional[Sequence[str]] = None, max_threads: int = 1024) -> KernelMetadata:
        """The kernel's facts as the manifest records them (``docs/bundle-format.md``, "metadata").

        Args:
            kernel: kernel name; the only one when None.
            pointer_ordinals: parameters known (from the frontend's signature) to be 8-byte global pointers;
                they get ``value_kind`` ``global_buffer``, every other parameter ``by_value``.
            names: optional parameter names, by ordinal, for people reading the manifest.
            max_threads: the target's block limit, used when the cubin declares neither ``.maxntid`` nor
                ``.reqntid``.

        Returns:
            A :class:`KernelMetadata`: parameter offsets and sizes as ``args``, the parameter bytes as
            ``kernarg_segment_size``, the largest parameter alignment as ``kernarg_segment_align``, static
            shared memory as ``group_segment_fixed_size``, the stack frame as ``private_segment_fixed_size``,
            registers as ``vgpr_count``, warp size 32, ``.maxntid`` (else the product of ``.reqntid``, else
            ``max_threads``) as ``max_flat_workgroup_size`` and ``.reqntid`` as ``reqd_workgroup_size``.

        Raises:
            CodeObjectError: a pointer ordinal that is not an 8-byte parameter, names of the wrong length,
                parameters that overlap or run past the parameter bytes, or any error of the readers above.
        """
        k = self._kernel(kernel)
        params = self.kernel_params(k)
        total = self.param_bytes(k)
        pointers = set(pointer_ordinals)
        if names is not None and len(names) != len(params):
            raise CodeObjectError(f"cubin {self.name}: kernel {k} has {len(params)} parameters, got {len(names)} "
                                  f"names ({list(names)})")
        for o in sorted(pointers):
            if o >= len(params) or params[o].size != 8:
                got = f"size {params[o].size}" if o < len(params) else "no such parameter"
                raise CodeObjectError(f"cubin {self.name}: kernel {k}: parameter {o} should be an 8-byte pointer, "
                                      f"got {got}")
        end = 0
        for p in sorted(params, key=lambda p: p.offset):
            if p.offset < end or p.offset + p.size > total:
                raise CodeObjectError(f"cubin {self.name}: kernel {k}: parameter {p.ordinal} at {p.offset} "
                                      f"(size {p.size}) overlaps another or runs past the {total} parameter bytes")
            end = p.offset + p.size
        args = tuple(
            MetadataArg(offset=p.offset, size=p.size,
                        value_kind="global_buffer" if p.ordinal in pointers else "by_value",
                        name=names[p.ordinal] if names is not None else None)
            for p in params
        )
        req = self.reqntid(k)
        maxn = self.maxntid(k)
        if maxn is not None:
            limit = maxn[0] * maxn[1] * maxn[2]
        elif req is not None:
            limit = req[0] * req[1] * req[2]
        else:
            limit = max_threads
        return KernelMetadata(
            kernarg_segment_size=total,
            kernarg_segment_align=max((min(p.size, 8) for p in params), default=1),
            group_segment_fixed_size=self.static_shared(k),
            private_segment_fixed_size=self.frame_size(k),
            sgpr_count=0,
            vgpr_count=self.registers(k),
            agpr_count=0,
            wavefront_size=WARP_SIZE,
            max_flat_workgroup_size=limit,
            reqd_workgroup_size=req,
            args=args,
        )
