"""Hostile inputs the loader must refuse: a planted prebuilt extension, a newline in a hook's patches path, a
swapped bundle-cache entry. Each hostile case runs where it could do harm (a subprocess that would dlopen, a
fresh interpreter that would run a .pth) and checks that nothing ran."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flyship.errors import ConfigError
from flyship.loader import extension, prebuilt
from flyship.loader.tools import hook

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

pytestmark = pytest.mark.cpu

PLANT = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *p = getenv("PLANTED_MARK");
    FILE *f = p ? fopen(p, "w") : NULL;
    if (f) { fputs("ran", f); fclose(f); }
}
"""

FIND = """
import sys
from pathlib import Path
from flyship.loader import extension
found = extension.find_prebuilt(sys.argv[1], near=Path(sys.argv[2]))
if found is not None:
    extension._import(sys.argv[1], found)
print("found" if found else "none")
"""

NAME = "flyship_planted_test_0123456789ab"


@pytest.fixture(scope="module")
def planted_so(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to make the planted library with")
    d = tmp_path_factory.mktemp("plant")
    (d / "plant.c").write_text(PLANT)
    out = d / f"{NAME}.so"  # the name the loader looks for
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(d / "plant.c")], check=True, timeout=120)
    return out


def find_in(folder: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, bool]:
    mark = tmp_path / "mark"
    env = {k: v for k, v in os.environ.items() if k != "FLYSHIP_EXTENSION_PATH"}
    env["PLANTED_MARK"] = str(mark)
    r = subprocess.run([PY, "-c", FIND, NAME, str(folder), str(tmp_path / "prefix")], cwd=ROOT, capture_output=True,
                       text=True, env=env, timeout=120)
    return r, mark.exists()


def test_a_planted_library_in_a_world_writable_folder_beside_a_bundle_is_never_opened(planted_so, tmp_path):
    shared = tmp_path / "shared_tmp"
    shared.mkdir()
    shutil.copy(planted_so, shared / f"{NAME}.so")
    extension.install(planted_so, tmp_path / "recorded")  # a valid record, to plant beside it as well
    shutil.copy(prebuilt.record_path(tmp_path / "recorded" / f"{NAME}.so"), shared)
    os.chmod(shared, 0o777)
    r, ran = find_in(shared, tmp_path)
    assert r.returncode == 0, r.stderr
    assert not ran and r.stdout.strip() == "none"
    assert "writable by group or others" in r.stderr


def test_a_library_planted_by_another_user_in_a_sticky_tmp_is_never_opened(planted_so, tmp_path):
    if os.getuid() != 0:
        pytest.skip("planting a file owned by another user needs root")
    shared = tmp_path / "tmp_like"
    shared.mkdir()
    extension.install(planted_so, shared)  # a library and a matching record, both then handed to "nobody"
    for f in shared.iterdir():
        os.chown(f, 65534, 65534)
    os.chmod(shared, 0o1777)  # like /tmp: anyone may add files
    r, ran = find_in(shared, tmp_path)
    assert not ran and r.stdout.strip() == "none" and "owned by uid 65534" in r.stderr


def test_a_library_without_a_record_or_with_other_bytes_is_refused(planted_so, tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    shutil.copy(planted_so, own / f"{NAME}.so")
    r, ran = find_in(own, tmp_path)
    assert not ran and r.stdout.strip() == "none" and "no record" in r.stderr
    extension.install(own / f"{NAME}.so", own)  # now recorded; then its bytes change
    with open(own / f"{NAME}.so", "ab") as f:
        f.write(b"\0")
    r, ran = find_in(own, tmp_path)
    assert not ran and r.stdout.strip() == "none" and "differs from the recorded" in r.stderr


def test_a_link_to_a_recorded_library_is_refused(planted_so, tmp_path):
    extension.install(planted_so, tmp_path / "real")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / f"{NAME}.so").symlink_to(tmp_path / "real" / f"{NAME}.so")
    shutil.copy(prebuilt.record_path(tmp_path / "real" / f"{NAME}.so"), linked)
    r, ran = find_in(linked, tmp_path)
    assert not ran and "symbolic link" in r.stderr


def test_a_library_installed_by_prebuild_with_its_record_is_imported(planted_so, tmp_path):
    extension.install(planted_so, tmp_path / "ok")
    r, ran = find_in(tmp_path / "ok", tmp_path)
    # the planted library is no Python module, so the import fails after dlopen: the constructor ran, as a
    # recorded library is trusted
    assert ran and "PyInit_" in r.stderr


