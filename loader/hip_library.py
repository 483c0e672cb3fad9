"""The HIP runtime library the HIP flavor opens on first use (csrc/driver_hip.cpp), named when it is built.

The extension does not link libamdhip64 (no ``DT_NEEDED``): loading the 14 MB runtime and its dependencies (HSA,
libdrm, libelf, numa) cost a load 10-17 ms on a machine where no op ever reaches a GPU (a CPU-only run, the
recording driver, a load that only registers ops). The shim ``dlopen``\\ s it at the first device query or code
object load instead, by the names this module gives at build time (:func:`names`): the library's own ``DT_SONAME``
(what a link would have recorded in ``DT_NEEDED``) and its file name. The rpath to the folder it was found in is
kept, so the runtime is found where the link would have found it; a runtime already in the process (ROCm torch's
own copy) is taken first (``RTLD_NOLOAD``): two HIP runtimes in one process are a bug.
"""

from __future__ import annotations

import re
from pathlib import Path

from flyship.errors import LoadError

BASENAME = "libamdhip64"
# What the C++ side may receive: a plain library file name (it travels as preprocessor tokens, see cflag()).
_SAFE = re.compile(r"[A-Za-z][A-Za-z0-9_]*\.so(\.[0-9]+)*")


def find(folders: list[Path]) -> tuple[Path, list[str]]:
    """The first ``libamdhip64.so*`` in ``folders`` (the shortest name in a folder: the link name before a versioned
    one), and the patterns tried.

    Raises:
        LoadError: none found; lists every pattern tried and what to install.
    """
    import glob

    tried: list[str] = []
    for d in folders:
        pattern = str(d / f"{BASENAME}.so*")
        tried.append(pattern)
        found = sorted(glob.glob(pattern), key=len)
        if found:
            return Path(found[0]), tried
    raise LoadError(f"build flyship extension (hip): expected {BASENAME}.so, found none; tried " + ", ".join(tried)
                    + "; install ROCm (or Debian's libamdhip64-dev) or set FLYSHIP_HIP_PATH to its root")


def soname(library: Path) -> str | None:
    """The ``DT_SONAME`` of the shared library ``library``, or None when it has none (or is no ELF file)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with open(library, "rb") as f:
            for sec in ELFFile(f).iter_sections():
                if isinstance(sec, DynamicSection):
                    for tag in sec.iter_tags():
                        if tag.entry.d_tag == "DT_SONAME":
                            return str(tag.soname)
    except (OSError, ELFError):
        return None
    return None


def names(library: Path) -> tuple[str, ...]:
    """The names the shim tries, in order: ``library``'s soname (``libamdhip64.so.5``), then its file name
    (``libamdhip64.so``); each only when it is a plain library file name."""
    out: list[str] = []
    for name in (soname(library), library.name):
        if name and _SAFE.fullmatch(name) and name not in out:
            out.append(name)
    return tuple(out) or (f"{BASENAME}.so",)


def cflag(library_names: tuple[str, ...]) -> str:
    """The compiler flag that hands the names to csrc/driver_hip.cpp: ``-DFLYSHIP_HIP_LIBRARY=a.so.5:a.so``, read
    there with the preprocessor's ``#`` (no quotes to survive ninja and the shell).

    Raises:
        ValueError: a name that is not a plain library file name (a bug: :func:`names` gives only such).
    """
    bad = [n for n in library_names if not _SAFE.fullmatch(n)]
    if bad or not library_names:
        raise ValueError(f"HIP library names: expected plain file names like {BASENAME}.so.6, got {bad or 'none'}")
    return "-DFLYSHIP_HIP_LIBRARY=" + ":".join(library_names)
