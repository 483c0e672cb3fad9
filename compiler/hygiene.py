"""Build hygiene: what a ``flyc-build`` run leaves behind when it ends, fails or is killed.

Guarantees (docs/compile-stage.md, "What a build leaves behind"):

* Worker processes die with the build process, even on ``kill -9``: each worker asks the kernel for
  ``SIGKILL`` when its parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux) and also runs a watchdog thread
  that polls its parent (every platform). The multiprocessing resource tracker exits by itself once the
  build and its workers are gone (it reads its pipe until every writer has closed it).
* A worker also ends when its pool is done with it, whatever the spec file started there: it runs the exit
  handlers and leaves without waiting for threads (``worker._end_worker``), as flyc-build itself does; a worker
  still running :data:`flyship.compiler.pools.EXIT_GRACE_S` later is killed, and so is every process a worker
  started that outlives it, detached ones included (:func:`adopt_orphans`, :func:`descendants`,
  :func:`stop_processes`); the build says which. ``flyc-build`` itself is a child subreaper too and, before it
  exits, stops whatever still descends from it (:func:`sweep_descendants`: a process a worker's exit handler
  started, one a dead worker left, one the planning import started).
* Scratch folders are named ``flyc-build-<pid>-*`` in the temp dir; a build removes those whose owner
  process is dead (left by a killed build) before it starts. The same holds for the half-written sibling
  folders ``.<bundle>.flyc-build-<pid>-*`` next to the output.
* ``--force`` swaps the new bundle in atomically (``renameat2(RENAME_EXCHANGE)`` on Linux); where the
  kernel or file system cannot exchange, two renames with a window between them, after which a later
  build restores the old bundle if a crash fell in that window.
* Concurrent builds into one path: the first holds a file lock next to the output and writes its pid, host and
  start time into it; the others fail at once, naming it. The lock file is removed when the build ends
  (:mod:`flyship.compiler.outlock` says why that is safe).
* What a killed build leaves (its scratch folder, its staging siblings, a ``--force``'s included, its lock file) the
  next build removes first, whatever its output, once the owner is gone
  (:func:`flyship.compiler.outlock.sweep_leftovers`); a lock file still held by a process the killed build forked
  counts as gone when its record names a process of this host that has ended and the kernel names no live process
  as its locker.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import ctypes.util
import errno
import io
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping, NoReturn, Optional

from flyship.compiler import signals as _signals

SCRATCH_PREFIX = "flyc-build-"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_RENAME_EXCHANGE = 2  # <linux/fs.h>
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}  # for C libraries without the renameat2() wrapper (glibc < 2.28)
_AT_FDCWD = -100


def _prctl(option: int, arg: int) -> None:
    """``prctl(option, arg)`` on Linux; nothing elsewhere, or where the C library has no prctl."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(option, arg, 0, 0, 0)
        except (OSError, AttributeError):
            pass


# --- workers die with the build ----------------------------------------------------------------------------------

def die_with_parent(parent_pid: int, poll_s: float = 1.0) -> None:
    """Make this (worker) process end when ``parent_pid`` does; call first thing in the worker.

    On Linux the kernel sends SIGKILL when the parent dies (``PR_SET_PDEATHSIG``), even while this process
    is inside native code holding the GIL. Everywhere, a daemon thread also polls ``os.getppid()`` and kills
    this process once it no longer equals ``parent_pid`` (the death signal is tied to the parent *thread*
    that started us, and is not inherited across platforms). If the parent is already gone, exits at once.
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # where it cannot, the watchdog below still applies
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os.kill(os.getpid(), signal.SIGKILL)

    def watch() -> None:
        while True:
            threading.Event().wait(poll_s)
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="flyship-parent-watchdog", daemon=True).start()


# --- processes a worker leaves -----------------------------------------------------------------------------------

def _proc_stat(pid: int, zombies: bool = False) -> Optional[tuple[int, int]]:
    """(parent pid, start time in clock ticks) of a live process, read from /proc; None when it is gone, a zombie
    (unless ``zombies``), or unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return None if fields[0] in ("Z", "X") and not zombies else (int(fields[1]), int(fields[19]))
    except (OSError, ValueError, IndexError):
        return None


