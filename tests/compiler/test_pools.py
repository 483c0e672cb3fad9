"""The local executor's early pools (``compiler/pools.py``): a target's workers import the spec file while the build
process imports it to plan, the run takes them when they fit, and nothing outlives a build that fails meanwhile."""

from __future__ import annotations

import dataclasses
import importlib
import textwrap
import time
from pathlib import Path

import pytest

from flyship.bundle import manifest as M
from flyship.compiler import pipeline as B
from flyship.compiler import executors, frontends, pools
from flyship.errors import CompileError

from ..conftest import children_of

pytestmark = pytest.mark.cpu

# The spec's planning import (the build process) waits until a worker is importing the same file: it can only see
# one when the workers start before planning. A worker writes its pid, then sleeps so the wait is not a race it
# could win by finishing first.
SPEC = """
    import multiprocessing, os, time
    from pathlib import Path
    from flyship.compiler.spec import *
    from tests.compiler.tiny_frontend import TinyKernel

    MARKS = Path(os.environ["FLYSHIP_TEST_POOL_MARKS"])
    if multiprocessing.parent_process() is not None:  # a build worker
        (MARKS / f"worker-{os.getpid()}").write_text("")
        import atexit  # a worker ends without tearing its modules down, but after the exit handlers of what it ran
        atexit.register(lambda pid=os.getpid(): (MARKS / f"exited-{pid}").write_text(""))
    else:  # the build's own planning import
        end = time.monotonic() + float(os.environ.get("FLYSHIP_TEST_POOL_WAIT", "60"))
        while not any(MARKS.glob("worker-*")):
            if time.monotonic() > end:
                raise RuntimeError("no worker was importing the spec file while the build planned")
            time.sleep(0.02)
        if os.environ.get("FLYSHIP_TEST_POOL_FAIL"):
            raise RuntimeError("planning fails after the workers started")

    namespace("pool_ops")
    for k in range(3):
        op(f"vadd{k}", kernel=TinyKernel(), grid=("cdiv(a.numel, 64)",),
           args=[Tensor("a", rank=1), Tensor("b", rank=1), Output("c", like="a")],
           specs=[Spec("f32", dtypes={"a": "float32", "b": "float32"}, shapes={"a": (4096,), "b": (4096,)})])
"""


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    monkeypatch.setattr(frontends, "_REGISTRY", dict(frontends._registry()))
    frontends.register(importlib.import_module("tests.compiler.tiny_frontend").FRONTEND)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("FLYSHIP_TEST_POOL_MARKS", str(marks))
    spec = tmp_path / "pool_spec.py"
    spec.write_text(textwrap.dedent(SPEC))
    return spec, marks


