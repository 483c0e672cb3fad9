"""flyship check: a CI gate for packs, one exit code per kind of refusal (unsigned 3, altered 4, untrusted key 5),
and a report of what would load where."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flyship.bundle import pack as _pack
from flyship.bundle import signing

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(our private key, our .pub, someone else's private key)."""
    d = tmp_path_factory.mktemp("keys")
    ours, pub = signing.generate_key(d / "ours.key")
    theirs, _ = signing.generate_key(d / "theirs.key")
    return ours, pub, theirs


def check(path: Path, *args: str, keys_env: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FLYSHIP_TRUSTED_KEYS"}
    if keys_env is not None:
        env["FLYSHIP_TRUSTED_KEYS"] = keys_env
    return subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "check", str(path), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def rewrite(src: Path, dest: Path, member: str, edit) -> Path:
    """A well-formed copy of the pack ``src`` (valid zip, CRCs right) with one member's bytes edited, as someone
    altering a pack on purpose would write it."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, edit(data) if info.filename == member else data)
    return dest


def test_a_pack_signed_by_a_trusted_key_passes_and_says_which_ops_launch_where(tmp_path, tiny_bundle, keys):
    ours, pub, _ = keys
    f = _pack.pack(tiny_bundle, tmp_path / "tiny.flyship", ours)
    r = check(f, "--trusted-key", str(pub), "--device", "gfx950", "--device", "sm_90")
    assert r.returncode == 0, r.stderr
    assert f"signed by {pub.read_text().split()[1]} (trusted)" in r.stdout
    assert "every sha256 matches the index" in r.stdout
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("    ")}
    assert rows["add"].endswith("gfx950: 1/2 specs; sm_90: 2/2 specs")  # f16 has no gfx950 code object
    assert rows["scale_rows"].endswith("gfx950: 0/1 specs; sm_90: 1/1 specs")
    r = check(f, keys_env=str(pub))  # the same through FLYSHIP_TRUSTED_KEYS
    assert r.returncode == 0 and "(trusted)" in r.stdout, r.stderr


def test_unsigned_altered_and_wrongly_signed_packs_exit_3_4_and_5(tmp_path, tiny_bundle, keys):
    ours, pub, theirs = keys
    unsigned = _pack.pack(tiny_bundle, tmp_path / "unsigned.flyship")
    r = check(unsigned, "--trusted-key", str(pub))
    assert r.returncode == 3 and "got an unsigned pack" in r.stderr, r.stderr
    assert check(unsigned).returncode == 0  # no trusted keys: a signature is not required

    altered = rewrite(_pack.pack(tiny_bundle, tmp_path / "signed.flyship", ours), tmp_path / "altered.flyship",
                      "manifest.json", lambda b: b.replace(b'"doc": "', b'"doc": "(altered) ', 1))
    r = check(altered, "--trusted-key", str(pub))
    assert r.returncode == 4 and "sha256" in r.stderr and "altered" in r.stderr, r.stderr
    assert check(altered).returncode == 4  # caught against the pack's own key without trusted keys

    resigned = rewrite(tmp_path / "signed.flyship", tmp_path / "resigned.flyship", "flyship-pack.json",
                       lambda b: b.replace(b'"members": {', b'"members": {\n ', 1))  # the index edited after signing
    r = check(resigned, "--trusted-key", str(pub))
    assert r.returncode == 4 and "does not match the pack's index" in r.stderr, r.stderr

    foreign = _pack.pack(tiny_bundle, tmp_path / "foreign.flyship", theirs)
    r = check(foreign, "--trusted-key", str(pub))
    assert r.returncode == 5 and "expected a signature by a trusted key" in r.stderr, r.stderr


def test_a_folder_or_a_file_that_is_not_a_pack_exits_1_with_what_to_do(tmp_path, tiny_bundle):
    r = check(tiny_bundle)
    assert r.returncode == 1 and "`flyship pack BUNDLE -o FILE`" in r.stderr
    junk = tmp_path / "junk.flyship"
    junk.write_text("not a zip")
    assert check(junk).returncode == 1


def test_a_missing_file_is_a_usage_error_not_a_bad_pack(tmp_path):
    r = check(tmp_path / "nothere.flyship")
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr  # not "not a zip archive" (exit 1)


def test_keygen_into_a_missing_folder_says_which_folder_to_create(tmp_path):
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "keygen", str(tmp_path / "sub" / "k")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and f"create the folder {tmp_path / 'sub'} first" in r.stderr, r.stderr
    assert "Errno" not in r.stderr