_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def adopt_orphans() -> None:
    """Make this (worker) process the parent of every orphan among its descendants (``PR_SET_CHILD_SUBREAPER``,
    Linux >= 3.4): a process the spec file starts and detaches (``sleep 1 &`` in a shell that exits, a daemon's
    double fork) stays a descendant of the worker, where :func:`descendants` finds it, instead of passing to init."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # where it cannot, orphans pass to init, as without this


def start_time(pid: int) -> Optional[int]:
    """When a live process started (clock ticks since boot: with the pid, it names one process); None when it is
    gone or a zombie."""
    st = _proc_stat(pid)
    return None if st is None else st[1]


def descendants(pids: list[int]) -> dict[int, int]:
    """Every live descendant of ``pids`` (children, theirs, ...; not ``pids`` themselves) as pid -> start time, so
    that :func:`stop_processes` later signals only these processes, never one that reused a pid meanwhile. Empty
    where /proc cannot be read."""
    if not pids:
        return {}
    children: dict[int, list[tuple[int, int]]] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return {}
    # Zombies are walked through, not returned: a process that is exiting still parents the children it forked
    # until the kernel hands them on, and they would be missed in that moment.
    for name in entries:
        st = _proc_stat(int(name), zombies=True)
        if st is not None:
            children.setdefault(st[0], []).append((int(name), st[1]))
    seen: dict[int, int] = {}
    frontier = list(pids)
    while frontier:
        nxt = [(c, start) for p in frontier for c, start in children.get(p, ()) if c not in seen]
        seen.update(nxt)
        frontier = [c for c, _ in nxt]
    return {pid: start for pid, start in seen.items() if _proc_stat(pid) is not None}


# flyship's own tool processes (llvm-mc, ld.lld, clang-offload-bundler, the toolchain's probes) are started with this
# variable in their environment (:func:`tool_env`), so a process a sweep finds is told apart by how it was started,
# never by its name: a spec file's processes inherit the worker's environment, which does not hold it.
TOOL_MARK = "FLYSHIP_TOOL_PROCESS"
_MAX_ENVIRON_BYTES = 1 << 20


def tool_env(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The environment to start one of flyship's own tools with: ``environ`` (default: this process's) and
    :data:`TOOL_MARK`."""
    out = dict(os.environ if environ is None else environ)
    out[TOOL_MARK] = "1"
    return out


def is_tool_process(pid: int) -> bool:
    """Whether ``pid`` was started by flyship as one of its tools (:func:`tool_env`; a process a tool starts inherits
    it). Read from ``/proc/<pid>/environ`` (the environment it was started with), bounded; False where unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read(_MAX_ENVIRON_BYTES)
    except OSError:
        return False
    return f"{TOOL_MARK}=1".encode() in data.split(b"\0")


@dataclasses.dataclass(frozen=True)
class Stopped:
    """A process :func:`stop_processes` stopped: its pid, its name, and whether it was one of flyship's own tools."""

    pid: int
    name: str
    tool: bool

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.name})"


def stop_processes(found: dict[int, int]) -> list[Stopped]:
    """SIGKILL each process of ``found`` (pid -> start time, from :func:`descendants`) that still runs with that start
    time; returns each one stopped (``str()``: ``pid N (name)``), saying which were flyship's own tools."""
    stopped = []
    for pid, start in found.items():
        st = _proc_stat(pid)
        if st is None or st[1] != start:
            continue  # gone, or its pid now belongs to another process
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            name = "?"
        tool = is_tool_process(pid)  # read before the kill: /proc forgets it
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        stopped.append(Stopped(pid, name, tool))
    return stopped


