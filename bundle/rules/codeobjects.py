"""Rules on code objects: a code object's own facts against its variant."""

from __future__ import annotations

import struct

from flyship.bundle import model as _m
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError, CodeObjectError
from flyship.bundle.rules.layout import check_layout
from flyship.bundle.rules.resources import check_metadata, check_resources


# What a malformed ELF can make pyelftools, msgpack and our readers raise (bit flips turn offsets,
# sizes, string tables and msgpack maps into anything). Caught only around reading a file's facts.
_READ_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, struct.error, UnicodeError,
    RecursionError, MemoryError, EOFError, AssertionError,
)


def _elf_errors() -> tuple[type[BaseException], ...]:
    from elftools.common.exceptions import ELFError
    from msgpack import UnpackException

    errs: list[type[BaseException]] = [ELFError, UnpackException]
    try:
        from elftools.construct.core import ConstructError  # pyelftools' vendored construct
        errs.append(ConstructError)
    except ImportError:  # pragma: no cover - layout of other pyelftools versions
        pass
    return tuple(errs) + _READ_ERRORS


def read_facts(fmt: str, data: bytes, symbol: str, where: str) -> tuple[_m.KernelMetadata, str]:
    """The kernel's metadata and the file's target ID as the code object itself states them.

    Every failure to read a damaged file is a :class:`CodeObjectError` naming ``where``; nothing a
    truncated or bit-flipped ELF makes the parsers raise escapes.
    """
    try:
        if fmt == "hsaco":
            from flyship.bundle.codeobject import CodeObjectFile

            co = CodeObjectFile(data, where)
            co.kernel(symbol)
            co.get_symbol(symbol + ".kd")
            meta = co.kernel_metadata(symbol)
            target = co.target
        elif fmt == "cubin":
            from flyship.bundle.cubin import CubinFile

            cubin = CubinFile(data, where)
            kernels = cubin.kernel_names()
            if symbol not in kernels:
                raise CodeObjectError(f"{where}: the cubin defines no kernel {symbol!r}; it has {kernels}")
            meta = cubin.kernel_metadata(symbol)
            target = cubin.target
        else:
            raise CodeObjectError(f"{where}: expected code object format 'hsaco' or 'cubin', got {fmt!r}")
        check_metadata(meta, f"{where} metadata")
        if target:
            target = _targets.parse_target(target).text
    except CodeObjectError as e:
        raise CodeObjectError(f"{where}: {e}; the code object is damaged or is not the one the manifest names, "
                              "rebuild the bundle") from None
    except BundleError as e:
        raise CodeObjectError(f"{where}: {e}; rebuild the bundle") from None
    except _elf_errors() as e:
        raise CodeObjectError(f"{where}: the code object is damaged ({type(e).__name__}: {str(e)[:200]}); rebuild "
                              "or re-copy the bundle") from None
    return meta, target


def _explicit(meta: _m.KernelMetadata) -> list[tuple[int, int, str]]:
    return [(a.offset, a.size, a.value_kind) for a in meta.args if not a.hidden]


def check_code_object(v: _m.Variant, data: bytes, where: str) -> None:
    """A code object's own facts against its variant: the kernel and (AMDGPU) its descriptor exist; the
    file's target is the variant's (for a cubin, the same SM: one built arch-specific, ``sm_90a``, may be
    recorded as ``sm_90``); kernarg segment, explicit arguments (AMDGPU: offset, size, kind; cubin: offset,
    size), static LDS, scratch and register counts (AMDGPU ``.vgpr_count`` / ``.agpr_count`` / ``.sgpr_count``;
    cubin: registers per thread) are the manifest's (``flyship inspect`` and the occupancy figures show the
    manifest's, so a tampered or mixed manifest must not pass); the layout tiles the *file's* arguments; the
    launch fits the file's required and maximum workgroup size and the target's LDS.

    Raises:
        CodeObjectError: the first disagreement, naming both values.
    """
    fmt = v.code_object.format
    meta, file_target = read_facts(fmt, data, v.code_object.symbol, where)
    man = v.metadata
    if fmt == "hsaco":
        if file_target and _targets.parse_target(file_target) != _targets.parse_target(v.target):
            raise CodeObjectError(f"{where}: the code object is built for {file_target}, the manifest says "
                                  f"{v.target}; rebuild the bundle")
        compared = ("kernarg_segment_size", "group_segment_fixed_size", "private_segment_fixed_size", "wavefront_size",
                    "vgpr_count", "agpr_count", "sgpr_count")
        if _explicit(meta) != _explicit(man):
            raise CodeObjectError(f"{where}: explicit kernel arguments (offset, size, kind) differ: code object "
                                  f"{_explicit(meta)}, manifest {_explicit(man)}; rebuild the bundle")
    else:
        if _targets.parse_target(file_target).sm != _targets.parse_target(v.target).sm:
            raise CodeObjectError(f"{where}: the cubin is built for {file_target}, the manifest says {v.target}; "
                                  "rebuild the bundle")
        compared = ("kernarg_segment_size", "group_segment_fixed_size", "private_segment_fixed_size", "vgpr_count")
        file_args = [(a.offset, a.size) for a in meta.args]
        man_args = [(a.offset, a.size) for a in man.args if not a.hidden]
        if file_args != man_args:
            raise CodeObjectError(f"{where}: kernel parameters (offset, size) differ: cubin {file_args}, manifest "
                                  f"{man_args}; rebuild the bundle")
    for name in compared:
        a, b = getattr(meta, name), getattr(man, name)
        if a != b:
            raise CodeObjectError(f"{where}: {name} is {a} in the code object, {b} in the manifest (the manifest was "
                                  "edited, or mixed with another build's code objects); rebuild the bundle")
    try:
        if fmt == "hsaco":
            check_layout(v.kernargs, meta, where)
        check_resources(meta, v.launch.block, v.target, where)
    except CodeObjectError:
        raise
    except BundleError as e:
        raise CodeObjectError(str(e)) from None