def live_workers() -> list[int]:
    """This process's children but multiprocessing's resource tracker (which lives as long as this process)."""
    out = []
    for pid in children_of(__import__("os").getpid()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmd:
            out.append(pid)
    return out


def test_the_workers_import_the_spec_file_while_the_build_plans_and_then_compile_its_kernels(tiny, tmp_path):
    spec, marks = tiny
    opts = B.BuildOptions(spec_path=str(spec), out_dir=str(tmp_path / "out"), archs=("gfx942",), cache=False)
    rows = B.build(opts, progress=lambda line: None)
    assert sorted(r.op for r in rows) == ["vadd0", "vadd1", "vadd2"]
    assert sorted(o.name for o in M.read(tmp_path / "out").ops) == ["vadd0", "vadd1", "vadd2"]
    # -j 1: the one early worker compiled every kernel (three tasks are too few to pipeline: no second worker),
    # and it ran its exit handlers.
    (worker,) = [p.name.split("-")[1] for p in marks.glob("worker-*")]
    assert live_workers() == [] and (marks / f"exited-{worker}").exists()


def test_without_early_pools_the_planning_import_sees_no_worker(tiny, tmp_path, monkeypatch):
    """The check above can fail: with the pools started after planning, as before, the planning import waits in vain."""
    spec, _ = tiny
    monkeypatch.setenv("FLYSHIP_TEST_POOL_WAIT", "2")
    monkeypatch.setattr(executors, "early_pools", lambda *a, **k: __import__("contextlib").nullcontext())
    opts = B.BuildOptions(spec_path=str(spec), out_dir=str(tmp_path / "out"), archs=("gfx942",), cache=False)
    with pytest.raises(CompileError, match="no worker was importing the spec file while the build planned"):
        B.build(opts, progress=lambda line: None)


def test_a_build_that_fails_while_planning_stops_the_workers_it_started(tiny, tmp_path, monkeypatch):
    spec, marks = tiny
    monkeypatch.setenv("FLYSHIP_TEST_POOL_FAIL", "1")
    opts = B.BuildOptions(spec_path=str(spec), out_dir=str(tmp_path / "out"), archs=("gfx942",), cache=False)
    with pytest.raises(CompileError, match="planning fails after the workers started"):
        B.build(opts, progress=lambda line: None)
    assert list(marks.glob("worker-*")) and live_workers() == []
    assert not (tmp_path / "out").exists()


def test_an_early_pool_is_taken_only_when_its_workers_were_started_as_the_run_would_start_them(tiny, tmp_path):
    cfg = executors.worker_config(B.BuildOptions(spec_path=str(tiny[0]), out_dir=str(tmp_path / "o"),
                                                 archs=("gfx942",)), "gfx942", None, None, tmp_path, ("tiny",))
    with pools.start_early([cfg], tracing=1) as early:
        taken = early.take(cfg, 1, pipelined=False)  # a subset of its frontends, the rest equal: taken
        assert taken is not None and early.pools == {}
        taken.stop()  # a taken pool is the run's to stop
    with pools.start_early([cfg], tracing=1) as early:
        pool = early.pools[cfg.target]
        other = dataclasses.replace(cfg, keep_ir=not cfg.keep_ir)
        assert early.take(other, 1, pipelined=False) is None  # another configuration: stopped, not taken
        assert early.pools == {}
        with pytest.raises(RuntimeError):  # shut down
            pool.executor.submit(int)
    with pools.start_early([cfg], tracing=1) as early:
        assert early.take(cfg, 1, pipelined=True) is None  # early pools never pipeline
    with pools.start_early([cfg], tracing=1) as early:
        assert early.take(dataclasses.replace(cfg, frontends=("tiny", "elsewhere")), 1, pipelined=False) is None
    deadline = time.monotonic() + 10
    while live_workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_workers() == []


@pytest.mark.parametrize("tasks, per_pool, n_pools, n_cores, want", [
    (3, 1, 1, 16, False), (23, 1, 1, 16, False), (24, 1, 1, 16, True), (24, 24, 1, 64, False), (100, 4, 1, 16, True),
    (100, 1, 1, 2, False),  # -j 1 on 2 cores: the extra worker would share a core with the trace or the build
    (100, 1, 1, 3, True), (100, 2, 2, 6, False), (100, 2, 2, 7, True)])
def test_a_pool_pipelines_only_long_task_lists_with_a_core_to_spare(monkeypatch, tasks, per_pool, n_pools, n_cores,
                                                                     want):
    monkeypatch.setattr(pools, "cores", lambda: n_cores)
    assert pools.pipelines(tasks, per_pool, n_pools) is want


def test_an_early_pool_warms_no_more_workers_than_the_machine_has_cores(tiny, tmp_path):
    """-j 64 before planning: the build does not yet know it has three kernels, so it starts a core's worth."""
    import os

    cfg = executors.worker_config(B.BuildOptions(spec_path=str(tiny[0]), out_dir=str(tmp_path / "o"),
                                                 archs=("gfx942",), jobs=64), "gfx942", None, None, tmp_path, ("tiny",))
    with pools.start_early([cfg], tracing=64):
        assert 1 <= len(live_workers()) <= (os.cpu_count() or 1)
    deadline = time.monotonic() + 10
    while live_workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_workers() == []


def test_flyc_build_ends_without_teardown_but_after_every_exit_handler_with_mains_exit_code(tmp_path):
    """``flyc-build`` (compiler/cli.py: run) skips interpreter teardown: a build process's exit handlers (here one the
    spec file registers) still run, its output is flushed, and the exit code is the command's."""
    from ..conftest import run_build

    marks = tmp_path / "marks"
    marks.mkdir()
    spec = tmp_path / "exit_spec.py"
    spec.write_text(textwrap.dedent("""
        import atexit, multiprocessing, os
        from pathlib import Path
        from flyship.compiler.spec import *
        from tests.compiler.tiny_frontend import TinyKernel

        if multiprocessing.parent_process() is None:  # the build process
            atexit.register(lambda: (Path(os.environ["FLYSHIP_TEST_POOL_MARKS"]) / "build-exit").write_text("ran"))
        if os.environ.get("FLYSHIP_TEST_EXIT_FAIL"):
            raise RuntimeError("this spec file refuses to import")
        namespace("exit_ops")
        op("vadd", kernel=TinyKernel(), grid=("cdiv(a.numel, 64)",),
           args=[Tensor("a", rank=1), Tensor("b", rank=1), Output("c", like="a")],
           specs=[Spec("f32", dtypes={"a": "float32", "b": "float32"}, shapes={"a": (4096,), "b": (4096,)})])
    """))
    env = {"FLYSHIP_TEST_POOL_MARKS": str(marks)}
    r = run_build(spec, tmp_path / "out", ["gfx942"], env=env)
    assert r.returncode == 0 and f"wrote {tmp_path / 'out'}" in r.stdout and (marks / "build-exit").read_text() == "ran"
    (marks / "build-exit").unlink()
    r = run_build(spec, tmp_path / "out2", ["gfx942"], check=False, env={**env, "FLYSHIP_TEST_EXIT_FAIL": "1"})
    assert r.returncode == 1 and "this spec file refuses to import" in r.stderr
    assert (marks / "build-exit").read_text() == "ran"
    assert "console_scripts" in (Path(__file__).parents[2] / "setup.py").read_text()
    assert '"flyc-build=flyship.compiler.cli:run"' in (Path(__file__).parents[2] / "setup.py").read_text()


HOSTILE = """
    import multiprocessing, os, time
    from pathlib import Path
    from flyship.compiler.spec import *
    from tests.compiler.tiny_frontend import TinyKernel

    MARKS = Path(os.environ["FLYSHIP_TEST_POOL_MARKS"])
    MODE = os.environ.get("FLYSHIP_TEST_HOSTILE", "")
    if multiprocessing.parent_process() is not None:  # a build worker
        (MARKS / f"worker-{os.getpid()}").write_text("")
        if MODE == "die":
            os._exit(3)
        if MODE == "log":
            _LOG = open(MARKS / f"log-{os.getpid()}", "w")  # never closed, as a careless spec file does
            _LOG.write("written at import")
        if MODE == "hang":
            time.sleep(60)
        if MODE == "thread":  # a thread that is not a daemon and never ends
            import threading
            threading.Thread(target=time.sleep, args=(3600,), name="spec-thread").start()
        if MODE == "children":  # processes started and left running: one directly, one multiprocessing joins at exit
            import subprocess
            (MARKS / f"child-{subprocess.Popen(['sleep', '3600']).pid}").write_text("")
            kid = multiprocessing.get_context("fork").Process(target=time.sleep, args=(3600,))
            kid.start()
            (MARKS / f"child-{kid.pid}").write_text("")
            # and one detached: the shell that starts it exits at once, so it is nobody's child but a subreaper's
            detached = subprocess.run(["sh", "-c", "sleep 3600 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                      text=True, check=True).stdout.strip()
            (MARKS / f"child-{detached}").write_text("")
        if MODE == "tmp":  # temporary files left behind, by Python and by a native tool
            import subprocess, tempfile
            (MARKS / f"tmp-{os.getpid()}").write_text(tempfile.gettempdir())
            tempfile.mkstemp(prefix="left-by-spec-")
            subprocess.run(["mktemp", "left-by-tool-XXXXXX", "--tmpdir"], check=True, capture_output=True)
        if MODE == "late":  # a process started by an exit handler, after the pool listed the worker's children
            import atexit, subprocess
            atexit.register(lambda: (MARKS / f"child-{subprocess.Popen(['sleep', '3600']).pid}").write_text(""))
        if MODE == "die-child":  # a worker that dies leaves its child to whoever adopts it
            import subprocess
            (MARKS / f"child-{subprocess.Popen(['sleep', '3600']).pid}").write_text("")
            os._exit(3)
        if MODE == "stuck-exit":  # an exit handler that never returns
            import atexit
            atexit.register(time.sleep, 3600)
        if MODE == "main":  # did the worker run flyc-build's main module (the CLI) again?
            import sys
            ran = hasattr(sys.modules.get("__mp_main__"), "format_table")
            (MARKS / f"main-{os.getpid()}").write_text(str(ran))
    else:  # the build process: wait until a worker is importing, then give it time to act
        if MODE == "planning":  # processes the planning import starts, one of them detached
            import subprocess
            (MARKS / f"child-{subprocess.Popen(['sleep', '3600']).pid}").write_text("")
            detached = subprocess.run(["sh", "-c", "sleep 3600 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                      text=True, check=True).stdout.strip()
            (MARKS / f"child-{detached}").write_text("")
        end = time.monotonic() + 60
        while not any(MARKS.glob("worker-*")) and time.monotonic() < end:
            time.sleep(0.02)
        time.sleep(60 if MODE == "hang" else 0.5)

    namespace("hostile_ops")
    op("vadd", kernel=TinyKernel(), grid=("cdiv(a.numel, 64)",),
       args=[Tensor("a", rank=1), Tensor("b", rank=1), Output("c", like="a")],
       specs=[Spec("f32", dtypes={"a": "float32", "b": "float32"}, shapes={"a": (4096,), "b": (4096,)})])
"""


def _hostile_build(tmp_path: Path, mode: str, signal_after_marks: int | None = None):
    """flyc-build of the HOSTILE spec in its own session (so a signal reaches its whole group, as a terminal's
    Ctrl-C does); returns (returncode, stderr, marks folder, TMPDIR)."""
    import os
    import signal as _signal
    import subprocess

    from ..conftest import ROOT, need_flydsl_python

    py = need_flydsl_python("run flyc-build against a hostile spec file")
    marks, tmp = tmp_path / "marks", tmp_path / "tmp"
    marks.mkdir()
    tmp.mkdir()
    spec = tmp_path / "hostile_spec.py"
    spec.write_text(textwrap.dedent(HOSTILE))
    env = dict(os.environ, FLYSHIP_TEST_POOL_MARKS=str(marks), FLYSHIP_TEST_HOSTILE=mode, TMPDIR=str(tmp))
    proc = subprocess.Popen([py, "-m", "flyship.compiler.cli", str(spec), "-o", str(tmp_path / "out"), "--arch",
                             "gfx942", "--no-cache"], env=env, cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if signal_after_marks is not None:
            end = time.monotonic() + 60
            while not any(marks.glob("worker-*")) and time.monotonic() < end:
                time.sleep(0.05)
            time.sleep(1.0)  # the worker is inside its import now
            os.killpg(proc.pid, signal_after_marks)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, _signal.SIGKILL)
            proc.wait()
    return proc.returncode, err, marks, tmp


def _left_behind(marks: Path) -> list[int]:
    """Workers of the hostile builds (they wrote a mark named by their pid) still alive."""
    import os

    pids = [int(p.name.split("-")[1]) for p in marks.glob("worker-*")]
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}") and "Z" not in
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:1]]