def test_a_newline_in_the_patches_path_is_refused_and_adds_no_line(tmp_path, tiny_bundle):
    folder = tmp_path / "evil\nimport os; os.system('touch PWNED')\n"
    folder.mkdir()
    pf = folder / "patches.json"
    pf.write_text('{"bundle": "%s", "patches": []}' % tiny_bundle)
    site = tmp_path / "site"
    site.mkdir()
    with pytest.raises(ConfigError, match="without control characters"):
        hook.install(pf, site)
    assert not (site / hook.PTH_NAME).exists()


def test_the_pth_holds_the_path_as_a_string_literal_only(tmp_path, tiny_bundle):
    folder = tmp_path / "it's \"quoted\" \\ here"
    folder.mkdir()
    pf = folder / "patches.json"
    pf.write_text('{"bundle": "%s", "patches": []}' % tiny_bundle)
    site = tmp_path / "site"
    site.mkdir()
    pth = hook.install(pf, site)
    lines = pth.read_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith("import flyship._startup")
    assert hook.status(site)["patches"] == str(pf)


@pytest.mark.parametrize("text", ["", "\n", "garbage\x00\xff", "# flyship hook: [1, 2]\n"])
def test_an_empty_or_garbage_pth_does_not_break_status(tmp_path, text):
    (tmp_path / hook.PTH_NAME).write_text(text, errors="surrogateescape")
    s = hook.status(tmp_path)
    assert s is not None and not s["ok"] and s["patches"] == "?"


REMOVE_READ_ONLY = """
import pathlib, sys
def unlink(self, missing_ok=False):  # a read-only site-packages (root ignores a folder's mode, so fake it)
    raise PermissionError(30, "Read-only file system", str(self))
pathlib.Path.unlink = unlink
from flyship.loader.tools.cli import main
main(["hook", "remove", "--site-dir", sys.argv[1]])
"""


