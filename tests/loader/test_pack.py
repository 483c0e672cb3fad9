"""One-file shipping: ``flyship pack`` writes a reproducible file; ``flyship.load(FILE)`` opens it safely."""

from __future__ import annotations

import hashlib
import io
import stat
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flyship.bundle import manifest as _m
from flyship.bundle import pack as _pack
from flyship.bundle.errors import BundleError

pytestmark = pytest.mark.cpu


def test_packing_the_same_bundle_twice_gives_the_same_bytes(tiny_bundle, bundle_copy, tmp_path):
    a = _pack.pack(tiny_bundle, tmp_path / "a.flyship").read_bytes()
    b = _pack.pack(bundle_copy(), tmp_path / "b.flyship").read_bytes()  # another folder, other mtimes
    assert a == b


def test_a_pack_holds_an_index_then_the_manifest_references_and_code_objects_in_order(tiny_bundle, tmp_path):
    z = zipfile.ZipFile(_pack.pack(tiny_bundle, tmp_path / "t.flyship"))
    names = z.namelist()
    m = _m.read(tiny_bundle)
    files = {v.code_object.file for op in m.ops for s in op.specializations for v in s.variants}
    assert names[0] == "flyship-pack.json" and names[1:] == sorted(files | {"manifest.json", "references.py"})
    assert all(i.date_time == (1980, 1, 1, 0, 0, 0) and i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    index = __import__("json").loads(z.read("flyship-pack.json"))
    assert index["members"]["manifest.json"] == hashlib.sha256((tiny_bundle / "manifest.json").read_bytes()).hexdigest()


def test_opening_a_pack_extracts_into_a_content_addressed_cache_folder_only(tiny_bundle, tmp_path):
    f = _pack.pack(tiny_bundle, tmp_path / "t.flyship")
    cache = tmp_path / "cache"
    d = _pack.open_pack(f, cache)
    assert d == cache / hashlib.sha256(f.read_bytes()).hexdigest()
    assert (d / "manifest.json").read_bytes() == (tiny_bundle / "manifest.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "t.flyship"]
    assert _pack.open_pack(f, cache) == d  # reused


def test_an_altered_cached_file_is_replaced_on_the_next_open(tiny_bundle, tmp_path):
    f = _pack.pack(tiny_bundle, tmp_path / "t.flyship")
    d = _pack.open_pack(f, tmp_path / "cache")
    (d / "references.py").write_text("import os\n")
    assert _pack.open_pack(f, tmp_path / "cache") == d
    assert (d / "references.py").read_bytes() == (tiny_bundle / "references.py").read_bytes()


def _rewrite(src: Path, dst: Path, change) -> Path:
    """Copy a pack member by member, letting ``change(name, data)`` return new bytes (or None to drop it)."""
    zin = zipfile.ZipFile(src)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info, data)
    dst.write_bytes(buf.getvalue())
    return dst


@pytest.mark.parametrize("change, message", [
    (lambda n, d: d.replace(b"x + y", b"x - y") if n == "references.py" else d,
     "member references.py has sha256 .* the index says"),
    (lambda n, d: None if n == "references.py" else d, "expected the members the index lists"),
    (lambda n, d: None if n == "flyship-pack.json" else d, "expected flyship-pack.json as the first member"),
])
def test_a_damaged_or_altered_pack_is_refused_before_anything_is_extracted(tiny_bundle, tmp_path, change, message):
    f = _rewrite(_pack.pack(tiny_bundle, tmp_path / "t.flyship"), tmp_path / "bad.flyship", change)
    with pytest.raises(BundleError, match=message):
        _pack.open_pack(f, tmp_path / "cache")
    assert not any((tmp_path / "cache").glob("*/*"))


def test_a_member_name_with_a_folder_is_refused(tiny_bundle, tmp_path):
    import json

    src = _pack.pack(tiny_bundle, tmp_path / "t.flyship")

    def change(n, d):
        if n == "flyship-pack.json":
            idx = json.loads(d)
            idx["members"]["../evil"] = hashlib.sha256(b"x").hexdigest()
            return json.dumps(idx).encode()
        return d

    f = _rewrite(src, tmp_path / "bad.flyship", change)
    with zipfile.ZipFile(f, "a") as z:
        z.writestr("../evil", b"x")
    with pytest.raises(BundleError, match="member '../evil' is not a plain file name"):
        _pack.open_pack(f, tmp_path / "cache")
    assert not (tmp_path / "evil").exists()


def test_flyship_load_opens_a_packed_file(tiny_bundle, tmp_path, ext, monkeypatch):
    import uuid

    import flyship

    monkeypatch.setenv("FLYSHIP_BUNDLE_CACHE", str(tmp_path / "cache"))
    f = _pack.pack(tiny_bundle, tmp_path / "t.flyship")
    ops = flyship.load(f, namespace=f"flyship_p{uuid.uuid4().hex[:8]}")
    assert ops.names == ("add", "scale_rows", "addsub")
    assert ops.path.parent == tmp_path / "cache"
    assert ops.reference("add") is not None


@pytest.mark.parametrize("cache", ["a_file", "a_file/below"])
def test_a_cache_folder_that_cannot_be_made_is_a_config_error_saying_to_set_flyship_bundle_cache(tiny_bundle, tmp_path,
                                                                                                  cache):
    from flyship.errors import ConfigError

    (tmp_path / "a_file").write_text("in the way")
    f = _pack.pack(tiny_bundle, tmp_path / "t.flyship")
    with pytest.raises(ConfigError, match=r"open packed bundle .*t\.flyship: expected a writable folder to extract "
                                          r"it into at .*a_file.*, got (FileExistsError|NotADirectoryError).*; set "
                                          r"FLYSHIP_BUNDLE_CACHE to a writable folder"):
        _pack.open_pack(f, tmp_path / cache)


def test_flyship_list_of_a_pack_whose_cache_cannot_be_made_prints_the_message_not_a_traceback(tiny_bundle, tmp_path):
    (tmp_path / "a_file").write_text("in the way")
    f = _pack.pack(tiny_bundle, tmp_path / "t.flyship")
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "list", str(f)], capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "FLYSHIP_BUNDLE_CACHE": str(tmp_path / "a_file")})
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "FLYSHIP_BUNDLE_CACHE: expected a folder" in r.stderr and "point FLYSHIP_BUNDLE_CACHE at a folder" in r.stderr


