"""SIGTERM at the phases of a real FlyDSL build where it used to go wrong (issue 32), each one found by watching the
build rather than by a time: the phases move by seconds with the machine's load. The middle of the build (workers
compiling) is tests/compiler/test_signals.py's; the 50-point trial over the whole build is scripts/sigterm_trial.py
(docs/compile-stage.md, "Signals").

* ``torch``: the planning import, right after torch's native library is mapped: SIGTERM raised inside torch's import
  went through pybind11 as a C++ exception (SIGABRT: ``terminate called after throwing an instance of
  'pybind11::error_already_set'``) or was swallowed (the build ran on and wrote its bundle).
* ``mlir``: FlyDSL's MLIR libraries being loaded (SIGSEGV in issue 32's trial).
* ``last kernel``: the last kernel's assembly and proof, the bundle's write, the workers' shutdown.
* ``wrote``: after the command returned: the signal only sets the status (143), the bundle stays whole.

Each must end with 143 (or 0 for ``wrote`` if the build was faster than the signal), no traceback, no process, and
nothing in TMPDIR or beside OUT but a whole bundle or none.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..conftest import ROOT, flydsl_python

pytestmark = pytest.mark.compile

SPEC = ROOT / "examples" / "flydsl" / "ops.py"


def _mapped(pid: int, name: str) -> bool:
    try:
        return name in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _logged(log: Path, words: str) -> bool:
    try:
        return words in log.read_text(errors="replace")
    except OSError:
        return False


PHASES = {
    "torch": lambda pid, log: _mapped(pid, "libtorch_cpu.so"),
    "mlir": lambda pid, log: _mapped(pid, "_mlir_libs/"),
    "last kernel": lambda pid, log: _logged(log, "[9/9]"),
    "wrote": lambda pid, log: _logged(log, "\nwrote "),
}


def _session_alive(sid: int) -> list[str]:
    """Live processes of the build's session: the trial script's own reading of /proc (one owner)."""
    spec = importlib.util.spec_from_file_location("flyship_sigterm_trial", ROOT / "scripts" / "sigterm_trial.py")
    trial = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trial)
    return trial.session_pids(sid)


@pytest.mark.parametrize("phase", list(PHASES))
def test_sigterm_at_a_phase_that_used_to_crash_exits_143_with_nothing_left(tmp_path, phase):
    py = flydsl_python()
    if py is None:
        pytest.skip("needs the FlyDSL build Python; it would send SIGTERM to a real FlyDSL build at " + phase)
    (tmp_path / "tmp").mkdir()
    log = tmp_path / "log"
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), PYTHONFAULTHANDLER="1")
    cmd = [py, "-m", "flyship.compiler.cli", str(SPEC), "-o", str(tmp_path / "out"), "--arch", "gfx942", "--no-cache"]
    with log.open("wb") as f:  # a file, not a pipe: a surviving worker would hold a pipe open
        proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=f, stderr=f, start_new_session=True)
    try:
        end = time.monotonic() + 300
        while proc.poll() is None and not PHASES[phase](proc.pid, log) and time.monotonic() < end:
            time.sleep(0.002)
        seen = proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = log.read_text(errors="replace")
    assert seen or phase == "wrote", f"the build ended before {phase}:\n{err[-2000:]}"
    assert rc in ((143, 0) if phase == "wrote" else (143,)), f"SIGTERM at {phase}: exit {rc}\n{err[-3000:]}"
    assert "Traceback" not in err and "Fatal Python error" not in err and "terminate called" not in err, err[-3000:]
    deadline = time.monotonic() + 10
    while (alive := _session_alive(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, f"processes of the build outlived it: {alive}"
    out = tmp_path / "out"
    if phase == "wrote":
        assert (out / "manifest.json").is_file()
    elif out.exists():  # the signal came after the bundle was in place (the last kernel's phase, a fast machine)
        assert (out / "manifest.json").is_file() and phase == "last kernel"
    left = sorted(p.name for p in (tmp_path / "tmp").iterdir()) + sorted(
        p.name for p in tmp_path.iterdir() if p.name not in ("tmp", "log", "out"))
    assert left == [], f"SIGTERM at {phase} left {left}"
