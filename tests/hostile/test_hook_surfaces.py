"""The hook's surfaces under hostile input (issue 22): install with a non-UTF-8 patches path, a broken .pth or
patches file at status and at interpreter start, remove on a read-only site; each case in a fresh Python with a time
and a memory limit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[2]  # this checkout: the subprocesses import its code
TIMEOUT_S = 300  # generous: the machine runs several suites at once; a hang is still caught
MEMORY_LIMIT = 6 << 30  # address space: torch maps ~2-3 GB of it


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_case(code: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh Python (this checkout first on the path) under the limits; a crash (a signal) or a
    hang fails the test here."""
    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full, capture_output=True,
                           text=True, timeout=TIMEOUT_S, preexec_fn=_limit)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hang: no result after {TIMEOUT_S} s; output: {e.stdout!r} {e.stderr!r}")
    assert p.returncode >= 0, f"crash: killed by signal {-p.returncode}; stderr: {p.stderr[-3000:]}"
    return p


def ok(p: subprocess.CompletedProcess[str], want: str) -> None:
    assert p.returncode == 0 and want in p.stdout, f"rc {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr[-4000:]}"


# ---------------------------------------------------------------- the hook

_HOOK = """
import json, os, sys
from pathlib import Path
from flyship.errors import ConfigError
from flyship.loader.tools import hook
site, tiny = Path({site!r}), {tiny!r}
patches = Path(os.fsdecode({patches!r}))
patches.write_text(json.dumps({{"bundle": tiny, "patches": [
    {{"target": "dropin_model:add", "op": "add", "args": {{"x": "a", "y": "b"}}, "cpu_target": "gfx942"}}]}}))
try:
    pth = hook.install(patches, site)
    data = pth.read_bytes()
    data.decode("ascii")  # Python reads a .pth in the locale's encoding: flyship's is ASCII
    print("INSTALLED", hook.status(site)["ok"])
except ConfigError as e:
    print("REFUSED", e)
print("LEFT", sorted(p.name for p in site.iterdir()))
for garbage in (b"", b"\\xff\\xfe garbage\\n", b"# flyship hook: [1,2\\n", b"# flyship hook: 12\\n"):
    (site / hook.PTH_NAME).write_bytes(garbage)
    st = hook.status(site)
    print("STATUS", st["ok"], st["patches"])
(site / hook.PTH_NAME).unlink()
"""


def test_hook_install_of_a_non_utf8_path_writes_ascii_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    weird = os.fsencode(str(tmp_path)) + b"/patches-\xff\xfe.json"
    p = run_case(_HOOK.format(site=str(site), tiny=str(ROOT / "tests" / "loader" / "data" / "tiny"), patches=weird))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "INSTALLED True" in p.stdout, p.stdout
    assert "LEFT ['zz_flyship_hook.pth']" in p.stdout, p.stdout
    assert p.stdout.count("STATUS False") == 4, p.stdout


def test_python_starts_with_a_hook_naming_a_broken_patches_file(tmp_path: Path) -> None:
    """The hook's .pth runs at every start: an empty, garbage or non-regular patches file, or a malformed
    FLYSHIP_HOOK, is one warning line, and Python starts."""
    site = tmp_path / "site"
    site.mkdir()
    patches = tmp_path / "patches.json"
    sys.path.insert(0, str(ROOT))
    from flyship.loader.tools import hook

    (site / hook.PTH_NAME).write_text(hook._pth_text(patches))
    code = f"import site; site.addsitedir({str(site)!r}); print('STARTED')"
    for content, env in ((b"", {}), (b"\xff\xfe[[[", {}), (b'{"patches": 7}', {}), (b"{}", {"FLYSHIP_HOOK": "maybe"})):
        patches.write_bytes(content)
        p = run_case(code, env)
        assert p.returncode == 0 and "STARTED" in p.stdout, p.stderr[-3000:]
        assert "Traceback" not in p.stderr and p.stderr.count("\n") <= 2, p.stderr
    assert sorted(f.name for f in site.iterdir()) == [hook.PTH_NAME]


def test_hook_remove_on_a_read_only_site_is_a_config_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root may delete from a read-only folder; as a user this proves `hook remove` is a ConfigError")
    site = tmp_path / "site"
    site.mkdir()
    (site / "zz_flyship_hook.pth").write_text("")
    os.chmod(site, 0o555)
    try:
        p = run_case(f"""
            from flyship.errors import ConfigError
            from flyship.loader.tools import hook
            try:
                hook.remove({str(site)!r})
            except ConfigError as e:
                print("REFUSED", e)
            """)
    finally:
        os.chmod(site, 0o755)
    ok(p, "REFUSED hook remove: cannot delete")