def test_an_unreadable_pack_is_a_bundle_error(tiny_bundle, tmp_path, monkeypatch):
    f = _pack.pack(tiny_bundle, tmp_path / "t.flyship")

    real_open = os.open

    def unreadable(path, *args, **kwargs):  # as chmod 0 would be for anyone but root
        if str(path).endswith("t.flyship"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", unreadable)
    with pytest.raises(BundleError, match=r"open packed bundle: expected a packed bundle file at .*t\.flyship, found "
                                          r"a file \(Permission denied\); check the path and its permissions"):
        _pack.open_pack(f, tmp_path / "cache")


def test_the_pack_command_writes_the_file_and_list_reads_it(tiny_bundle, tmp_path):
    out = tmp_path / "t.flyship"
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "pack", str(tiny_bundle), "-o", str(out)],
                       capture_output=True, text=True, timeout=120, env={**__import__("os").environ,
                                                                         "FLYSHIP_BUNDLE_CACHE": str(tmp_path / "c")})
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == _pack.pack_bytes(tiny_bundle)
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "list", str(out)], capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "FLYSHIP_BUNDLE_CACHE": str(tmp_path / "c")})
    assert r.returncode == 0 and "flyship_tiny::addsub" in r.stdout, r.stderr


@pytest.mark.parametrize("umask", [0o022, 0o007])
def test_the_packed_file_gets_the_mode_of_any_file_the_user_writes(tiny_bundle, tmp_path, umask):
    """Not mkstemp's private 0600: a file for shipping is readable as the user's umask allows."""
    out = tmp_path / "t.flyship"
    r = subprocess.run(["sh", "-c", f'umask {umask:03o} && exec "$0" -m flyship.loader.tools.cli pack "$1" -o "$2"',
                        sys.executable, str(tiny_bundle), str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_packing_refuses_a_code_object_that_differs_from_its_sha256(tiny_bundle, bundle_copy, tmp_path):
    root = bundle_copy()
    m = _m.read(root)
    f = root / m.ops[0].specializations[0].variants[0].code_object.file
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(BundleError, match="sha256"):
        _pack.pack(root, tmp_path / "damaged.flyship")
    assert not (tmp_path / "damaged.flyship").exists()


def _damage_middle(blob: bytes) -> bytes:
    mid = len(blob) // 2
    return blob[:mid] + bytes(b ^ 0xFF for b in blob[mid:mid + 64]) + blob[mid + 64:]


@pytest.mark.parametrize("damage, message", [
    (_damage_middle, r"expected member \S+ to read back intact, got BadZipFile: .*the file is damaged"),
    (lambda b: b[:-100], r"got a zip archive without its directory .*the file is truncated or damaged"),
    (lambda b: b[: len(b) // 2], r"got a zip archive without its directory .*the file is truncated or damaged"),
    (lambda b: b"", r"got an empty file \(0 bytes\)"),
    (lambda b: b"#!/bin/sh\necho not a bundle\n", r"got a file that is not a zip archive \(\d+ bytes, starting"),
], ids=["corrupt-in-the-middle", "truncated-end", "truncated-half", "zero-length", "not-a-zip"])
def test_a_damaged_packed_file_is_a_bundle_error_naming_the_file_and_how_to_remake_it(tiny_bundle, tmp_path,
                                                                                       monkeypatch, damage, message):
    import flyship

    monkeypatch.setenv("FLYSHIP_BUNDLE_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "bad.flyship"
    f.write_bytes(damage(_pack.pack(tiny_bundle, tmp_path / "t.flyship").read_bytes()))
    with pytest.raises(BundleError, match=message) as e:
        flyship.load(f)
    assert str(f) in str(e.value) and "rebuild or re-copy it with `flyc-build ... --pack` or `flyship pack" in str(
        e.value)
    assert not any((tmp_path / "cache").glob("*/*"))
