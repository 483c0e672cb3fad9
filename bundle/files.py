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


def atomic_write(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place: readers see all or nothing.

    The parent folder is created. On any error (also KeyboardInterrupt) the temporary file is removed and the
    error re-raised; ``path`` is then untouched.

    Returns:
        ``path`` as a Path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
