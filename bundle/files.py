"""File writes every part of flyship shares: all-or-nothing writes that a crash or a concurrent reader never sees half of."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


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
