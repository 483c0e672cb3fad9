"""The file reads and writes every part of flyship shares.

Reads: :func:`read_regular` opens a path without blocking and reads it only when it is a regular file, under a
size limit (a FIFO, ``/dev/zero``, a folder or a device is refused at once); :func:`parse_json` turns bytes into
JSON data under a nesting-depth limit (checked before the parser recurses), refusing NaN/Infinity, a key twice in
one object and unpaired surrogates; :func:`read_json` is both. Every JSON input flyship reads (manifest, pack index
and signature, tuning tables, the hook's patches file, prebuilt-extension records, build-cache entries, the
importers' files) goes through them, and its reader then checks the type and range of every value it uses. Writes: :func:`atomic_write`, all or
nothing, so a crash or a concurrent reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from flyship.bundle import limits as _limits
from flyship.errors import BundleError, FlyshipError

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
    import tempfile  # here: the start-up hook imports this module for its reads, at every interpreter start

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


# -- bounded reads -----------------------------------------------------------------------------------------------

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


def read_fd(fd: int, limit: int, size: int | None = None) -> bytes:
    """Up to ``limit + 1`` bytes from an open file: one more than allowed, so the caller tells a file that grew past
    ``limit`` since its size was checked from one that did not (the one bounded read loop of flyship's readers).

    ``size``: the regular file's size from ``fstat``, when known: the whole file is then read in one call of
    ``size + 1`` bytes (a regular file gives fewer than asked only at its end), with no copies joined; an 8 MB
    manifest cost nine 1 MiB reads and a join before. A file that grew since is read on to ``limit + 1``."""
    chunks, left = [], limit + 1
    if size is not None and size < limit:
        first = os.read(fd, size + 1)
        if len(first) <= size:
            return first
        chunks, left = [first], left - len(first)
    while left > 0:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def read_regular(path: Path | str, limit: int, *, what: str, error: type[FlyshipError] = BundleError,
                 hint: str = "", expected: str = "a regular file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, read through one descriptor.

    The path is opened with ``O_NONBLOCK`` and examined with ``fstat`` before anything is read: a named pipe (which
    would block until a writer comes), a character device (``/dev/zero`` never ends), a folder or a socket is
    refused at once, and a file over ``limit`` bytes is refused from its size (and again if it grows while read).

    Args:
        path: the file (a symbolic link is followed: the file it names is what is checked and read).
        limit: the most bytes the caller accepts.
        what: the operation, for messages (``"tuning table"``, ``"read bundle"``).
        error: the flyship exception class to raise (:class:`~flyship.errors.BundleError` by default).
        hint: what to do, appended to each message.
        expected: what should be at ``path``, in words (``"a manifest"``).

    Returns:
        The file's bytes.

    Raises:
        error: ``<what>: expected <expected> at <path>, found <what is there>; <hint>`` (missing, unreadable, not a
            regular file), or larger than ``limit``.
    """
    hint = f"; {hint}" if hint else ""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        found = found_at(path)
        why = f" ({e.strerror})" if isinstance(e, OSError) and e.strerror and found.startswith(("a file", "a dir")) \
            else ""
        raise error(f"{what}: expected {expected} at {path}, found {found}{why}{hint}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((w for test, w in _KINDS if test(st.st_mode)), "an unknown kind of file")
            raise error(f"{what}: expected {expected} at {path}, found {kind}{hint}")
        if st.st_size > limit:
            raise error(f"{what}: expected at most {limit} bytes at {path}, got {st.st_size}{hint}")
        data = read_fd(fd, limit, st.st_size)
    except OSError as e:
        raise error(f"{what}: expected {expected} at {path}, got a read error ({e.strerror or e}){hint}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{what}: expected at most {limit} bytes at {path}, got more (it grew while read){hint}")
    return data


# The depth scan works on the brackets outside strings alone, with C-speed string operations only.
_KEEP_BRACKETS = str.maketrans("", "", "".join(chr(i) for i in range(128) if chr(i) not in "[]{}"))
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_RUN = re.compile(r"[\[{]+|[\]}]+")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def json_depth_exceeds(text: str, depth: int) -> bool:
    """Whether the JSON ``text`` nests arrays / objects more than ``depth`` deep, found without recursion.

    Escapes are dropped first (``\\\\`` then ``\\"``: JSON pairs a backslash with the next character, left to
    right, as ``str.replace`` does), so splitting at ``"`` leaves the text outside strings at the even places;
    of that only the brackets are kept, and the level is followed run by run (``[[{`` then ``]}``...): a 47 KB
    manifest costs about a millisecond, 100,000 ``[`` one run. For text that is not JSON the answer may be either;
    the parser refuses that text anyway.
    """
    outside = "".join(text.replace("\\\\", "").replace('\\"', "").split('"')[::2])
    brackets = outside.translate(_KEEP_BRACKETS)
    if not brackets.isascii():  # characters JSON never has outside strings: drop them too
        brackets = _NOT_BRACKET.sub("", brackets)
    level = 0
    for run in _RUN.findall(brackets):
        if run[0] in "[{":
            level += len(run)
            if level > depth:
                return True
        else:
            level -= len(run)
    return False


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {dup[:60]!r} appears twice in one object")
    return out


def _unpaired_surrogate_at(data: Any) -> str:
    """The JSON path (``.ops[0].doc``) of the first string or key in ``data`` that is not valid Unicode."""
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return where or "the value"
        elif isinstance(v, dict):
            for k, x in v.items():
                todo += [(f"{where} key", k), (f"{where}.{k[:40]}", x)]
        elif isinstance(v, list):
            todo += [(f"{where}[{i}]", x) for i, x in enumerate(v)]
    return "a string"


def parse_json(data: bytes, *, what: str, error: type[FlyshipError] = BundleError, hint: str = "",
               depth: int = _limits.MAX_JSON_DEPTH, limit: int | None = None) -> Any:
    """JSON data from ``data``: UTF-8 (a BOM refused), strict JSON (no NaN / Infinity literals, no integer of more
    than 4300 digits, no key twice in one object), nested at most ``depth`` deep, at most ``limit`` bytes when
    given. The caller checks the types and ranges of what it uses (a number beyond the float range, ``1e400``,
    reads as ``inf``: a reader that wants finite floats says so naming the field).

    Raises:
        error: naming ``what`` and what is wrong, with ``hint`` (what to do) appended.
    """
    hint = f"; {hint}" if hint else ""
    if limit is not None and len(data) > limit:
        raise error(f"{what}: expected at most {limit} bytes, got {len(data)}{hint}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} is not UTF-8 text: expected UTF-8 JSON, got {e.reason} at byte {e.start}{hint}") \
            from None
    if json_depth_exceeds(text, depth):
        raise error(f"{what} is not valid JSON: expected arrays and objects nested at most {depth} deep, got "
                    f"deeper{hint}")
    try:
        data = json.loads(text, parse_constant=_constant, object_pairs_hook=_unique_keys)
        if _SURROGATE_ESCAPE.search(text):  # a pair is one character; a lone half is no text at all
            json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{what}: {_unpaired_surrogate_at(data)}: the string holds an unpaired surrogate escape "
                    f"(\\ud800-\\udfff); expected valid Unicode text{hint}") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, the checks above, an int of > 4300 digits
        raise error(f"{what} is not valid JSON ({str(e)[:200]}){hint}") from None
    return data


def read_json(path: Path | str, limit: int, *, what: str, error: type[FlyshipError] = BundleError, hint: str = "",
              depth: int = _limits.MAX_JSON_DEPTH) -> Any:
    """:func:`read_regular` then :func:`parse_json`: the JSON data of a regular file of at most ``limit`` bytes.

    Raises:
        error: the file is missing, not a regular file, too large, not UTF-8 JSON or nested too deep.
    """
    data = read_regular(path, limit, what=what, error=error, hint=hint)
    return parse_json(data, what=f"{what} {path}", error=error, hint=hint, depth=depth)
