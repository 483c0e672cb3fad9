"""File writes every part of flyship shares: all-or-nothing writes that a crash or a concurrent reader never sees half of."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a file"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


def found_at(path: Path | str) -> str:
    """What ``path`` names, in words for an error message ("found ..."): ``nothing``, ``a directory``, ``a file``,
    ``a character device``, ``a symlink loop``, ``a link to nothing``... Never raises."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a link to nothing" if os.path.islink(path) else "nothing"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink loop"
        if e.errno == errno.ENOTDIR:
            return "nothing (a folder on the path is a file)"
        return f"a path that cannot be examined ({e.strerror})"
    except ValueError:  # an embedded NUL byte
        return "an invalid path"
    return next((what for test, what in _KINDS if test(mode)), "an unknown kind of file")


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``, 4.7+); elsewhere
    set and restored at once (``os.umask`` has no read-only form)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place: readers see all or nothing.

    The file gets the mode any file the user writes gets, ``0o666 & ~umask`` (a temporary file is private, 0600,
    but a packed bundle, a manifest or a code object in a shared build cache is read by other users). The parent
    folder is created. On any error (also KeyboardInterrupt) the temporary file is removed and the error
    re-raised; ``path`` is then untouched.

    Returns:
        ``path`` as a Path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~umask())
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
