"""The lock a build holds on its output (``.<bundle>.flyc-build.lock`` beside it): one writer per output, a record of
who holds it; and the sweep, at a build's start, of what killed builds left (their scratch folders, staging siblings
and lock files; docs/compile-stage.md, "What a build leaves behind").

The lock is ``flock`` on the file, which the kernel releases when its holder dies, and the holder removes the file
while it still holds it (:func:`output_lock` says why that is safe). filelock, which the build cache and the loader
use, keeps its file on release; this lock must not, or every build would leave one beside its bundle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

from flyship.compiler import signals as _signals
from flyship.compiler.hygiene import SCRATCH_PREFIX, clean_stale, pid_alive, start_time
from flyship.errors import CompileError


def lock_path(out_dir: Path) -> Path:
    """The lock file a build into ``out_dir`` holds, beside it: ``.<name>.flyc-build.lock``."""
    return out_dir.with_name(f".{out_dir.name}.flyc-build.lock")


@contextlib.contextmanager
def output_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``.<name>.flyc-build.lock`` beside ``out_dir`` for a whole build (``flock``); a second build fails at
    once. The lock file is removed when the build ends, so a build leaves only the bundle.

    Removing a lock file is safe only with the check made here: the holder unlinks the file *while it still holds
    the lock*, and a build that locks a file checks, once it holds it, that the path still names that file; if it
    does not (the file was unlinked after this build opened it), it lets go and locks the path's new file. So two
    builds never hold locks on two different files of one path.

    Raises:
        CompileError: another build holds the lock, or the lock file cannot be created (e.g. the output's folder
            is not writable).
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    path = lock_path(out_dir)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise CompileError(f"flyc-build: cannot create the lock file {path}: {e.strerror}; choose an -o in a "
                               "folder you can write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(fd)
            try:
                if _holder_gone(fd) and os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False)):
                    os.unlink(path)  # left held by a process the killed build forked: the lock is this path's
                    continue
            except FileNotFoundError:  # removed meanwhile: lock the path's new file
                continue
            except OSError:
                pass  # cannot remove it: refused below, naming the holder
            finally:
                os.close(fd)
            who = f" ({holder})" if holder is not None else ""
            raise CompileError(f"flyc-build: expected to be the only build writing {out_dir}, but another "
                               f"flyc-build is writing it now{who}; wait for it to finish, or choose another "
                               f"-o") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:  # unlinked by the build that held it, and nothing new there yet
            same = False
        if same:
            with contextlib.suppress(OSError):  # who holds it, for the message of a build refused meanwhile
                os.ftruncate(fd, 0)
                os.pwrite(fd, _lock_record(), 0)
            break
        os.close(fd)  # our file was removed by the build before us after we opened it: lock the path's own file
    try:
        with _signals.on_abort(lambda: os.unlink(path)):  # still held: the process ends right after
            yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding the lock: see above
        os.close(fd)



def unlink_stale_lock(path: Path) -> bool:
    """Unlink the lock file ``path`` when no process holds it (a killed build's), or when the build that took it is
    gone (:func:`_holder_gone`): taken without waiting (or found held by no live process), checked to be the file
    the path names, unlinked."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not _holder_gone(fd):
                return False
        if os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False)):
            os.unlink(path)
            return True
        return False
    except OSError:  # gone meanwhile
        return False
    finally:
        os.close(fd)


_MAX_LOCK_RECORD = 4096


@dataclasses.dataclass(frozen=True)
class LockHolder:
    """What a build writes into the lock file it holds: its pid, host and start (clock ticks since boot, with the
    pid naming one process; and the wall-clock time, for people)."""

    pid: int
    host: str
    start: Optional[int]
    started: str

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}, since {self.started}"

    def gone(self) -> bool:
        """Whether the process that took the lock has ended: only answerable on its own host (False elsewhere); a
        live process with its pid but another start time is another process."""
        if self.host != socket.gethostname():
            return False
        if not pid_alive(self.pid):
            return True
        return self.start is not None and start_time(self.pid) not in (None, self.start)


def _lock_record() -> bytes:
    me = os.getpid()
    return json.dumps({"pid": me, "host": socket.gethostname(), "start": start_time(me),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, sort_keys=True).encode()


def lock_holder(fd: int) -> Optional[LockHolder]:
    """The holder recorded in the open lock file ``fd`` (read bounded, from its start); None when it holds no whole
    record (a flyship before round 4 wrote none; a build that has just taken the lock may not have written it yet)."""
    try:
        raw = os.pread(fd, _MAX_LOCK_RECORD + 1, 0)
        doc = json.loads(raw) if 0 < len(raw) <= _MAX_LOCK_RECORD else None
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or type(doc.get("pid")) is not int or doc["pid"] <= 0 \
            or not isinstance(doc.get("host"), str) or not isinstance(doc.get("started"), str) \
            or not (doc.get("start") is None or type(doc.get("start")) is int):
        return None
    return LockHolder(doc["pid"], doc["host"][:255], doc["start"], doc["started"][:64])


def _lockers(st: os.stat_result) -> Optional[set[int]]:
    """The pids the kernel names as holding a lock on the file ``st`` (``/proc/locks``: for ``flock``, the process
    that took it, even when only a child that inherited the descriptor still holds it); None where unreadable."""
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", "rb") as f:
            lines = f.read(1 << 22).decode(errors="replace").splitlines()
    except OSError:
        return None
    pids = set()
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == key:
            with contextlib.suppress(ValueError):
                pids.add(int(fields[4]))
    return pids


def _holder_gone(fd: int) -> bool:
    """Whether the lock file ``fd``, which some process holds, is held only because its build left it behind: the
    record names a process of this host that has ended, and the kernel names no live process as taking the lock
    (so never a build that has just taken it and not yet written its record). That happens when a process the build
    forked inherited the descriptor and outlived a ``kill -9``."""
    holder = lock_holder(fd)
    if holder is None or not holder.gone():
        return False
    pids = _lockers(os.fstat(fd))
    return pids is not None and all(not pid_alive(p) or p == holder.pid for p in pids if p > 0)


_STAGING = re.compile(r"^\..+\." + re.escape(SCRATCH_PREFIX) + r"(\d+)-")  # .<bundle>.flyc-build-<pid>-XXXX
_LOCK = re.compile(r"^\..+\.flyc-build\.lock$")  # .<bundle>.flyc-build.lock


def sweep_leftovers(out_dir: Path) -> list[Path]:
    """At the start of a build, before anything else: remove what killed builds left, whatever output they wrote
    and whether or not this build compiles anything (a build the cache answers never makes a scratch folder): the
    scratch folders ``<tmp>/flyc-build-<pid>-*`` and the staging siblings ``.<bundle>.flyc-build-<pid>-*`` (a killed
    ``--force`` included) beside ``out_dir`` whose owner process is gone, and the lock files
    ``.<bundle>.flyc-build.lock`` there that no process holds (taken, checked and unlinked while held, the protocol
    :func:`output_lock` keeps, so a build that is opening one meanwhile locks the path's
    new file).

    Returns:
        The paths removed.
    """
    removed = clean_stale(Path(tempfile.gettempdir()), SCRATCH_PREFIX)
    parent = out_dir.parent
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _STAGING.match(p.name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))) and p.is_dir() \
                and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
        elif _LOCK.match(p.name) and unlink_stale_lock(p):
            removed.append(p)
    return removed
