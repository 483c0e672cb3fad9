"""One-file bundles: pack a bundle directory into one reproducible zip file, and open one safely.

The format (``docs/bundle-format.md``, "Packed bundles"):

* a zip archive, every member *stored* (no compression: the bytes do not depend on a zlib version), with a
  fixed timestamp (1980-01-01 00:00:00), Unix mode 0644, no extra fields, no comment;
* first member ``flyship-pack.json``: ``{"format": "flyship-pack", "version": 1, "members": {name: sha256}}``
  (sorted keys), the sha256 of every other member; then the members in name order;
* the members are exactly the bundle's ``manifest.json``, its references module, its code objects and its
  offload bundles, each a plain file name (no folders).

So the same bundle gives the same bytes. Opening a pack extracts it into a private, content-addressed cache
folder (``<cache>/<sha256 of the pack>``), never elsewhere: member names are checked to be plain file names,
every member's sha256 is checked against the index (and the index must list exactly the members), and the
folder appears by an atomic rename, so a reader never sees half of it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Iterable

from flyship.bundle import manifest as _m
from flyship.bundle import files as _files
from flyship.bundle.files import atomic_write
from flyship.bundle import rules as _rules
from flyship.bundle import signing as _signing
from flyship.bundle import trust as _trust
from flyship.bundle.errors import BundleError
from flyship.errors import ConfigError

INDEX_NAME = "flyship-pack.json"
PACK_FORMAT = "flyship-pack"
PACK_VERSION = 1  # an unsigned pack: the index, then the members
SIGNED_PACK_VERSION = 2  # a signed pack: the index, the signature (flyship-pack.sig), then the members
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time zip can hold
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_+\-][A-Za-z0-9._+\-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ZIP_LOCAL_HEADER = b"PK\x03\x04"  # every pack starts with its index member's local header
_MAX_MEMBER = 1 << 31  # no bundle file comes near 2 GiB; bounds every read of the cache and a pack's total
_MAX_INDEX = 1 << 24  # the index and the signature: a line per member
_MAX_MEMBERS = 100_000
_MAX_PACK = _MAX_MEMBER + 4 * _MAX_INDEX  # the members, the index and signature, the zip headers and directory
_REDO = "rebuild or re-copy it with `flyc-build ... --pack` or `flyship pack BUNDLE -o FILE`"
# What zipfile can raise on a damaged archive, opening it or reading a member: a bad header or CRC (BadZipFile),
# data cut short (EOFError), a compressed member from another writer (zlib.error), a method or "version needed"
# it lacks (NotImplementedError), an encrypted member (RuntimeError), offsets past the end (ValueError: negative
# seek), a name flagged UTF-8 that is not (UnicodeDecodeError, a ValueError), a field out of struct's range
# (struct.error), a seek past what the OS allows (OSError, OverflowError). Every one is damage, never a bug.
_DAMAGE = (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError, RuntimeError, ValueError, struct.error,
           OSError, OverflowError, IndexError, KeyError)
# General-purpose flag bits a pack may carry (APPNOTE 4.4.4): bit 3 (sizes in a data descriptor, which some
# copying tools add) and bit 11 (names in UTF-8). Every other bit (encryption, strong encryption, a masked
# header, patch data, compression options) means a writer other than `flyship pack` and is refused up front.
_FLAGS_OK = 0x0008 | 0x0800
# "Version needed to extract" (APPNOTE 4.4.3) values zipfile itself writes for a stored member: 1.0, 2.0, and 4.5
# when a member needs zip64; anything else is another writer's feature (or damage).
_VERSIONS_OK = frozenset({10, 20, 45})


def members(root: Path, manifest: _m.Manifest) -> list[str]:
    """The files of a bundle that a pack holds: the manifest, references, code objects, offload bundles.

    Raises:
        BundleError: a named file is missing or is not a plain file name.
    """
    names = {_m.MANIFEST_NAME}
    if manifest.references:
        names.add(manifest.references)
    names |= {t.code_object.file for op in manifest.ops for s in op.specializations for v in s.variants
              for t in v.launches}
    names |= set(manifest.offload_bundles.values())
    for n in sorted(names):
        if not _SAFE_NAME.match(n):
            raise BundleError(f"pack bundle {root}: expected plain file names in the manifest, got {n!r}; a packed "
                              "bundle holds no folders")
        if not (root / n).is_file():
            raise BundleError(f"pack bundle {root}: expected the file {n} the manifest names, found none; rebuild "
                              "the bundle")
    return sorted(names)


def _info(name: str) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name, date_time=_EPOCH)
    zi.compress_type = zipfile.ZIP_STORED
    zi.create_system = 3  # Unix, so the mode below means what it says
    zi.external_attr = 0o100644 << 16
    return zi


def pack_bytes(root: Path | str, sign_key: Path | str | None = None) -> bytes:
    """The packed bytes of the bundle directory ``root`` (see the module docstring); signed with the Ed25519
    private key file ``sign_key`` when given (:mod:`flyship.bundle.signing`: index version 2, the signature the
    second member).

    Raises:
        BundleError: the manifest is invalid, names a missing file, or a file differs from its sha256.
    """
    root = Path(root)
    manifest = _m.read(root)
    # Pack only what the manifest vouches for: every code object and offload bundle against its sha256 and its
    # variant, the references module against references_sha256 (the pack's own index then records good bytes).
    _rules.check_bundle(root, manifest)
    names = members(root, manifest)
    data = {n: (root / n).read_bytes() for n in names}
    index = {"format": PACK_FORMAT, "version": PACK_VERSION if sign_key is None else SIGNED_PACK_VERSION,
             "members": {n: hashlib.sha256(b).hexdigest() for n, b in data.items()}}
    index_bytes = (json.dumps(index, sort_keys=True, indent=1) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(_info(INDEX_NAME), index_bytes)
        if sign_key is not None:
            z.writestr(_info(_signing.SIG_NAME), _signing.sign(index_bytes, sign_key))
        for n in names:
            z.writestr(_info(n), data[n])
    return buf.getvalue()


def pack(root: Path | str, out: Path | str, sign_key: Path | str | None = None) -> Path:
    """Write the pack of bundle ``root`` to ``out`` (atomically: a temporary sibling, then a rename), signed with
    ``sign_key`` when given.

    Returns:
        ``out`` as a Path.
    """
    return atomic_write(out, pack_bytes(root, sign_key))


def is_pack(path: Path | str) -> bool:
    """Whether ``path`` is a file that looks like a pack (a zip archive)."""
    p = Path(path)
    return p.is_file() and zipfile.is_zipfile(p)


def signer(path: Path | str) -> str | None:
    """The public key (64 hex digits) a pack's signature member names, NOT verified (:func:`open_pack` with that key
    trusted verifies it); None for an unsigned pack. For tools that must tell an unsigned pack from one signed by
    another key before they verify (``flyship check``).

    Raises:
        BundleError: not a readable zip archive, or a signature member that is not a signature record.
    """
    p = Path(path)
    blob = _files.read_regular(p, _MAX_PACK, what="read pack signature", expected="a packed bundle file")
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            names = z.namelist()
            if len(names) < 2 or names[1] != _signing.SIG_NAME:
                return None
            _check_sizes(z, str(p))
            raw = _read_member(z, _signing.SIG_NAME, str(p))
    except (zipfile.BadZipFile, EOFError, ValueError) as e:
        raise _not_a_zip(blob, str(p), str(e)) from None
    sig = _files.parse_json(raw, what=f"read pack signature {p}: {_signing.SIG_NAME}", hint="the file is damaged")
    key = sig.get("public_key") if isinstance(sig, dict) else None
    if not isinstance(key, str) or not _SHA256.match(key):  # 64 lowercase hex digits, as a sha256
        raise BundleError(f"read pack signature {p}: expected a public key of 64 hex digits in {_signing.SIG_NAME}, "
                          f"got {str(key)[:80]!r}; the file is damaged or was altered")
    return key


def _read_index(z: zipfile.ZipFile, where: str, trusted: frozenset[str] | None = None) -> dict[str, str]:
    """The index's member table, after the signature over the index is checked when ``trusted`` keys require one."""
    names = z.namelist()
    if not names or names[0] != INDEX_NAME:
        raise BundleError(f"open packed bundle {where}: expected {INDEX_NAME} as the first member, got "
                          f"{names[0] if names else 'an empty archive'}; pack the bundle with `flyship pack`")
    _check_sizes(z, where)
    raw_index = _read_member(z, INDEX_NAME, where)
    signed = len(names) > 1 and names[1] == _signing.SIG_NAME
    if trusted is not None:  # before anything else of the index is believed
        _signing.verify(raw_index, _read_member(z, _signing.SIG_NAME, where) if signed else None, trusted, where)
    index = _files.parse_json(raw_index, what=f"open packed bundle {where}: {INDEX_NAME}",
                              hint=f"the file is damaged, {_REDO}")
    version = SIGNED_PACK_VERSION if signed else PACK_VERSION
    if (not isinstance(index, dict) or index.get("format") != PACK_FORMAT or type(index.get("version")) is not int
            or index["version"] != version):  # (type: true == 1 and 1.0 == 1 in Python, not in the format)
        got = {k: index.get(k) for k in ("format", "version")} if isinstance(index, dict) else index
        raise BundleError(f"open packed bundle {where}: expected a {PACK_FORMAT} index of version {version} "
                          f"({'signed' if signed else 'unsigned'}), got {got!r}; repack it with this flyship's "
                          "`flyship pack`")
    listed = index.get("members")
    if not isinstance(listed, dict):
        raise BundleError(f"open packed bundle {where}: {INDEX_NAME} has no members table; the file is damaged")
    extra = sorted(set(index) - {"format", "version", "members"})
    if extra:
        raise BundleError(f"open packed bundle {where}: expected only the keys format, version, members in "
                          f"{INDEX_NAME}, got also {', '.join(repr(k[:40]) for k in extra[:5])}; the file is damaged "
                          "or was altered")
    for n, sha in listed.items():
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise BundleError(f"open packed bundle {where}: {INDEX_NAME} members[{n[:60]!r}]: expected a sha256 "
                              f"(64 lowercase hex digits), got {str(sha)[:80]!r}; the file is damaged or was altered")
    rest = names[2:] if signed else names[1:]
    if len(set(rest)) != len(rest) or sorted(rest) != sorted(listed):
        raise BundleError(f"open packed bundle {where}: expected the members the index lists "
                          f"({', '.join(sorted(listed))}), got {', '.join(rest)}; the file is damaged or was altered")
    for n in rest:
        if not _SAFE_NAME.match(n):
            raise BundleError(f"open packed bundle {where}: member {n!r} is not a plain file name; refusing to "
                              "extract it")
    if _m.MANIFEST_NAME not in listed:
        raise BundleError(f"open packed bundle {where}: expected a {_m.MANIFEST_NAME} member, found none")
    return listed


