"""bundle/files.py: atomic writes give files the mode an ordinary write would."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_atomic_write_gives_the_file_0666_less_the_umask_and_reads_the_umask_right(tmp_path, umask):
    """Manifests and code objects in a shared build cache, packed bundles: written through atomic_write, read by
    other users as the umask allows (a temporary file alone would be 0600)."""
    code = ("import sys; from flyship.bundle.files import atomic_write, umask; "
            "atomic_write(sys.argv[1], b'x'); print(oct(umask()))")
    r = subprocess.run(["sh", "-c", f'umask {umask:03o} && exec "$0" -c "$1" "$2"', sys.executable, code,
                        str(tmp_path / "sub" / "f")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == oct(umask)
    assert stat.S_IMODE((tmp_path / "sub" / "f").stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["f"]


def test_a_regular_file_is_read_in_one_read_call_of_its_size_and_a_grown_one_up_to_the_limit(tmp_path, monkeypatch):
    import os

    from flyship.bundle import files
    from flyship.errors import BundleError

    path = tmp_path / "manifest.json"
    path.write_bytes(b"x" * (3 << 20))  # 3 MiB: three 1 MiB reads and a join before
    calls = []
    real_read = os.read

    def counting(fd, n):
        calls.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", counting)
    assert files.read_regular(path, 8 << 20, what="read") == b"x" * (3 << 20)
    assert calls == [(3 << 20) + 1]
    # the size fstat gave is only the first read's: a file that grows after it is read on, up to the limit
    grown = []

    def growing(fd, n):
        grown.append(n)
        if len(grown) == 1:
            path.write_bytes(b"x" * (5 << 20))
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", growing)
    with pytest.raises(BundleError, match=r"expected at most 4194304 bytes at .*, got more \(it grew while read\)"):
        files.read_regular(path, 4 << 20, what="read")
