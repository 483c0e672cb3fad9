"""Trust for prebuilt extensions: a loader dlopens only a library it built itself or one ``flyship prebuild``
installed and recorded.

``flyship prebuild`` writes ``<name>.so.json`` beside the library: the module name (which encodes the C++
sources, the flavor, torch's version and commit, the Python ABI and the flags: ``extension.extension_name``) and the
library's sha256. A candidate found by the search (``FLYSHIP_EXTENSION_PATH``, the bundle's folder, the
environment) is imported only when the library, its record and their folder are owned by the user or root and
writable by no one else, and the library's bytes hash to the recorded sha256. Any other ``.so`` of the right name
(planted in ``/tmp`` beside a bundle, in a ``.`` entry of the path) is refused with the reason and never opened:
dlopen runs a library's constructors, so a check after opening would come too late. The import itself
(:func:`open_checked`, ``extension._import``) opens the library once, checks it through that descriptor (every
folder and link on its path trusted, as ssh's StrictModes; the record's sha256; a whole ELF shared library) and
imports through the same descriptor, so a path swapped after the check cannot change what runs. See
docs/security.md.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import sys
from pathlib import Path

from flyship.bundle import files, trust

RECORD_SUFFIX = ".json"
RECORD_FORMAT = "flyship-prebuilt"
_MAX_LIBRARY = 1 << 30  # a flyship extension is a few MB; a bigger file is not one
_MAX_RECORD = 1 << 16


def record_path(library: Path) -> Path:
    return library.with_name(library.name + RECORD_SUFFIX)


def record(library: Path, name: str) -> dict[str, object]:
    """The record ``flyship prebuild`` writes for ``library`` (the module ``name``)."""
    data = Path(library).read_bytes()
    return {"format": RECORD_FORMAT, "version": 1, "name": name, "sha256": trust.sha256(data)}


def write_record(library: Path, name: str) -> None:
    """Write ``library``'s record beside it (a temporary file, then a rename), as ``flyship prebuild`` and the build
    cache do."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{library.name}.", dir=library.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record(library, name), f, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, record_path(library))
    finally:
        Path(tmp).unlink(missing_ok=True)


def refusal(library: Path, name: str, group_ok: bool = False) -> str | None:
    """Why the prebuilt ``library`` (module ``name``) must not be imported, or None when it may be (``group_ok``:
    the build cache's own library, in a folder a team may share, as :func:`flyship.bundle.trust.untrusted_reason`
    says)."""
    why = trust.path_reason(library, group_ok=group_ok)  # every folder and link on the way (as ssh's StrictModes)
    if why is not None:
        return why
    if not os.path.lexists(record_path(library)):
        return f"no record {record_path(library).name} beside it (install it with `flyship prebuild -o DIR`)"
    try:
        blob = trust.read_trusted(record_path(library), _MAX_RECORD, what="prebuilt extension record",
                                  group_ok=group_ok)
        rec = files.parse_json(blob, what="its record")
        data = trust.read_trusted(library, _MAX_LIBRARY, what="prebuilt extension", group_ok=group_ok)
    except (OSError, ValueError) as e:  # BundleError is a ValueError
        return str(e)
    return _record_reason(rec, name, data)


def _record_reason(rec: object, name: str, data: bytes) -> str | None:
    """Why the library's bytes ``data`` do not match its parsed record ``rec`` (module ``name``), or None."""
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        return f"its record is not a {RECORD_FORMAT} record"
    if rec.get("name") != name:
        return f"its record names {rec.get('name')!r}, expected {name!r} (built for another torch or Python)"
    got = trust.sha256(data)
    if rec.get("sha256") != got:
        return f"its sha256 {got} differs from the recorded {rec.get('sha256')!r}"
    return None


# ELF (the System V gABI, "ELF Header" and "Program Header"): what a library must be before dlopen maps it. A file
# cut short maps pages past its end, and touching them is SIGBUS: so every segment must lie inside the file.
_ELF_MACHINES = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "s390x": 22}
_PT_LOAD = 1
_ET_DYN = 3
_MIN_ELF = 64  # the ELF64 header