def _is_resource_tracker(pid: int) -> bool:
    try:
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (/proc/<pid>/task/*/children), zombies included; [] where the kernel does not say."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    except (OSError, ValueError):
        pass
    return out


def sweep_descendants(seconds: float = 2.0) -> list[Stopped]:
    """At the end of the build process: stop every process still descending from it (it is a child subreaper,
    :func:`adopt_orphans`, so what a worker's exit handler started, what a dead worker left, what the planning import
    started and detached are all here) but multiprocessing's resource tracker, which leaves by itself once its pipe
    closes. In rounds, for up to ``seconds``, until two a moment apart find nothing (a process that exits hands its
    children on as it goes): its own children by pid at once (a child's pid cannot pass to another process before
    this one reaps it), deeper ones by pid and start time. A process that forks and exits every few milliseconds
    can still slip between rounds. Returns each one stopped."""
    me, stopped, quiet = os.getpid(), [], 0
    end = time.monotonic() + seconds
    while quiet < 2 and time.monotonic() < end:
        found = stop_processes({pid: start_time(pid) or 0 for pid in _children(me) if not _is_resource_tracker(pid)})
        found += stop_processes({pid: t for pid, t in descendants([me]).items() if not _is_resource_tracker(pid)})
        stopped += found
        quiet = 0 if found else quiet + 1
        if not found:
            time.sleep(0.005)
    return stopped


def release_semaphores() -> None:
    """Unlink and unregister this process's multiprocessing semaphores (its pools' queues) as their finalizers do at
    an ordinary exit, for an exit that skips them (``os._exit`` in :mod:`flyship.compiler.signals`): else the resource
    tracker unlinks them and prints "There appear to be 5 leaked semaphore objects" on the build's stderr."""
    from multiprocessing import synchronize, util

    for finalizer in list(getattr(util, "_finalizer_registry", {}).values()):
        if getattr(finalizer, "_callback", None) is synchronize.SemLock._cleanup:
            with contextlib.suppress(Exception):
                finalizer()


# --- scratch folders ---------------------------------------------------------------------------------------------

def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (a zombie counts as dead; another user's process as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent has not reaped it yet
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return True


def _owner(name: str, prefix: str) -> Optional[int]:
    m = re.match(re.escape(prefix) + r"(\d+)(?:-|$)", name)
    return int(m.group(1)) if m else None


def clean_stale(folder: Path, prefix: str) -> list[Path]:
    """Remove the entries of ``folder`` named ``<prefix><pid>-...`` whose owner process is dead.

    Returns:
        The paths removed.
    """
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for p in entries:
        pid = _owner(p.name, prefix)
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
        removed.append(p)
    return removed


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A private scratch folder ``<tmp>/flyc-build-<pid>-XXXX``, removed on exit; first removes the scratch
    folders of dead builds (a ``kill -9`` leaves its scratch behind)."""
    tmp = Path(tempfile.gettempdir())
    clean_stale(tmp, SCRATCH_PREFIX)
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=tmp))
    try:
        with _signals.on_abort(lambda: shutil.rmtree(path, ignore_errors=True)):
            yield path
    finally:
        # Whole, even when SIGTERM or Ctrl-C arrives meanwhile (it is handled right after): a removal cut short
        # leaves a half-removed folder (1 of 50 SIGTERMs at random points of a build did, issue 32).
        with _signals.deferred():
            shutil.rmtree(path, ignore_errors=True)


def staging_prefix(out_dir: Path) -> str:
    """Name prefix of the sibling folders a build writes a bundle into before it moves into ``out_dir``."""
    return f".{out_dir.name}.{SCRATCH_PREFIX}"


def old_prefix(out_dir: Path) -> str:
    """Name prefix under which the two-rename fallback parks the replaced bundle."""
    return f".{out_dir.name}.old-"


def recover_output(out_dir: Path) -> None:
    """Before a build into ``out_dir``: remove half-written staging folders of dead builds, and undo a
    two-rename replacement that a crash interrupted (put the old bundle back if nothing took its place)."""
    parent = out_dir.parent
    clean_stale(parent, staging_prefix(out_dir))
    try:
        parked = [p for p in parent.iterdir() if _owner(p.name, old_prefix(out_dir)) is not None]
    except OSError:
        return
    for p in parked:
        pid = _owner(p.name, old_prefix(out_dir))
        if pid == os.getpid() or pid_alive(pid):
            continue
        if not out_dir.exists():
            p.rename(out_dir)
        else:
            shutil.rmtree(p, ignore_errors=True)


# --- atomic replacement ------------------------------------------------------------------------------------------

def _renameat2_exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(..., RENAME_EXCHANGE)``); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return False
    args = (_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        rc = fn(ctypes.c_int(args[0]), ctypes.c_char_p(args[1]), ctypes.c_int(args[2]), ctypes.c_char_p(args[3]),
                ctypes.c_uint(args[4]))
    else:
        nr = _SYS_RENAMEAT2.get(os.uname().machine)
        if nr is None:
            return False
        rc = libc.syscall(ctypes.c_long(nr), ctypes.c_int(args[0]), ctypes.c_char_p(args[1]),
                          ctypes.c_int(args[2]), ctypes.c_char_p(args[3]), ctypes.c_uint(args[4]))
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False  # old kernel, or a file system that cannot exchange: the caller falls back
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def replace_dir(new: Path, out_dir: Path, exchange: bool = True) -> str:
    """Move the folder ``new`` to ``out_dir``, replacing what is there.

    With ``exchange`` (Linux), the two are swapped in one ``renameat2(RENAME_EXCHANGE)``: ``out_dir`` always
    holds a whole bundle, the old one or the new one. Without it (or where the file system refuses), the old
    bundle is first parked as ``.<name>.old-<pid>`` and the new one renamed into place; a crash between the
    two renames leaves ``out_dir`` absent, and the next build into it (:func:`recover_output`) moves the old
    bundle back.

    Returns:
        ``"rename"`` (nothing was there), ``"exchange"`` or ``"two-renames"``.
    """
    if not out_dir.exists() and not out_dir.is_symlink():
        new.rename(out_dir)
        return "rename"
    if exchange and _renameat2_exchange(new, out_dir):
        with _signals.deferred():  # whole, or the old bundle stays as a staging sibling until the next build
            shutil.rmtree(new, ignore_errors=True)  # ``new`` now names the old bundle
        return "exchange"
    old = out_dir.with_name(f"{old_prefix(out_dir)}{os.getpid()}")
    out_dir.rename(old)
    new.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return "two-renames"


def end_process(status: int) -> NoReturn:
    """End this process now with ``status``, without interpreter teardown (the caller has run the exit handlers
    that matter): the standard streams and every open file a module holds at top level (``_LOG = open(...)`` in a
    spec file) are flushed first, as teardown would have; files held deeper are the holder's to close."""
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            if issubclass(type(value), io.IOBase):  # type(), not isinstance: a proxy's __class__ may warn or raise
                try:
                    if not value.closed:
                        value.flush()
                except Exception:  # noqa: BLE001 - a file that cannot be flushed (closed pipe, read-only): as teardown
                    pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: nothing more can be said on it
            pass
    os._exit(status)


# -- a lone worker's stderr, through steps that move file descriptor 2 ---------------------------------------------
#
# A lone worker writes fd 2 to a file the build reads when it dies (executors._run_alone). A step that moves fd 2
# elsewhere for a while (FlyDSL's binary step, whose ISA the frontend reads from stderr: flydsl/capture.py) writes
# into a named file beside it instead of an anonymous one, so a native abort inside that step (LLVM's fatal errors
# print ``LLVM ERROR: ...`` and abort) leaves its words where the build looks.

_STDERR_FILE: list[str] = []  # the lone worker's stderr file, once set (a list: no global statement)

STEP_SUFFIX = ".step"


def set_stderr_file(path: str) -> None:
    """Record the file this (lone worker) process's fd 2 writes to."""
    _STDERR_FILE[:] = [path]


def step_stderr_file() -> str | None:
    """Where a step that moves fd 2 should write, so a crash inside it is read (None: no lone worker's file)."""
    return _STDERR_FILE[0] + STEP_SUFFIX if _STDERR_FILE else None
