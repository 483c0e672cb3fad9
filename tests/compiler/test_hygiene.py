"""What flyc-build leaves behind, the parts that need no build: atomic --force (the exchange and its fallback), one
writer per path (the output lock), stale scratch removed, workers that die with their parent, and the sweep that
tells flyship's own tools from the spec file's processes. The builds themselves (kill -9 of flyc-build, a second build
into the same path, a failed build) are in test_hygiene_build.py (compile tier)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flyship.bundle import manifest as M
from flyship.compiler import hygiene, outlock, pools, toolchain
from flyship.errors import CompileError

from ..conftest import wait_for

pytestmark = pytest.mark.cpu


def make_bundle_dir(path: Path, text: str) -> Path:
    path.mkdir()
    (path / M.MANIFEST_NAME).write_text(text)
    return path


def exchange_works(folder: Path) -> bool:
    a, b = folder / "probe-a", folder / "probe-b"
    a.mkdir()
    b.mkdir()
    try:
        return hygiene._renameat2_exchange(a, b)
    finally:
        a.rmdir()
        b.rmdir()


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_replacing_a_bundle_leaves_the_new_one_and_no_leftovers(tmp_path, exchange):
    if exchange and not exchange_works(tmp_path):
        pytest.skip("renameat2(RENAME_EXCHANGE) is unsupported here; it would check the atomic swap")
    out = make_bundle_dir(tmp_path / "out", "old")
    new = make_bundle_dir(tmp_path / ".out.flyc-build-1-x", "new")
    how = hygiene.replace_dir(new, out, exchange=exchange)
    assert how == ("exchange" if exchange else "two-renames")
    assert (out / M.MANIFEST_NAME).read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_the_path_holds_a_whole_bundle_at_every_step_of_an_exchange(tmp_path, monkeypatch):
    if not exchange_works(tmp_path):
        pytest.skip("renameat2(RENAME_EXCHANGE) is unsupported here; it would check the atomic swap")
    out = make_bundle_dir(tmp_path / "out", "old")
    new = make_bundle_dir(tmp_path / "new", "new")
    seen = []
    rmtree = hygiene.shutil.rmtree

    def spy(path, *a, **k):  # the moment between the swap and the removal of the old bundle
        seen.append((out / M.MANIFEST_NAME).read_text())
        rmtree(path, *a, **k)

    monkeypatch.setattr(hygiene.shutil, "rmtree", spy)
    renames = []
    monkeypatch.setattr(Path, "rename", lambda self, target: renames.append((self, target)))  # must not be used
    assert hygiene.replace_dir(new, out) == "exchange"
    assert seen == ["new"] and renames == []


def test_a_crash_between_the_two_fallback_renames_is_undone_by_the_next_build(tmp_path):
    out = tmp_path / "out"
    dead = 2**22 + 12345  # above pid_max on this machine: no such process
    make_bundle_dir(tmp_path / f".out.old-{dead}", "old")  # parked, and the new one never arrived
    make_bundle_dir(tmp_path / f".out.flyc-build-{dead}-abc", "half")
    hygiene.recover_output(out)
    assert (out / M.MANIFEST_NAME).read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_the_output_lock_excludes_a_second_build_and_removes_its_file_when_the_build_ends(tmp_path):
    out = tmp_path / "out"
    with outlock.output_lock(out):
        assert [p.name for p in tmp_path.iterdir()] == [".out.flyc-build.lock"]
        with pytest.raises(CompileError, match="another flyc-build is writing it now"):
            with outlock.output_lock(out):
                pass
        assert outlock.lock_path(out).exists()  # the refused build leaves the holder's lock alone
    assert list(tmp_path.iterdir()) == []
    (tmp_path / ".out.flyc-build.lock").write_text("")  # left by a build killed with kill -9
    with outlock.output_lock(out):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_lock_file_removed_by_the_previous_holder_after_we_opened_it_is_not_the_lock_we_keep(tmp_path,
                                                                                              monkeypatch):
    """The race that deleting lock files opens: build A unlinks the file and lets go just after build B opened it,
    and build C creates a new file at the path. B must not keep its lock on the unlinked file (C would hold
    the other one and both would write the bundle): it locks the path's current file instead."""
    import fcntl

    out = tmp_path / "out"
    path = outlock.lock_path(out)
    real_flock = fcntl.flock
    calls = []

    def flock(fd, op):
        if not calls:  # between B's open and B's flock: A unlinks, C creates the path anew
            path.unlink()
            path.write_text("")
        calls.append(op)
        return real_flock(fd, op)

    monkeypatch.setattr(outlock.fcntl, "flock", flock)
    with outlock.output_lock(out):
        monkeypatch.setattr(outlock.fcntl, "flock", real_flock)
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # the file at the path is the one locked
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []

def test_stale_scratch_of_a_dead_build_is_removed_and_a_live_ones_is_kept(tmp_path):
    dead = 2**22 + 12345
    stale = tmp_path / f"flyc-build-{dead}-abc"
    live = tmp_path / f"flyc-build-{os.getppid()}-abc"
    other = tmp_path / "flyc-build-notapid"
    for p in (stale, live, other):
        p.mkdir()
    assert hygiene.clean_stale(tmp_path, "flyc-build-") == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


CHILD = """
import os, sys, time
from flyship.compiler.hygiene import die_with_parent
die_with_parent(os.getppid())
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""
PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]])
time.sleep(120)
"""