def _check_sizes(z: zipfile.ZipFile, where: str) -> None:
    """Refuse, from the archive's directory alone and before any member is read, what no flyship pack holds: a
    compressed member (a deflated gigabyte fits in a megabyte: a pack is all stored, so a member's size is its
    size in the file), a member or a total over the limits, too many members, an oversized index."""
    infos = z.infolist()
    if len(infos) > _MAX_MEMBERS:
        raise BundleError(f"open packed bundle {where}: expected at most {_MAX_MEMBERS} members, got {len(infos)}; "
                          "refusing to extract it")
    total = 0
    for zi in infos:
        if zi.flag_bits & ~_FLAGS_OK or zi.extract_version not in _VERSIONS_OK:
            raise BundleError(f"open packed bundle {where}: expected plain zip members (flag bits within "
                              f"0x{_FLAGS_OK:04x}, version needed 1.0, 2.0 or 4.5), got {zi.filename[:80]!r} with "
                              f"flags 0x{zi.flag_bits:04x} and version needed {zi.extract_version / 10:.1f} "
                              f"(encrypted, or written by another tool); refusing to extract it, {_REDO}")
        _check_local_header(z, zi, where)
        if zi.compress_type != zipfile.ZIP_STORED or zi.compress_size != zi.file_size:
            raise BundleError(f"open packed bundle {where}: expected every member stored (uncompressed), got "
                              f"{zi.filename!r} compressed ({zi.compress_size} bytes for {zi.file_size}); refusing to "
                              f"extract it, {_REDO}")
        limit = _MAX_INDEX if zi.filename in (INDEX_NAME, _signing.SIG_NAME) else _MAX_MEMBER
        if zi.file_size > limit:
            raise BundleError(f"open packed bundle {where}: member {zi.filename!r} has {zi.file_size} bytes, over the "
                              f"limit of {limit}; refusing to extract it")
        total += zi.file_size
    if total > _MAX_MEMBER:
        raise BundleError(f"open packed bundle {where}: members total {total} bytes, over the limit of {_MAX_MEMBER}; "
                          "refusing to extract it")