def test_a_worker_that_dies_importing_the_spec_file_is_reported_as_such(tmp_path):
    """The early pool breaks before the run takes it: the build still reports, in its own words, that a worker died
    importing the spec file (not compiling a kernel), with its exit code and what to look for; no traceback."""
    code, err, marks, _ = _hostile_build(tmp_path, "die")
    assert code == 1, err
    assert ("vadd.f32 on gfx942: the worker process died while importing the spec file, before any kernel (the spec "
            "file or a module it imports ended the process; exit code 3)") in err, err
    assert "ended the worker process while it imported" in err and "Traceback" not in err
    assert _left_behind(marks) == [] and not (tmp_path / "out").exists()


def test_a_worker_flushes_the_files_its_modules_hold_open_when_it_ends(tmp_path):
    code, err, marks, _ = _hostile_build(tmp_path, "log")
    assert code == 0, err
    # The worker that compiled ended normally and flushed; an early worker stopped because this spec file registers
    # its own frontend (tests.compiler.tiny_frontend) was killed mid-way, and a killed process flushes nothing.
    assert "written at import" in {p.read_text() for p in marks.glob("log-*")}


@pytest.mark.parametrize("signum, want", [("SIGINT", 1), ("SIGTERM", 143)])
def test_ctrl_c_or_sigterm_while_the_workers_import_stops_them_quietly_and_cleans_up(tmp_path, signum, want):
    import signal as _signal

    code, err, marks, tmp = _hostile_build(tmp_path, "hang", getattr(_signal, signum))
    assert code == want, err
    assert "Traceback" not in err, err  # neither the build's nor a worker's
    assert _left_behind(marks) == []
    assert [p.name for p in tmp.iterdir()] == [], "the scratch folder (and the ROCm root inside it) is removed"
    assert not (tmp_path / "out").exists()