def test_hook_remove_on_a_read_only_site_is_a_flyship_error_not_a_traceback(tmp_path):
    (tmp_path / hook.PTH_NAME).write_text("")
    r = subprocess.run([PY, "-c", REMOVE_READ_ONLY, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "hook remove: cannot delete" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / hook.PTH_NAME).exists()


# --- the bundle cache: an entry someone else controls is never read --------------------------------------------


def _entry(pack_file: Path, cache: Path) -> Path:
    import hashlib

    return cache / hashlib.sha256(pack_file.read_bytes()).hexdigest()


def test_a_cache_entry_that_is_a_link_to_another_folder_is_refused(tiny_bundle, tmp_path):
    from flyship.bundle import pack as _pack
    from flyship.bundle.errors import BundleError

    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship")
    theirs = _pack.open_pack(f, tmp_path / "their_cache")  # a valid copy in a folder "someone else" controls
    cache = tmp_path / "cache"
    cache.mkdir()
    _entry(f, cache).symlink_to(theirs, target_is_directory=True)
    with pytest.raises(BundleError, match="refused the cache entry .*symbolic link"):
        _pack.open_pack(f, cache)


def test_a_cache_entry_writable_by_others_is_refused(tiny_bundle, tmp_path):
    from flyship.bundle import pack as _pack
    from flyship.bundle.errors import BundleError

    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship")
    d = _pack.open_pack(f, tmp_path / "cache")
    os.chmod(d, 0o777)
    with pytest.raises(BundleError, match="writable by group or others"):
        _pack.open_pack(f, tmp_path / "cache")


def test_a_cache_entry_owned_by_another_user_is_refused(tiny_bundle, tmp_path):
    from flyship.bundle import pack as _pack
    from flyship.bundle.errors import BundleError

    if os.getuid() != 0:
        pytest.skip("making a folder owned by another user needs root")
    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship")
    d = _pack.open_pack(f, tmp_path / "cache")
    os.chown(d, 65534, 65534)
    with pytest.raises(BundleError, match="owned by uid 65534"):
        _pack.open_pack(f, tmp_path / "cache")


def test_a_file_swapped_into_a_cache_entry_for_a_link_is_replaced_by_the_verified_bytes(tiny_bundle, tmp_path):
    from flyship.bundle import pack as _pack

    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship")
    d = _pack.open_pack(f, tmp_path / "cache")
    evil = tmp_path / "evil_references.py"
    evil.write_bytes((d / "references.py").read_bytes())  # same bytes: only the link would betray it
    (d / "references.py").unlink()
    (d / "references.py").symlink_to(evil)
    d2 = _pack.open_pack(f, tmp_path / "cache")
    assert d2 == d and not (d / "references.py").is_symlink()


OPEN_ONE = """
import sys
from flyship.bundle import pack
print(pack.open_pack(sys.argv[1], sys.argv[2]))
"""


def test_sixteen_processes_opening_one_pack_into_an_empty_cache_all_succeed(tiny_bundle, tmp_path):
    from flyship.bundle import pack as _pack

    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship")
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([PY, "-c", OPEN_ONE, str(f), str(cache)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(16)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 16, [e for _, e in outs if e]
    assert {o.strip() for o, _ in outs} == {str(_entry(f, cache))}
    assert sorted(p.name for p in cache.iterdir()) == [_entry(f, cache).name]


# --- signed packs ------------------------------------------------------------------------------------------------


@pytest.fixture()
def keys(tmp_path):
    pytest.importorskip("cryptography", reason="signed packs need the optional 'cryptography' (flyship[sign])")
    from flyship.bundle import signing

    return signing.generate_key(tmp_path / "k1"), signing.generate_key(tmp_path / "k2")


def test_a_signed_pack_opens_under_a_policy_that_trusts_its_key(tiny_bundle, tmp_path, keys):
    from flyship.bundle import pack as _pack

    (k1, pub1), _ = keys
    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship", sign_key=k1)
    d = _pack.open_pack(f, tmp_path / "cache", trusted_keys=[pub1])
    assert (d / "manifest.json").read_bytes() == (tiny_bundle / "manifest.json").read_bytes()
    assert _pack.open_pack(f, tmp_path / "cache2").is_dir()  # no policy: a signed pack opens as any other


def test_a_pack_signed_by_an_unknown_key_is_refused(tiny_bundle, tmp_path, keys):
    from flyship.bundle import pack as _pack
    from flyship.bundle.errors import BundleError

    (k1, _), (_, pub2) = keys
    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship", sign_key=k1)
    with pytest.raises(BundleError, match="unknown key"):
        _pack.open_pack(f, tmp_path / "cache", trusted_keys=[pub2])
    assert not (tmp_path / "cache").exists()


def test_an_unsigned_pack_or_a_folder_is_refused_when_a_signature_is_required(tiny_bundle, tmp_path, keys,
                                                                                monkeypatch):
    from flyship.bundle import pack as _pack
    from flyship.bundle.errors import BundleError

    (_, pub1), _ = keys
    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship")
    monkeypatch.setenv("FLYSHIP_TRUSTED_KEYS", str(pub1))
    with pytest.raises(BundleError, match="got an unsigned pack"):
        _pack.bundle_dir(f)
    with pytest.raises(BundleError, match="got a bundle folder"):
        _pack.bundle_dir(tiny_bundle)


def test_a_bad_signature_is_refused(tiny_bundle, tmp_path, keys):
    import io
    import zipfile

    from flyship.bundle import pack as _pack
    from flyship.bundle import signing
    from flyship.bundle.errors import BundleError

    (k1, pub1), _ = keys
    good = _pack.pack_bytes(tiny_bundle, sign_key=k1)
    # Another manifest under the same signature: rewrite the index (one member's sha256 changed) and keep the sig.
    zin = zipfile.ZipFile(io.BytesIO(good))
    members = {n: zin.read(n) for n in zin.namelist()}
    members[_pack.INDEX_NAME] = members[_pack.INDEX_NAME].replace(b'"members"', b'"members" ')
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n in zin.namelist():
            z.writestr(_pack._info(n), members[n])
    (tmp_path / "bad.flyship").write_bytes(buf.getvalue())
    with pytest.raises(BundleError, match="does not match the pack's index"):
        _pack.open_pack(tmp_path / "bad.flyship", tmp_path / "cache", trusted_keys=[pub1])
    assert signing.SIG_NAME in zin.namelist()


def test_sign_and_load_end_to_end_through_the_cli(tiny_bundle, tmp_path, keys):
    (_, pub1), _ = keys
    key = tmp_path / "cli_key"
    r = subprocess.run([PY, "-m", "flyship.loader.tools.cli", "keygen", str(key)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert oct(os.stat(key).st_mode & 0o777) == "0o600"
    f = tmp_path / "tiny.flyship"
    r = subprocess.run([PY, "-m", "flyship.loader.tools.cli", "pack", str(tiny_bundle), "-o", str(f), "--sign", str(key)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "FLYSHIP_BUNDLE_CACHE": str(tmp_path / "c")}
    for trusted, ok in ((f"{key}.pub", True), (str(pub1), False)):
        r = subprocess.run([PY, "-m", "flyship.loader.tools.cli", "list", str(f)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env={**env, "FLYSHIP_TRUSTED_KEYS": trusted})
        assert (r.returncode == 0) == ok, r.stderr
        assert ok or "unknown key" in r.stderr


# --- hostile packs ----------------------------------------------------------------------------------------------


BOMB = """
import resource, sys
from flyship.bundle import pack
from flyship.bundle.errors import BundleError
try:
    pack.open_pack(sys.argv[1], sys.argv[2])
    print("opened")
except BundleError as e:
    print("refused:", e)
# This process's own peak (VmHWM belongs to the address space exec made; ru_maxrss would carry over the peak of
# the forking pytest process, gigabytes late in a suite).
hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
print("maxrss_kb", hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_a_small_pack_with_a_deflated_gigabyte_member_is_refused_in_little_memory(tiny_bundle, tmp_path):
    import hashlib
    import json
    import zipfile

    from flyship.bundle import pack as _pack

    bomb = tmp_path / "bomb.flyship"
    zeros = b"\0" * (1 << 20)
    h = hashlib.sha256()
    for _ in range(1024):
        h.update(zeros)
    index = {"format": "flyship-pack", "version": 1, "members": {"manifest.json": h.hexdigest()}}
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr(_pack._info(_pack.INDEX_NAME), json.dumps(index, sort_keys=True))
        with z.open("manifest.json", "w", force_zip64=True) as m:
            for _ in range(1024):
                m.write(zeros)
    assert bomb.stat().st_size < 1_200_000
    cache = tmp_path / "cache"
    r = subprocess.run([PY, "-c", BOMB, str(bomb), str(cache)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "compressed" in r.stdout
    assert int(r.stdout.split("maxrss_kb")[1]) <= 100_000
    assert not cache.exists() or not any(cache.iterdir())


def test_a_library_planted_in_a_shared_extensions_folder_is_refused_not_opened(ext, planted_so, tmp_path):
    import dataclasses

    cfg = extension.config(ext.flavor())
    cfg = dataclasses.replace(cfg, directory=tmp_path / "shared_ext" / cfg.name)
    cfg.directory.mkdir(parents=True)
    shutil.copy(planted_so, cfg.library)
    os.chmod(cfg.directory, 0o777)
    with pytest.raises(extension.ExtensionBuildError, match="refused .*writable by group or others"):
        extension.build(cfg)


PTH_START = """
import site, sys
site.addsitedir(sys.argv[1])
print("started")
"""


DANGLING = ('# flyship hook: "/no/such/patches.json"\n'
            'import flyship._startup as s; s.activate("/no/such/patches.json")\n')


@pytest.mark.parametrize("text", ["", "garbage line\n\0\n", DANGLING])
def test_an_empty_garbage_or_dangling_pth_does_not_break_interpreter_start(tmp_path, text):
    (tmp_path / hook.PTH_NAME).write_text(text)
    r = subprocess.run([PY, "-c", PTH_START, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "started", r.stderr
    assert ("cannot read the patches file" in r.stderr) == (text == DANGLING)


def test_racing_a_link_into_the_cache_entry_never_hands_out_the_other_folder(tiny_bundle, tmp_path):
    import threading

    from flyship.bundle import pack as _pack
    from flyship.bundle.errors import BundleError

    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship")
    theirs = _pack.open_pack(f, tmp_path / "their_cache")
    cache = tmp_path / "cache"
    entry = _entry(f, cache)
    stop = threading.Event()

    def attacker() -> None:  # keeps swapping a link to its own folder in for the entry
        while not stop.is_set():
            link = cache / ".attacker-link"
            try:
                link.unlink(missing_ok=True)
                link.symlink_to(theirs, target_is_directory=True)
                if entry.is_dir() and not entry.is_symlink():
                    os.rename(entry, cache / f".moved-{os.urandom(4).hex()}")
                os.rename(link, entry)
            except OSError:
                pass

    _pack.open_pack(f, cache)
    t = threading.Thread(target=attacker, daemon=True)
    t.start()
    handed, refused = [], 0
    try:
        for _ in range(25):
            try:
                handed.append(_pack.open_pack(f, cache))
            except BundleError:
                refused += 1
    finally:
        stop.set()
        t.join(timeout=10)
    assert refused + len(handed) == 25 and refused > 0
    for d in handed:  # whatever was handed out was checked as a real folder of ours (the link was refused)
        assert d == entry