_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # a local file header (APPNOTE 4.3.7), 30 bytes, then the name


def _check_local_header(z: zipfile.ZipFile, zi: zipfile.ZipInfo, where: str) -> None:
    """Refuse a member whose local file header disagrees with its central directory entry (zipfile reads the data by
    the directory and checks only the local name): flags, "version needed", method, and, without a data descriptor,
    CRC and sizes; the name byte for byte. A reader that walks the local headers (``unzip``, a streaming reader)
    would otherwise see another archive than the one whose members were hashed and signed. The directory's own
    flags and version are checked by the caller, so equal local ones carry no unknown or encryption bit either."""
    try:
        z.fp.seek(zi.header_offset)
        raw = z.fp.read(_LOCAL.size)
        sig, version, flags, method, _t, _d, crc, csize, usize, nlen, _xlen = _LOCAL.unpack(raw)
        name = z.fp.read(nlen)
    except (struct.error, OSError, ValueError, OverflowError) as e:
        raise BundleError(f"open packed bundle {where}: expected a local file header for member {zi.filename[:80]!r} "
                          f"at offset {zi.header_offset}, got {type(e).__name__}: {e}; the file is damaged, "
                          f"{_REDO}") from None
    central_name = zi.orig_filename.encode("utf-8" if zi.flag_bits & 0x0800 else "cp437", "surrogateescape")
    got = {"signature": sig, "flags": flags, "version needed": version, "method": method, "name": name}
    expected = {"signature": zipfile.stringFileHeader, "flags": zi.flag_bits, "version needed": zi.extract_version,
                "method": zi.compress_type, "name": central_name}
    if not flags & 0x0008:  # sizes and CRC in the header, not in a data descriptor after the data
        got.update({"CRC": crc, "compressed size": csize, "size": usize})
        expected.update({"CRC": zi.CRC, "compressed size": zi.compress_size, "size": zi.file_size})
    wrong = [k for k in expected if got[k] != expected[k]]
    if wrong:
        k, also = wrong[0], f" (also {', '.join(wrong[1:])})" if wrong[1:] else ""
        show = (lambda v: f"0x{v:04x}") if k == "flags" else (lambda v: repr(v[:80]) if isinstance(v, bytes) else v)
        raise BundleError(f"open packed bundle {where}: expected member {zi.filename[:80]!r}'s local header to agree "
                          f"with the central directory, got {k} {show(got[k])} where the directory says "
                          f"{show(expected[k])}{also}; the file "
                          f"is damaged or was altered, {_REDO}")


