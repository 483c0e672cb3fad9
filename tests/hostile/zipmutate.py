"""Zip-level mutation of a valid pack, shared by the reader fuzz (tests/hostile/fuzz_child.py, reader ``zip``).

The JSON mutator (tests/hostile/mutate.py) changes what is inside a pack's index; this one changes the zip around
it: the fields of the local file headers, the central directory entries and the end-of-central-directory record
(APPNOTE.TXT 4.3.7, 4.3.12, 4.3.16), the member names, and the archive's bytes at and around header boundaries.

A case is one to three edits of the base archive, each one of:

* ``field``: one header field set to a hostile value (0, all ones, +-1, a random value, one more flag bit, an odd
  "version needed", an offset or a size past the end...);
* ``name``: a member name replaced (invalid UTF-8 with the UTF-8 flag set, ``../x``, a slash, a NUL, another length);
* ``bytes``: a byte flipped inside a header, the archive cut at or near a header boundary, bytes inserted, a
  central directory entry given twice (counts adjusted), garbage or a second archive appended;
* ``local``: a local file header made to disagree with its central directory entry while the directory stays
  valid (zipfile reads the data by the directory and checks only the local name, so nothing else notices): its
  flags (an encryption or unknown bit, the data-descriptor bit alone), its "version needed", its method, its CRC or
  sizes, or its name (the same length, other bytes; flagged UTF-8 or not).

Every case is kind ``zip``: the reader must refuse it with a flyship error, or extract exactly the members.
"""

from __future__ import annotations

import random
import struct

# (name, offset, size) of the fields of each header kind, after the 4-byte signature is counted in.
LOCAL = [("version", 4, 2), ("flags", 6, 2), ("method", 8, 2), ("time", 10, 2), ("date", 12, 2), ("crc", 14, 4),
         ("csize", 18, 4), ("usize", 22, 4), ("nlen", 26, 2), ("xlen", 28, 2)]
CENTRAL = [("made", 4, 2), ("version", 6, 2), ("flags", 8, 2), ("method", 10, 2), ("time", 12, 2), ("date", 14, 2),
           ("crc", 16, 4), ("csize", 20, 4), ("usize", 24, 4), ("nlen", 28, 2), ("xlen", 30, 2), ("clen", 32, 2),
           ("disk", 34, 2), ("iattr", 36, 2), ("eattr", 38, 4), ("offset", 42, 4)]
END = [("disk", 4, 2), ("cddisk", 6, 2), ("ndisk", 8, 2), ("ntotal", 10, 2), ("cdsize", 12, 4), ("cdoffset", 16, 4),
       ("clen", 20, 2)]
_BAD_NAMES = [b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"../x", b"a/b", b"/etc/passwd", b"x\x00y", b"", b"manifest.json",
              b"flyship-pack.json", b"A" * 300, b"manifest.json ", b"\xe2\x80\xae.so"]


def headers(blob: bytes) -> list[tuple[str, int]]:
    """(kind, offset) of every header: ``local``, ``central``, ``end`` (the archive is a pack: no zip64)."""
    out, eocd = [], blob.rfind(b"PK\x05\x06")
    n, cd = struct.unpack_from("<H", blob, eocd + 10)[0], struct.unpack_from("<I", blob, eocd + 16)[0]
    pos = cd
    for _ in range(n):
        nlen, xlen, clen, off = struct.unpack_from("<HHH8xI", blob, pos + 28)
        out += [("central", pos), ("local", off)]
        pos += 46 + nlen + xlen + clen
    return out + [("end", eocd)]


def _field_value(rng: random.Random, name: str, size: int, old: int, blob_len: int) -> int:
    top = (1 << (8 * size)) - 1
    choices = [0, 1, top, top - 1, old + 1, old - 1, old ^ (1 << rng.randrange(8 * size)), rng.randrange(top + 1)]
    if name == "flags":
        choices += [old | 1, old | 0x40, old | 0x2000, old | 0x20, old | 0x0800, old | 0x0008, old & ~0x0800]
    elif name in ("version", "made"):
        choices += [0xFF, 0x3F, 63, 45, 46, 51, 10, 20, 0x0314, 0x0A3F]
    elif name == "method":
        choices += [8, 12, 14, 93, 99, 1]
    elif name in ("offset", "cdoffset", "csize", "usize", "cdsize"):
        choices += [blob_len, blob_len + 1, blob_len * 2, 0xFFFFFFFF, old + 4096]
    elif name in ("nlen", "xlen", "clen"):
        choices += [old + 4, 65535, 4, 8]
    return min(max(rng.choice(choices), 0), top)


def _field(blob: bytearray, rng: random.Random) -> None:
    kind, at = rng.choice(headers(bytes(blob)))
    name, off, size = rng.choice({"local": LOCAL, "central": CENTRAL, "end": END}[kind])
    fmt = "<H" if size == 2 else "<I"
    old = struct.unpack_from(fmt, blob, at + off)[0]
    struct.pack_into(fmt, blob, at + off, _field_value(rng, name, size, old, len(blob)))