def test_flyc_builds_workers_do_not_run_its_main_module_again(tmp_path):
    """Spawn re-imports the parent's __main__ in each child; flyc-build's workers need none of the CLI, so the
    program hides it (compiler/cli.py: _workers_skip_main) and a worker starts ~0.2 s sooner."""
    code, err, marks, _ = _hostile_build(tmp_path, "main")
    assert code == 0, err
    seen = {p.read_text() for p in marks.glob("main-*")}
    assert seen == {"False"}, seen


def _alive(pids: list[int]) -> list[int]:
    from flyship.compiler import hygiene

    return [pid for pid in pids if hygiene.pid_alive(pid)]


def test_a_thread_the_spec_file_leaves_running_in_a_worker_does_not_hold_the_build(tmp_path):
    """A worker ends as flyc-build does: exit handlers, then no wait for threads (a non-daemon thread used to keep
    the worker, and the pool's shutdown, waiting forever)."""
    t0 = time.monotonic()
    code, err, marks, _ = _hostile_build(tmp_path, "thread")
    assert code == 0, err
    assert time.monotonic() - t0 < pools.EXIT_GRACE_S and "had not ended" not in err, err
    assert _left_behind(marks) == []


def test_processes_the_spec_file_leaves_running_in_a_worker_are_stopped_and_named(tmp_path):
    code, err, marks, _ = _hostile_build(tmp_path, "children")
    assert code == 0, err
    kids = [int(p.name.split("-")[1]) for p in marks.glob("child-*")]
    assert len(kids) >= 3  # the run's worker's three (an early worker's too, when it got that far before it was stopped)
    assert "left running after it ended: pid " in err and "(sleep)" in err, err
    assert "had not ended" not in err, err  # a forked child holding the worker's sentinel pipe is not the worker
    deadline = time.monotonic() + 5
    while _alive(kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive(kids) == [] and _left_behind(marks) == []


def test_a_worker_stuck_in_an_exit_handler_is_stopped_after_the_grace_period(tmp_path):
    code, err, marks, _ = _hostile_build(tmp_path, "stuck-exit")
    assert code == 0, err
    assert f"had not ended {pools.EXIT_GRACE_S:g} s after its last kernel" in err, err
    assert (tmp_path / "out" / "manifest.json").is_file() and _left_behind(marks) == []


def test_a_build_waiting_on_a_worker_says_what_it_waits_for(tiny, tmp_path, monkeypatch):
    """A worker whose spec import (or trace) never ends used to keep the build silent; now it says, every
    STALL_NOTICE_S, which kernels it still waits for and why it may be stuck."""
    spec, marks = tiny
    spec.write_text(spec.read_text().replace("namespace(", "if multiprocessing.parent_process() is not None:\n"
                                             "    time.sleep(1.5)\nnamespace(", 1))
    monkeypatch.setattr(executors, "STALL_NOTICE_S", 0.4)
    said: list[str] = []
    opts = B.BuildOptions(spec_path=str(spec), out_dir=str(tmp_path / "out"), archs=("gfx942",), cache=False)
    B.build(opts, progress=said.append)
    stalls = [line for line in said if "no kernel has finished for" in line]
    assert stalls and "3 to come: vadd0.f32 (gfx942), vadd1.f32 (gfx942), vadd2.f32 (gfx942)" in stalls[0], said
    assert "Ctrl-C stops it" in stalls[0] and live_workers() == []


def test_a_workers_temporary_files_live_in_the_builds_scratch_folder(tmp_path):
    """What a spec file or a tool (FlyDSL's linker when the worker is killed mid-link) leaves in the temp folder of a
    worker is inside the scratch folder, which the build removes (and the next build, after a kill -9)."""
    code, err, marks, tmp = _hostile_build(tmp_path, "tmp")
    assert code == 0, err
    seen = [Path(p.read_text()) for p in marks.glob("tmp-*")]
    assert seen and all(d.parent.parent == tmp and d.parent.name.startswith("flyc-build-") for d in seen), seen
    assert [p.name for p in tmp.iterdir()] == [], "the scratch folder, and what the workers left in it, is removed"


@pytest.mark.parametrize("mode, code", [("late", 0), ("die-child", 1), ("planning", 0)])
def test_no_process_outlives_flyc_build(tmp_path, mode, code):
    """flyc-build is a child subreaper and stops what still descends from it before it exits: a process a worker's
    exit handler started (after its pool listed the worker's children), the child of a worker that died, a process
    the planning import started, detached or not. One left would also hold the build's output open."""
    got, err, marks, _ = _hostile_build(tmp_path, mode)
    assert got == code, err
    kids = [int(p.name.split("-")[1]) for p in marks.glob("child-*")]
    assert kids, err
    assert "still running as the build ended" in err and "(sleep)" in err, err
    assert _alive(kids) == [] and _left_behind(marks) == []

