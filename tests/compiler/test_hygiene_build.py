"""What a real flyc-build leaves behind: no worker after kill -9 and the next build removes its scratch, one writer
per path, a failed build leaves the existing bundle, a build leaves only the bundle and its pack."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from flyship.compiler import hygiene

from ..conftest import ROOT, children_of, need_flydsl_python, run_build, wait_for

pytestmark = pytest.mark.compile

SLOW_SPEC = Path(__file__).parent / "data" / "slow_spec.py"


@pytest.fixture
def slow_build(tmp_path):
    """Start flyc-build on the slow spec (two targets, two workers, both sleeping) and wait for both workers.
    Yields (the build process, its helper processes, the test folder, the build's TMPDIR); whatever the test
    does, every one of those processes is gone afterwards."""
    py = need_flydsl_python("kill a running flyc-build and check what is left")
    marks, tmp = tmp_path / "marks", tmp_path / "tmp"
    marks.mkdir()
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), FLYSHIP_TEST_SLOW_MARKS=str(marks))
    cmd = [py, "-m", "flyship.compiler.cli", str(SLOW_SPEC), "-o", str(tmp_path / "out"), "--arch", "sm_90",
           "--arch", "gfx942", "-j", "2"]
    log = (tmp_path / "build.log").open("wb")  # a file, not a pipe: a surviving worker would hold a pipe open
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=log, stderr=log)
    helpers: list[int] = []
    try:
        wait_for(lambda: len(list(marks.iterdir())) == 2 or proc.poll() is not None, 120, "two busy workers")
        assert proc.poll() is None, (tmp_path / "build.log").read_text()
        helpers = children_of(proc.pid)  # two workers and multiprocessing's resource tracker
        yield proc, helpers, tmp_path, tmp
    finally:
        for pid in [proc.pid, *helpers]:
            if hygiene.pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        log.close()



def test_kill_9_of_flyc_build_leaves_no_process_running_and_the_next_build_removes_its_scratch(slow_build):
    proc, helpers, root, tmp = slow_build
    assert len(helpers) >= 2
    scratch = list(tmp.glob(f"flyc-build-{proc.pid}-*"))
    assert len(scratch) == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not any(hygiene.pid_alive(p) for p in helpers), 10, f"processes {helpers} to end")
    assert scratch[0].exists()  # kill -9 gives no chance to clean up ...
    run_build(SLOW_SPEC, root / "out2", ["sm_90"], env={"TMPDIR": str(tmp)})
    assert not scratch[0].exists()  # ... so the next build removes it
    assert list(tmp.glob("flyc-build-*")) == []
    assert not (root / "out").exists() and list(root.glob(".out.flyc-build-*")) == []


def test_a_second_build_into_the_same_path_fails_saying_another_build_is_writing_it(slow_build):
    proc, _, root, tmp = slow_build
    r = run_build(SLOW_SPEC, root / "out", ["sm_90"], "--force", check=False, env={"TMPDIR": str(tmp)})
    assert r.returncode == 1
    assert (f"expected to be the only build writing {root / 'out'}, but another flyc-build is writing it now"
            in r.stderr)
    assert "Traceback" not in r.stderr
    assert proc.poll() is None  # the first build goes on


def test_a_failed_build_leaves_the_existing_bundle_and_nothing_else(tmp_path):
    out = tmp_path / "out"
    run_build(SLOW_SPEC, out, ["sm_90"], env={"TMPDIR": str(tmp_path)})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad_spec.py"
    bad.write_text(SLOW_SPEC.read_text().replace('"BLOCK": 1024', '"BLOCK": 1000'))  # not a power of two
    r = run_build(bad, out, ["sm_90"], "--force", check=False, env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 1 and "nothing was written" in r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["bad_spec.py", "out"])


def test_a_build_leaves_only_the_bundle_and_its_pack_in_the_output_folder(tmp_path):
    run_build(SLOW_SPEC, tmp_path / "out", ["sm_90"], "--pack", env={"TMPDIR": str(tmp_path)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.flyship"]

