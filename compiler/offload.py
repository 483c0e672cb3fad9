"""Clang offload bundles: every AMD target's code object in one file that ``hipModuleLoadData`` accepts.

``hipModuleLoadData`` takes a raw code object or an offload bundle, from which comgr picks the entry whose
target ID matches the device (ROCm/clr ``hip_fatbin.cpp``). flyship writes the *uncompressed* format
(clang ``OffloadBundler.cpp``, "binary" file handler, all integers little-endian 64-bit)::

    "__CLANG_OFFLOAD_BUNDLE__"                        24-byte magic
    number of entries
    per entry: offset, size, id length, id bytes       e.g. "hipv4-amdgcn-amd-amdhsa--gfx942"
    entry data at the offsets (4096-aligned with -bundle-align=4096)

Compressed bundles (magic ``CCOB``) load only from ROCm 6.2 with comgr >= 2.8, and newer clang drivers
compress by default (``--offload-compress``; the bundler itself also when ``OFFLOAD_BUNDLER_COMPRESS`` is
set), so flyship asks for no compression, clears that variable, and checks the magic it got.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from flyship.compiler.toolchain import Tool, Toolchain, ToolchainError, run_tool

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
BUNDLE_ALIGN = 4096
HOST_ENTRY = "host-x86_64-unknown-linux-gnu"
HIP_ENTRY_PREFIX = "hipv4-amdgcn-amd-amdhsa--"
_COMPRESS_ENV = ("OFFLOAD_BUNDLER_COMPRESS", "OFFLOAD_BUNDLER_VERBOSE")


def entry_id(target: str) -> str:
    """The bundle entry ID of an AMD target ID: ``gfx942`` -> ``hipv4-amdgcn-amd-amdhsa--gfx942``."""
    return HIP_ENTRY_PREFIX + target


def _entry_target(entry: str) -> str | None:
    """The target ID of a HIP entry (``hip[v4]-amdgcn-amd-amdhsa-<env>-<target id>``), or None for others."""
    parts = entry.split("-", 5)
    if len(parts) == 6 and parts[0] in ("hip", "hipv4") and parts[1] == "amdgcn":
        return parts[5]
    return None


def _supports_compress_flag(tool: Tool) -> bool:
    """Whether this clang-offload-bundler has ``-compress`` (LLVM 18+); older ones never compress."""
    try:
        r = run_tool(tool, ["--help"], operation="read clang-offload-bundler options")
    except ToolchainError:
        return False
    return "-compress" in r.stdout


def make_offload_bundle(code_objects: Mapping[str, bytes], toolchain: Toolchain, out_path: str | Path) -> Path:
    """Write an uncompressed clang offload bundle of AMD code objects.

    Runs ``clang-offload-bundler -type=o -bundle-align=4096 -targets=host-x86_64-unknown-linux-gnu,
    hipv4-amdgcn-amd-amdhsa--<target>...`` with an empty host entry, without compression.

    Args:
        code_objects: target ID (``gfx942``, ``gfx942:sramecc+:xnack-``) -> linked code object bytes.
        toolchain: the tools; needs ``clang-offload-bundler``.
        out_path: the bundle file to write.

    Returns:
        ``out_path`` as a Path.

    Raises:
        ToolchainError: no code objects, no bundler in the toolchain, the bundler failed (its stderr),
            or its output is not an uncompressed bundle holding exactly the inputs.
    """
    out = Path(out_path)
    if not code_objects:
        raise ToolchainError(f"make offload bundle {out}: expected at least one code object, got none")
    tool = toolchain.offload_bundler
    if tool is None:
        raise ToolchainError(
            f"make offload bundle {out}: expected clang-offload-bundler beside {toolchain.assembler.path}, got none "
            f"(toolchain from {toolchain.origin}); install clang (Debian `apt-get install clang-22`) or ROCm's "
            "LLVM and pass --llvm-bin, or build without --offload-bundle")
    targets = sorted(code_objects)
    with tempfile.TemporaryDirectory(prefix="flyship-offload-") as tmp:
        host = Path(tmp) / "host.o"
        host.write_bytes(b"")  # an empty host entry: the bundler then writes its plain binary format
        inputs = [host]
        for i, t in enumerate(targets):
            p = Path(tmp) / f"{i}.hsaco"
            p.write_bytes(code_objects[t])
            inputs.append(p)
        args = ["-type=o", f"-bundle-align={BUNDLE_ALIGN}",
                "-targets=" + ",".join([HOST_ENTRY] + [entry_id(t) for t in targets]),
                *[f"-input={p}" for p in inputs], f"-output={out}"]
        if _supports_compress_flag(tool):
            args.append("-compress=false")
        environ = {k: v for k, v in os.environ.items() if k not in _COMPRESS_ENV}
        try:
            run_tool(tool, args, operation=f"make offload bundle {out} for {', '.join(targets)}", environ=environ)
        except ToolchainError as e:
            raise ToolchainError(str(e)) from None
    got = read_offload_bundle(out.read_bytes(), str(out))
    for t in targets:
        if got.get(entry_id(t)) != code_objects[t]:
            raise ToolchainError(f"make offload bundle {out}: expected entry {entry_id(t)} to hold the "
                                     f"{len(code_objects[t])}-byte code object, got "
                                     f"{len(got.get(entry_id(t), b''))} bytes")
    return out


def _entries(data: bytes, where: str) -> list[tuple[str, int, int]]:
    """``(entry id, offset, size)`` of each entry of an uncompressed bundle (format in the module docstring)."""
    if data.startswith(COMPRESSED_MAGIC):
        raise ToolchainError(f"read offload bundle {where}: expected an uncompressed bundle "
                                 f"({BUNDLE_MAGIC.decode()}), got a compressed one (CCOB); older HIP runtimes "
                                 "refuse it: rebuild without compression")
    if not data.startswith(BUNDLE_MAGIC):
        raise ToolchainError(f"read offload bundle {where}: expected magic {BUNDLE_MAGIC.decode()}, "
                                 f"got {data[:24]!r}")
    out = []
    try:
        pos = len(BUNDLE_MAGIC)
        (count,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        for _ in range(count):
            offset, size, id_len = struct.unpack_from("<QQQ", data, pos)
            pos += 24
            raw = data[pos:pos + id_len]
            pos += id_len
            name = raw.decode()
            if len(raw) != id_len or offset + size > len(data):
                raise ToolchainError(f"read offload bundle {where}: entry {name!r} at {offset} size {size} "
                                         f"lies outside the {len(data)}-byte file")
            out.append((name, offset, size))
    except (struct.error, UnicodeDecodeError) as e:
        raise ToolchainError(f"read offload bundle {where}: expected a well-formed header, got {e}") from None
    return out


def read_offload_bundle(data: bytes, where: str = "<bundle>") -> dict[str, bytes]:
    """Parse an uncompressed clang offload bundle.

    Args:
        data: the file's bytes.
        where: a name for error messages.

    Returns:
        Entry ID -> bytes, for every entry (the host entry included, usually empty). IDs are as stored
        (the bundler stores the host entry as ``host-x86_64-unknown-linux-gnu-``).

    Raises:
        ToolchainError: a compressed bundle (``CCOB``), another magic, or entries outside the file.
    """
    return {name: data[offset:offset + size] for name, offset, size in _entries(data, where)}


def entry_offsets(data: bytes, where: str = "<bundle>") -> dict[str, int]:
    """Entry ID -> file offset of its data, to check the alignment.

    Raises:
        ToolchainError: as :func:`read_offload_bundle`.
    """
    return {name: offset for name, offset, _ in _entries(data, where)}


def unbundle(path: str | Path, targets: Sequence[str]) -> dict[str, bytes]:
    """The code objects of ``targets`` in an uncompressed offload bundle.

    Args:
        path: the bundle file.
        targets: AMD target IDs to take out (``gfx942``).

    Returns:
        Target ID -> code object bytes.

    Raises:
        ToolchainError: not an uncompressed bundle, or a target it lacks (the message lists what it has).
    """
    entries = read_offload_bundle(Path(path).read_bytes(), str(path))
    by_target = {t: v for k, v in entries.items() if (t := _entry_target(k)) is not None}
    missing = [t for t in targets if t not in by_target]
    if missing:
        raise ToolchainError(f"unbundle {path}: expected entries for {', '.join(missing)}, got "
                                 f"{', '.join(sorted(entries)) or 'none'}")
    return {t: by_target[t] for t in targets}


__all__ = ["make_offload_bundle", "read_offload_bundle", "unbundle", "entry_id",
           "entry_offsets", "BUNDLE_MAGIC", "COMPRESSED_MAGIC", "BUNDLE_ALIGN", "HOST_ENTRY"]
