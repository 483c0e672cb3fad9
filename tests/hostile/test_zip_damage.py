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
    (_bad_utf8_name, r"expected member flyship-pack\.json to read back intact, got UnicodeDecodeError"),
], ids=["encrypted-flag", "version-needed-0xff", "directory-offset-past-end", "invalid-utf8-name"])
def test_zip_level_damage_is_a_bundle_error_naming_the_file(tmp_path, damage, words):
    f = tmp_path / "bad.flyship"
    f.write_bytes(damage(_pack.pack_bytes(TINY)))
    with pytest.raises(BundleError, match=words) as e:
        _pack.open_pack(f, cache=tmp_path / "cache", trusted_keys=None)
    assert str(f) in str(e.value)
    assert not any((tmp_path / "cache").glob("*/*"))


def test_a_data_descriptor_flag_alone_is_still_read(tmp_path):
    """Bit 3 (sizes in a data descriptor) is allowed: some copying tools set it; the bytes are still checked."""
    f = tmp_path / "ok.flyship"
    blob = _pack.pack_bytes(TINY)
    f.write_bytes(_set(blob, _central(blob) + 8, "<H", 0x0008))
    folder = _pack.open_pack(f, cache=tmp_path / "cache", trusted_keys=None)
    assert (folder / "manifest.json").read_bytes() == (TINY / "manifest.json").read_bytes()