def _read_member(z: zipfile.ZipFile, name: str, where: str) -> bytes:
    """The bytes of member ``name``; a damaged member (bad header, bad CRC, cut short) is a BundleError."""
    try:
        return z.read(name)
    except _DAMAGE as e:
        raise BundleError(f"open packed bundle {where}: expected member {name} to read back intact, got "
                          f"{type(e).__name__}: {e}; the file is damaged, {_REDO}") from e


def _not_a_zip(blob: bytes, where: str, why: str) -> BundleError:
    """The error for a file that zipfile cannot open as an archive, saying which kind of damage it looks like."""
    if not blob:
        what = "an empty file (0 bytes): the copy or the write never finished"
    elif blob.startswith(_ZIP_LOCAL_HEADER) and why.startswith("BadZipFile"):
        what = (f"a zip archive without its directory ({len(blob)} bytes; {why}): the file is truncated or "
                "damaged")
    elif blob.startswith(_ZIP_LOCAL_HEADER):
        what = (f"a zip archive whose directory cannot be read ({len(blob)} bytes; {why}): the file is damaged or "
                "was written by another tool")
    else:
        what = f"a file that is not a zip archive ({len(blob)} bytes, starting {blob[:8]!r})"
    return BundleError(f"load bundle {where}: expected a bundle directory (holding {_m.MANIFEST_NAME}), its "
                       f"{_m.MANIFEST_NAME} or a zip archive `flyship pack` wrote, got {what}; pass the folder "
                       f"flyc-build wrote, or if this is a packed bundle, {_REDO}")