def elf_reason(data: bytes) -> str | None:
    """Why ``data`` is not a shared library this machine can map whole (empty, not ELF, another class, byte order,
    type or machine, a segment or a header table past the end), or None."""
    if len(data) < _MIN_ELF:
        return f"it has {len(data)} bytes, too few for an ELF shared library (empty or cut short)"
    if data[:4] != b"\x7fELF":
        return f"it is not an ELF file (starts {data[:4]!r})"
    if data[4] != 2 or data[5] != (1 if sys.byteorder == "little" else 2):
        return "it is an ELF file of another class or byte order than this Python's (32-bit, or another machine)"
    e_type, e_machine = struct.unpack_from("<HH" if data[5] == 1 else ">HH", data, 16)
    want = _ELF_MACHINES.get(os.uname().machine)
    if e_type != _ET_DYN or (want is not None and e_machine != want):
        return f"it is not a shared library for {os.uname().machine} (ELF type {e_type}, machine {e_machine})"
    end = "<" if data[5] == 1 else ">"
    phoff, shoff = struct.unpack_from(end + "QQ", data, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", data, 54)
    size = len(data)
    if phentsize < 56 or phoff + phentsize * phnum > size or (shnum and shoff + shentsize * shnum > size):
        return f"its ELF header tables lie past its end ({size} bytes): the file is cut short"
    for k in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(end + "IIQQQQ", data, phoff + k * phentsize)
        if p_type == _PT_LOAD and p_offset + p_filesz > size:
            return (f"its segment {k} ends at byte {p_offset + p_filesz}, past the file's end ({size} bytes): the "
                    "file is cut short (mapping it would crash the process with SIGBUS)")
    return None


def open_checked(library: Path, name: str, group_ok: bool = False) -> tuple[int | None, str | None]:
    """Open ``library`` once and check it through that descriptor: every component of its path is trusted
    (:func:`flyship.bundle.trust.path_reason`), the file is a regular file, not a link, the user's or root's and
    writable by no one else, a whole ELF shared library (:func:`elf_reason`), and its bytes hash to its record's
    sha256. Returns ``(fd, None)`` (the caller imports through the descriptor, ``/proc/self/fd/N``, so the bytes
    imported are the bytes checked, whatever happens to the path meanwhile, and closes it), or ``(None, reason)``.
    """
    why = trust.path_reason(library, group_ok=group_ok)
    if why is not None:
        return None, why
    if not os.path.lexists(record_path(library)):
        return None, f"no record {record_path(library).name} beside it (install it with `flyship prebuild -o DIR`)"
    try:
        blob = trust.read_trusted(record_path(library), _MAX_RECORD, what="prebuilt extension record",
                                  group_ok=group_ok)
        rec = files.parse_json(blob, what="its record")
        fd = os.open(library, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except (OSError, ValueError) as e:  # BundleError is a ValueError; ELOOP: the library is a link
        return None, str(e) if not isinstance(e, OSError) else f"cannot open it ({e.strerror or e})"
    try:
        why = _check_open(fd, rec, name, group_ok)
    except OSError as e:
        why = f"cannot read it ({e.strerror or e})"
    if why is not None:
        os.close(fd)
        return None, why
    return fd, None


def _check_open(fd: int, rec: object, name: str, group_ok: bool) -> str | None:
    """Why the library open at ``fd`` (with its parsed record ``rec``) must not be imported, or None."""
    st = os.fstat(fd)
    writable = stat.S_IWOTH if group_ok else stat.S_IWGRP | stat.S_IWOTH
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.getuid(), 0) or st.st_mode & writable:
        return "it is not a regular file of yours or root's, writable only by its owner"
    if st.st_size > _MAX_LIBRARY:
        return f"it has {st.st_size} bytes, over the limit of {_MAX_LIBRARY}"
    data = files.read_fd(fd, _MAX_LIBRARY, st.st_size)
    return _record_reason(rec, name, data) or elf_reason(data)


def refusal_of_path(library: Path, group_ok: bool = False) -> str | None:
    """Why the path to ``library`` is not trusted (:func:`flyship.bundle.trust.path_reason`), or None."""
    return trust.path_reason(library, group_ok=group_ok)
