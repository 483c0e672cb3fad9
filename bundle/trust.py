"""File trust: which files a flyship process may run or read as its own, and bounded reads of them.

A file is trusted when nobody but the user (or root) could have written it: it is a regular file (not a link),
owned by the user or root, not writable by group or others, in a folder with the same properties. Under a
world-writable folder (``/tmp``) or a shared folder, anyone could have planted it; see docs/security.md.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from flyship.bundle import files

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def _owners() -> tuple[int, ...]:
    return (os.getuid(), 0)


def untrusted_reason(path: Path, *, kind: str = "file", group_ok: bool = False) -> str | None:
    """Why ``path`` (a regular file, or a folder when ``kind == "folder"``) and its folder cannot be trusted,
    or None when both are owned by the user or root and writable by no one else (``group_ok``: by no one outside
    the owner's group either, for a cache a team shares). Links are refused."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot stat it ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    want = stat.S_ISDIR if kind == "folder" else stat.S_ISREG
    if not want(st.st_mode):
        return f"it is not a {'folder' if kind == 'folder' else 'regular file'}"
    for what, s in ((kind, st), ("its folder", None)):
        if s is None:
            try:
                s = os.stat(Path(path).parent)
            except OSError as e:
                return f"cannot stat its folder ({e.strerror or e})"
        if s.st_uid not in _owners():
            return f"{what} is owned by uid {s.st_uid}, not by you (uid {os.getuid()}) or root"
        # A sticky folder (/tmp) lets others add files but not rename or delete ours: our own file stays ours.
        sticky_parent = what == "its folder" and s.st_mode & stat.S_ISVTX
        if s.st_mode & (stat.S_IWOTH if group_ok else _WRITABLE_BY_OTHERS) and not sticky_parent:
            return f"{what} is writable by group or others (mode {stat.S_IMODE(s.st_mode):o})"
    return None


def read_trusted(path: Path, limit: int, *, what: str, group_ok: bool = False) -> bytes:
    """The bytes of a trusted regular file, read once through one descriptor (no second open of the path) and at
    most ``limit`` bytes.

    Raises:
        PermissionError: the file or its folder is not trusted (:func:`untrusted_reason`), or it changed kind
            between the check and the open.
        ValueError: the file is larger than ``limit``.
    """
    why = untrusted_reason(path, group_ok=group_ok)
    if why is not None:
        raise PermissionError(f"{what}: refused {path}: {why}")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        writable = stat.S_IWOTH if group_ok else _WRITABLE_BY_OTHERS
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in _owners() or st.st_mode & writable:
            raise PermissionError(f"{what}: refused {path}: it changed after the check")
        if st.st_size > limit:
            raise ValueError(f"{what}: expected at most {limit} bytes, got {st.st_size} ({path})")
        data = files.read_fd(fd, limit)
        if len(data) > limit:
            raise ValueError(f"{what}: expected at most {limit} bytes, got more ({path})")
        return data
    finally:
        os.close(fd)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def path_reason(path: Path, *, group_ok: bool = False, _hops: int = 0) -> str | None:
    """Why some component of ``path`` (every folder from ``/`` down, and every symbolic link on the way, followed)
    could let another user swap what the path names, or None when none could; as ssh's StrictModes does for keys.

    Each folder and each link must be owned by the user or root; a folder writable by group or others (group: only
    without ``group_ok``) is accepted only when it is sticky (``/tmp``) and its next component is the user's or
    root's (others may add entries there, never rename or remove ours). The last component itself is not judged
    here (:func:`untrusted_reason` and the descriptor's ``fstat`` do that).
    """
    if _hops > 40:
        return "it passes through more than 40 symbolic links"
    parts = Path(os.path.abspath(path)).parts
    writable = stat.S_IWOTH if group_ok else _WRITABLE_BY_OTHERS
    current = Path(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            st_dir = os.lstat(current)
        except OSError as e:
            return f"cannot stat {current} ({e.strerror or e})"
        if st_dir.st_uid not in _owners():
            return f"the folder {current} on its path is owned by uid {st_dir.st_uid}, not by you or root"
        nxt = current / part
        if st_dir.st_mode & writable:
            try:
                child_uid = os.lstat(nxt).st_uid
            except OSError as e:
                return f"cannot stat {nxt} ({e.strerror or e})"
            last = i == len(parts) - 1  # the file itself: its owner is :func:`untrusted_reason`'s to judge
            if not (st_dir.st_mode & stat.S_ISVTX) or (child_uid not in _owners() and not last):
                return (f"the folder {current} on its path is writable by group or others (mode "
                        f"{stat.S_IMODE(st_dir.st_mode):o}), so another user could replace {part}")
        try:
            st = os.lstat(nxt)
        except OSError as e:
            return f"cannot stat {nxt} ({e.strerror or e})"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in _owners():
                return f"the link {nxt} on its path is owned by uid {st.st_uid}, not by you or root"
            try:
                target = os.readlink(nxt)
            except OSError as e:
                return f"cannot read the link {nxt} ({e.strerror or e})"
            rest = Path(*parts[i + 1:]) if i + 1 < len(parts) else Path()
            return path_reason(Path(os.path.join(current, target)) / rest, group_ok=group_ok, _hops=_hops + 1)
        current = nxt
    return None
