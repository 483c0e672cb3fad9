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
