"""Zip-level damage to a pack (issue 32): each kind the hostile trial found raw is a BundleError naming the file.

The fuzz (tests/hostile/zipmutate.py via test_reader_fuzz.py) tries thousands of such edits; these are the four
the trial reported, written out so each one's message is checked.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from flyship.bundle import pack as _pack
from flyship.errors import BundleError

pytestmark = pytest.mark.cpu

TINY = Path(__file__).resolve().parents[1] / "loader" / "data" / "tiny"


def _central(blob: bytes) -> int:
    return struct.unpack_from("<I", blob, blob.rfind(b"PK\x05\x06") + 16)[0]


def _set(blob: bytes, at: int, fmt: str, value: int) -> bytes:
    b = bytearray(blob)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def _encrypted(b: bytes) -> bytes:  # the first central entry's flag bit 0 (APPNOTE 4.4.4)
    return _set(b, _central(b) + 8, "<H", 0x0001)


def _version_ff(b: bytes) -> bytes:  # "version needed to extract" 25.5
    return _set(b, _central(b) + 6, "<H", 0x00FF)


def _offset_past_end(b: bytes) -> bytes:  # the end record's central directory offset past the file's end
    return _set(b, b.rfind(b"PK\x05\x06") + 16, "<I", len(b) + 4096)


def _bad_utf8_name(b: bytes) -> bytes:  # a local header name flagged UTF-8 that is not UTF-8 (same length)
    b = _set(b, 6, "<H", 0x0800)
    return b[:30] + b"\xff\xfe" + b[32:]


@pytest.mark.parametrize("damage, words", [
    (_encrypted, r"flags 0x0001"),
    (_version_ff, r"directory cannot be read .*NotImplementedError: zip file version 25\.5"),
    (_offset_past_end, r"ValueError: negative seek value"),
    (_bad_utf8_name, r"local header to agree with the central directory, got flags 0x0800 where the directory says "
                     r"0x0000 \(also name\)"),
], ids=["encrypted-flag", "version-needed-0xff", "directory-offset-past-end", "invalid-utf8-name"])
def test_zip_level_damage_is_a_bundle_error_naming_the_file(tmp_path, damage, words):
    f = tmp_path / "bad.flyship"
    f.write_bytes(damage(_pack.pack_bytes(TINY)))
    with pytest.raises(BundleError, match=words) as e:
        _pack.open_pack(f, cache=tmp_path / "cache", trusted_keys=None)
    assert str(f) in str(e.value)
    assert not any((tmp_path / "cache").glob("*/*"))


# A local file header (the first member's, at offset 0) that disagrees with its central directory entry, which stays
# valid: zipfile reads by the directory and checks only the local name, so each of these used to load; a reader that
# walks the local headers would see another archive than the one whose members were hashed and signed.
@pytest.mark.parametrize("at, fmt, value, words", [
    (6, "<H", 0x0001, r"flags 0x0001 where the directory says 0x0000"),  # encrypted, in the local header only
    (6, "<H", 0x8000, r"flags 0x8000 where"),  # a reserved bit
    (6, "<H", 0x0008, r"flags 0x0008 where"),  # the data-descriptor bit, locally only
    (4, "<H", 0x00FF, r"version needed 255 where the directory says 20"),
    (8, "<H", 8, r"method 8 where the directory says 0"),  # deflated, says the local header
    (14, "<I", 1, r"CRC 1 where"),
    (22, "<I", 0xFFFFFFFF, r"size 4294967295 where"),
    (30, "2s", b"FL", r"name b'FLyship-pack\.json' where the directory says b'flyship-pack\.json'"),
], ids=["encrypted-bit", "reserved-bit", "descriptor-bit", "version-needed", "method", "crc", "size", "name"])
def test_a_local_header_that_disagrees_with_the_directory_is_a_bundle_error(tmp_path, at, fmt, value, words):
    f = tmp_path / "bad.flyship"
    blob = bytearray(_pack.pack_bytes(TINY))
    struct.pack_into(fmt, blob, at, value)
    f.write_bytes(bytes(blob))
    with pytest.raises(BundleError, match=r"expected member 'flyship-pack\.json''s local header to agree with the "
                                          r"central directory, got " + words) as e:
        _pack.open_pack(f, cache=tmp_path / "cache", trusted_keys=None)
    assert str(f) in str(e.value)
    assert not any((tmp_path / "cache").glob("*/*"))


def test_a_data_descriptor_flag_alone_is_still_read(tmp_path):
    """Bit 3 (sizes in a data descriptor) is allowed, in both headers: some copying tools set it; the bytes are still
    checked (the local header's CRC and sizes are then not compared: they may be zeros)."""
    f = tmp_path / "ok.flyship"
    blob = _pack.pack_bytes(TINY)
    blob = _set(_set(blob, _central(blob) + 8, "<H", 0x0008), 6, "<H", 0x0008)
    blob = _set(blob, 14, "<I", 0)  # the local CRC, now in a descriptor
    f.write_bytes(blob)
    folder = _pack.open_pack(f, cache=tmp_path / "cache", trusted_keys=None)
    assert (folder / "manifest.json").read_bytes() == (TINY / "manifest.json").read_bytes()