def cache_root() -> Path:
    """Where opened packs are extracted: ``$FLYSHIP_BUNDLE_CACHE`` (default ``~/.cache/flyship/bundles``)."""
    from flyship import env

    return env.bundle_cache_dir()


def open_pack(path: Path | str, cache: Path | str | None = None,
              trusted_keys: Iterable[str | os.PathLike] | None = None) -> Path:
    """Extract a packed bundle into its content-addressed cache folder (or reuse it) and return the folder.

    Every member's sha256 is checked against the index on each open, including a reused folder's files. When
    ``trusted_keys`` (or ``FLYSHIP_TRUSTED_KEYS``) name keys, the index must carry a valid signature by one of them
    (:mod:`flyship.bundle.signing`), checked on each open before anything is extracted or reused.

    Raises:
        BundleError: not a pack (or unreadable), a damaged or altered member, an unsafe member name.
        ConfigError: the cache folder cannot be created or written (set ``FLYSHIP_BUNDLE_CACHE``).
    """
    p = Path(path).resolve()
    where = str(p)
    blob = _files.read_regular(p, _MAX_PACK, what="open packed bundle", expected="a packed bundle file",
                               hint="check the path and its permissions, or pass the bundle directory")
    digest = hashlib.sha256(blob).hexdigest()
    trusted = _signing.policy(trusted_keys)
    try:
        z = zipfile.ZipFile(io.BytesIO(blob))
    except _DAMAGE as e:  # the directory cannot be read: damage of any kind (see _DAMAGE)
        raise _not_a_zip(blob, where, f"{type(e).__name__}: {e}") from None
    with z:
        listed = _read_index(z, where, trusted)
        root = Path(cache) if cache is not None else cache_root()
        final = root / digest
        if os.path.lexists(final):
            why = _trust.untrusted_reason(final, kind="folder")
            if why is not None:  # a link to someone else's folder, or an entry another user made: never read it
                raise BundleError(f"open packed bundle {where}: refused the cache entry {final}: {why}; delete it, "
                                  "or set FLYSHIP_BUNDLE_CACHE to a folder only you can write")
            if _matches(final, listed):
                return final
        try:
            return _extract(z, listed, root, final, where)
        except OSError as e:  # the cache, not the pack: an unwritable HOME, a file in the way, a full disk
            raise ConfigError(
                f"open packed bundle {where}: expected a writable folder to extract it into at {root}, got "
                f"{type(e).__name__}: {e.strerror or e}{f' ({e.filename})' if e.filename else ''}; set "
                "FLYSHIP_BUNDLE_CACHE to a writable folder (or load the bundle directory instead of the pack)"
            ) from e