def test_a_worker_whose_parent_is_killed_dies_with_it(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "parent.py").write_text(PARENT)
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(tmp_path / "child.py"),
                               str(pidfile)])
    try:
        wait_for(pidfile.exists, 30, "the child to arm its death signal")
        child = int(pidfile.read_text())
        parent.kill()
        parent.wait()
        wait_for(lambda: not hygiene.pid_alive(child), 10, f"child {child} to end with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()


# ---- flyship's own tool processes are told apart from the spec file's by how they were started (issue 31) --------

def test_the_sweep_tells_flyships_own_tools_from_the_spec_files_processes_by_how_they_were_started():
    """Three ``sleep`` processes of one name: one started as flyship starts its tools, one as a spec file would, and
    one that a tool (a shell started as flyship starts its tools) starts in turn."""
    tool = subprocess.Popen(["sleep", "60"], env=hygiene.tool_env())
    spec = subprocess.Popen(["sleep", "60"])
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], env=hygiene.tool_env())
    try:
        deadline = time.monotonic() + 10
        while not (grandchild := hygiene.descendants([shell.pid])) and time.monotonic() < deadline:
            time.sleep(0.02)
        found = {p.pid: hygiene.start_time(p.pid) for p in (tool, spec)}
        stopped = {s.pid: s for s in hygiene.stop_processes({**found, **grandchild})}
        assert stopped[tool.pid].name == stopped[spec.pid].name == "sleep"  # one name: the mark tells them apart
        assert stopped[tool.pid].tool and not stopped[spec.pid].tool
        assert grandchild and all(stopped[pid].tool for pid in grandchild)  # what a tool starts is the tool's
        assert str(stopped[spec.pid]) == f"pid {spec.pid} (sleep)"
    finally:
        for p in (tool, spec, shell):
            p.kill()
            p.wait()


def test_a_workers_leftovers_are_named_as_the_spec_files_or_as_flyships_own_tools():
    said: list[str] = []
    stopped = [hygiene.Stopped(11, "ld.lld", True), hygiene.Stopped(12, "llvm-mc", True),
               hygiene.Stopped(13, "sleep", False)]
    pools.say_stopped(stopped, "gfx942 worker", said.append)
    assert said == [
        "flyc-build: stopped 1 process(es) that the spec file started in a gfx942 worker and left running after it "
        "ended: pid 13 (sleep); a spec file should not leave processes behind",
        "flyc-build: stopped 2 of flyship's own tool process(es) (the assembler, linker or bundler it runs) still "
        "running as the gfx942 worker ended: pid 11 (ld.lld), pid 12 (llvm-mc)"]
    said.clear()
    pools.say_stopped(stopped[:2], "gfx942 worker", said.append)
    assert len(said) == 1 and "spec file" not in said[0]


def test_flyships_tool_runner_starts_its_tools_marked():
    tool = toolchain.Tool("sh", ("sh", "-c", f'printf "%s" "${hygiene.TOOL_MARK}"', "sh"), "0")
    assert toolchain.run_tool(tool, [], operation="print the mark").stdout == "1"
    assert os.environ.get(hygiene.TOOL_MARK) is None  # only the tool's environment holds it


def test_the_lock_file_names_its_holder_and_a_refused_build_says_who(tmp_path):
    import socket

    out = tmp_path / "out"
    with outlock.output_lock(out):
        fd = os.open(outlock.lock_path(out), os.O_RDONLY)
        try:
            holder = outlock.lock_holder(fd)
        finally:
            os.close(fd)
        assert (holder.pid, holder.host, holder.start) == (os.getpid(), socket.gethostname(),
                                                            hygiene.start_time(os.getpid()))
        assert not holder.gone()
        with pytest.raises(CompileError, match=rf"another flyc-build is writing it now \(pid {os.getpid()} on "
                                               rf"{socket.gethostname()}, since 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC\)"):
            with outlock.output_lock(out):
                pass


_INHERITED = """
import fcntl, json, os, socket, sys, time
sys.path[:0] = [{root!r}]
from flyship.compiler import hygiene
fd = os.open({path!r}, os.O_RDWR | os.O_CREAT, 0o644)  # without O_CLOEXEC: a child keeps it
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, json.dumps({{"pid": os.getpid(), "host": socket.gethostname(), "start": hygiene.start_time(os.getpid()),
                          "started": "2026-12-06 07:00:00 UTC"}}).encode(), 0)  # the record a build writes
child = os.fork()
if child == 0:
    for out in (1, 2):  # not the test's pipes
        os.dup2(os.open(os.devnull, os.O_WRONLY), out)
    time.sleep(60)  # a process the build forked, holding the lock after the build is gone
    os._exit(0)
print(os.getpid(), child, flush=True)
os._exit(0)  # the build, killed
"""


@pytest.mark.parametrize("who", ["sweep", "next build"])
def test_a_lock_still_held_after_its_build_is_gone_is_removed_by_pid_on_this_host(tmp_path, who):
    """kill -9 of a build whose forked child inherited the lock's descriptor: the lock stays held by the child. The
    record names the build (gone), the kernel names it as the locker: the sweep and the next build remove it; a lock
    whose holder lives (the other tests) is never touched."""
    import fcntl
    import subprocess

    from ..conftest import ROOT

    out = tmp_path / "out"
    path = outlock.lock_path(out)
    r = subprocess.run([sys.executable, "-c", _INHERITED.format(root=str(ROOT), path=str(path))],
                       capture_output=True, text=True, timeout=60)
    build_pid, orphan = map(int, r.stdout.split())
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # still held, by the orphan
        if who == "sweep":
            assert outlock.sweep_leftovers(out) == [path]
        else:
            with outlock.output_lock(out):
                assert path.exists() and not os.path.samestat(os.fstat(fd), path.stat())  # a new lock file
            assert not path.exists()
        assert outlock.lock_holder(fd).pid == build_pid and outlock.lock_holder(fd).gone()
    finally:
        os.close(fd)
        os.kill(orphan, signal.SIGKILL)