def _name(blob: bytearray, rng: random.Random) -> bytearray:
    kind, at = rng.choice([h for h in headers(bytes(blob)) if h[0] != "end"])
    nlen_at, name_at, flags_at = (at + 26, at + 30, at + 6) if kind == "local" else (at + 28, at + 46, at + 8)
    nlen = struct.unpack_from("<H", blob, nlen_at)[0]
    new = rng.choice(_BAD_NAMES)
    if rng.random() < 0.5:  # the same length, so every offset stays right and only the name is wrong
        new = (new * (nlen // max(len(new), 1) + 1))[:nlen] if new else bytes(nlen)
    if rng.random() < 0.6:
        struct.pack_into("<H", blob, flags_at, struct.unpack_from("<H", blob, flags_at)[0] | 0x0800)
    struct.pack_into("<H", blob, nlen_at, len(new) if rng.random() < 0.8 else nlen)
    return blob[:name_at] + new + blob[name_at + nlen:]


def _bytes(blob: bytearray, rng: random.Random) -> bytearray:
    hs = headers(bytes(blob))
    kind, at = rng.choice(hs)
    r = rng.random()
    if r < 0.35:  # a flipped byte inside a header
        i = min(at + rng.randrange(46 if kind == "central" else 30 if kind == "local" else 22), len(blob) - 1)
        blob[i] ^= 1 << rng.randrange(8)
        return blob
    if r < 0.55:  # cut at or near a header boundary
        return blob[:max(0, at + rng.choice([-1, 0, 1, 4, 10, 21, 29, 45]))]
    if r < 0.7:  # bytes inserted at a header boundary: every later offset is now wrong
        return blob[:at] + bytes(rng.randrange(256) for _ in range(rng.choice([1, 4, 30]))) + blob[at:]
    if r < 0.85:  # a central directory entry given twice, the counts and size adjusted
        cds = [a for k, a in hs if k == "central"]
        eocd = hs[-1][1]
        i = rng.randrange(len(cds))
        end = cds[i + 1] if i + 1 < len(cds) else eocd
        entry = blob[cds[i]:end]
        out = blob[:end] + entry + blob[end:]
        e = eocd + len(entry)
        n, size = struct.unpack_from("<H", out, e + 10)[0], struct.unpack_from("<I", out, e + 12)[0]
        struct.pack_into("<HHI", out, e + 8, n + 1, n + 1, size + len(entry))
        return out
    tail = rng.choice([b"PK\x05\x06" + bytes(18), b"\x00" * 100, bytes(blob[:200]), b"PK\x01\x02" + bytes(42)])
    return blob + tail


_LOCAL_EDITS = {  # field -> values that disagree with a stored pack member's central entry
    "flags": [0x0001, 0x0041, 0x0008, 0x0020, 0x2000, 0x0002, 0x0004, 0x0800, 0x8000, 0x0010],
    "version": [0, 10, 45, 46, 51, 63, 0xFF, 0x0314],
    "method": [8, 12, 14, 93, 99, 1, 0xFFFF],
    "crc": [0, 1, 0xFFFFFFFF],
    "csize": [0, 1, 0xFFFFFFFF],
    "usize": [0, 1, 0xFFFFFFFF],
}


def _local(blob: bytearray, rng: random.Random) -> bytearray:
    at = rng.choice([a for k, a in headers(bytes(blob)) if k == "local"])
    field = rng.choice([*_LOCAL_EDITS, "name"])
    if field == "name":
        nlen = struct.unpack_from("<H", blob, at + 26)[0]
        new = bytes(rng.choice(b"abcXYZ._-\xff\xc3") for _ in range(nlen))
        if rng.random() < 0.5:
            struct.pack_into("<H", blob, at + 6, struct.unpack_from("<H", blob, at + 6)[0] ^ 0x0800)
        return blob[:at + 30] + new + blob[at + 30 + nlen:]
    _, off, size = next(f for f in LOCAL if f[0] == field)
    fmt = "<H" if size == 2 else "<I"
    old = struct.unpack_from(fmt, blob, at + off)[0]
    struct.pack_into(fmt, blob, at + off, rng.choice([v for v in _LOCAL_EDITS[field] if v != old] or [old ^ 1]))
    return blob


def case(base: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One case: ("zip", bytes)."""
    blob = bytearray(base)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        r = rng.random()
        try:
            if r < 0.45:
                _field(blob, rng)
            elif r < 0.6:
                blob = _local(blob, rng)
            elif r < 0.75:
                blob = _name(blob, rng)
            else:
                blob = _bytes(blob, rng)
        except (struct.error, IndexError, ValueError):
            pass  # an earlier edit moved the headers out of reach: the archive as it stands is the case
    return "zip", bytes(blob)