def _extract(z: zipfile.ZipFile, listed: dict[str, str], root: Path, final: Path, where: str) -> Path:
    """Check and extract the members of an opened pack into ``final`` under ``root``, by an atomic rename."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name[:16]}.", dir=root))  # mode 0700
    try:
        for n, want in listed.items():
            data = _read_member(z, n, where)
            got = hashlib.sha256(data).hexdigest()
            if got != want:
                raise BundleError(f"open packed bundle {where}: member {n} has sha256 {got}, the index says "
                                  f"{want}; the file is damaged or was altered, {_REDO}")
            (tmp / n).write_bytes(data)
        (tmp / INDEX_NAME).write_text(json.dumps(listed, sort_keys=True))
        _publish(tmp, final, listed)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _publish(tmp: Path, final: Path, listed: dict[str, str]) -> None:
    """Rename the checked folder ``tmp`` into place as ``final``. A stale or damaged ``final`` is first renamed
    aside (never deleted in place: another process may have just renamed a good copy there and be reading it);
    when another process wins the race with the same bytes, its folder is kept."""
    for _ in range(3):
        try:
            os.rename(tmp, final)
            return
        except OSError:
            if os.path.isdir(final) and not os.path.islink(final) and _matches(final, listed):
                return  # another process published the same bytes
            if not os.path.lexists(final):
                continue  # removed meanwhile: try again
            why = _trust.untrusted_reason(final, kind="folder")
            if why is not None:
                raise BundleError(f"open packed bundle: refused the cache entry {final}: {why}; delete it, or set "
                                  "FLYSHIP_BUNDLE_CACHE to a folder only you can write") from None
            aside = Path(tempfile.mkdtemp(prefix=f".stale-{final.name[:16]}.", dir=final.parent))
            try:
                os.rename(final, aside / "old")
            except OSError:
                pass  # another process moved it first
            shutil.rmtree(aside, ignore_errors=True)
    raise BundleError(f"open packed bundle: cannot put the checked folder in place at {final}: something keeps "
                      "replacing it; set FLYSHIP_BUNDLE_CACHE to a folder only you can write")


def _matches(folder: Path, listed: dict[str, str]) -> bool:
    """Whether an extracted folder holds exactly the listed files with their sha256, each a regular file (not a
    link) owned by the user or root and writable by no one else, so the bytes read after this check are these."""
    for n, want in listed.items():
        try:
            data = _trust.read_trusted(folder / n, _MAX_MEMBER, what="bundle cache entry")
        except (OSError, ValueError):
            return False
        if hashlib.sha256(data).hexdigest() != want:
            return False
    return True


def bundle_dir(path: str | Path, trusted_keys: Iterable[str | os.PathLike] | None = None, *,
               folder_ok: bool = False) -> Path:
    """The bundle directory ``path`` names: the directory itself, the one holding a ``manifest.json`` given
    by its file name, or a packed bundle's private cache folder (:func:`flyship.bundle.pack.open_pack`, every
    member's sha256 checked); absolute, so a later chdir cannot make the same bundle look like another.

    ``folder_ok``: a folder is accepted under a signature policy (``flyship pack`` reads a folder to write it, it
    loads nothing; a pack it reads is still checked against the policy).

    Raises:
        BundleError: the path is another file, a device, a symlink loop, or does not exist; says what it found
            and what to pass.
    """
    try:
        p = Path(path).resolve()
    except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13, OSError (ELOOP) since
        p = Path(os.path.abspath(path))
    if p.is_file() and p.name != _m.MANIFEST_NAME:  # any other file is meant as a pack; open_pack says what is
        return open_pack(p, trusted_keys=trusted_keys)  # wrong with one that is not
    if not folder_ok and _signing.policy(trusted_keys) is not None:  # a folder carries no signature
        raise BundleError(f"load bundle {p}: expected a pack signed by a trusted key (trusted_keys / "
                          "FLYSHIP_TRUSTED_KEYS are set), got a bundle folder, which carries no signature; load the "
                          "signed .flyship file")
    if p.is_file():
        return p.parent
    if not p.is_dir():
        raise BundleError(f"load bundle: expected a bundle directory (holding {_m.MANIFEST_NAME}), its "
                          f"{_m.MANIFEST_NAME} or a packed bundle at {p}, found {_files.found_at(p)}; pass the "
                          "folder flyc-build wrote or a file `flyship pack` wrote")
    return p
