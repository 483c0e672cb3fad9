"""Find the LLVM tools that turn FlyDSL's ISA into code objects, prove they know the targets, and lay
out the ROCm-shaped root FlyDSL's own link step wants.

Search order (the first folder that has both ``llvm-mc`` and ``ld.lld`` wins):

1. an explicit folder (``flyc-build --llvm-bin DIR``), or else ``$FLYSHIP_LLVM_BIN``: when either is
   given, it is the only place looked at (a named folder that lacks the tools is an error, never a
   silent fallback to another LLVM);
2. ``$ROCM_PATH/llvm/bin``, ``/opt/rocm/llvm/bin``;
3. versioned Debian/Ubuntu installs ``/usr/lib/llvm-N/bin``, newest first;
4. each folder on ``$PATH``;
5. PyPI's ``ziglang`` wheel in this Python: its ``zig clang`` assembles (``zig clang -target
   amdgcn-amd-amdhsa-unknown -mcpu=... -c -x assembler``; never ``zig cc``, which adds
   ``:sramecc-:xnack-`` to the target ID) and ``zig ld.lld`` links. It has no clang-offload-bundler.

Tool facts (verified, see FIELD-NOTES): ``llvm-mc`` only *warns* ("'gfx950' is not a recognized
processor for this target (ignoring processor)") and exits 0 on an unknown ``-mcpu``, so the target
check assembles an ``.amdgcn_target`` directive, which fails for a processor the assembler does not know.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from flyship import env
from flyship.compiler import hygiene as _hygiene
from flyship.errors import CompileError

REQUIRED_TOOLS = ("llvm-mc", "ld.lld")
OPTIONAL_TOOLS = ("clang-offload-bundler", "llvm-objdump", "llvm-readelf")
# Where the AMDGPU device libraries (ocml.bc, ockl.bc, oclc_*.bc) live when ROCM_PATH names no root.
SYSTEM_BITCODE_DIRS = ("/opt/rocm/amdgcn/bitcode", "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")
SYSTEM_BITCODE_GLOBS = ("/usr/lib/llvm-*/lib/clang/*/lib/amdgcn/bitcode",)
# Triple used for probes; the environment component ("unknown") is what FlyDSL >= 0.3.1 writes.
PROBE_TRIPLE = "amdgcn-amd-amdhsa-unknown"
_UNKNOWN_PROCESSOR = "is not a recognized processor"
_VERSION_RE = re.compile(r"(?:version|LLD)\s+(\d+(?:\.\d+)+[\w.+~-]*)")

INSTALL_HINT = (
    "install LLVM with the AMDGPU target, one of: Debian/Ubuntu `apt-get install llvm-22 lld-22 clang-22` "
    "(Debian 12: from bookworm-security; clang-22 brings clang-offload-bundler), then --llvm-bin "
    "/usr/lib/llvm-22/bin; ROCm (its LLVM in /opt/rocm/llvm/bin, package rocm-llvm); or `pip install ziglang` "
    "(clang + ld.lld in a wheel, no offload bundler); or pass --llvm-bin DIR / set FLYSHIP_LLVM_BIN to a folder "
    "holding llvm-mc and ld.lld"
)
NEWER_LLVM_HINT = (
    "use an LLVM that knows it: Debian 12 `apt-get install llvm-22 lld-22 clang-22` from bookworm-security, "
    "then --llvm-bin /usr/lib/llvm-22/bin; or a ROCm whose /opt/rocm/llvm/bin knows the processor; "
    "or `pip install ziglang` (clang 22) in the build Python"
)


class ToolchainError(CompileError, RuntimeError):
    """A tool is missing, too old for a target, or failed; the message names the tool, its version and
    path, what it was doing, and what to do."""


@dataclasses.dataclass(frozen=True)
class Tool:
    """One tool: how to run it and which version it is.

    Attributes:
        name: the tool's name as the manifest records it: ``llvm-mc``, ``ld.lld``, ``clang-offload-bundler``,
            ``llvm-objdump``, ``llvm-readelf``, or ``zig clang`` / ``zig ld.lld``.
        argv: the command prefix, e.g. ``("/usr/lib/llvm-22/bin/llvm-mc",)`` or ``("/.../zig", "clang")``.
        version: the version from ``--version`` (``"22.1.8"``), or its first line when no number is found.
    """

    name: str
    argv: tuple[str, ...]
    version: str

    @property
    def path(self) -> Path:
        """The executable."""
        return Path(self.argv[0])

    def describe(self) -> str:
        """``"<version> (<command>)"``, e.g. ``"22.1.8 (/usr/lib/llvm-22/bin/llvm-mc)"``."""
        return f"{self.version} ({' '.join(self.argv)})"


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """The tools flyc-build runs.

    Attributes:
        origin: where they were found, for people: ``--llvm-bin``, ``FLYSHIP_LLVM_BIN``, ``ROCM_PATH``,
            ``/opt/rocm``, ``/usr/lib/llvm-22``, ``PATH`` or ``ziglang``.
        folder: the folder holding them (for ziglang: the package folder holding ``zig``).
        assembler: ``llvm-mc``, or ``zig clang`` (a clang driver used as assembler).
        linker: ``ld.lld`` (or ``zig ld.lld``).
        offload_bundler: ``clang-offload-bundler``, or None when the folder has none.
        objdump: ``llvm-objdump``, or None.
        readelf: ``llvm-readelf``, or None.
    """

    origin: str
    folder: Path
    assembler: Tool
    linker: Tool
    offload_bundler: Tool | None = None
    objdump: Tool | None = None
    readelf: Tool | None = None

    @property
    def assembler_is_clang(self) -> bool:
        """True when the assembler is a clang driver (``-target``/``-mcpu=<target id>``), not llvm-mc."""
        return self.assembler.name != "llvm-mc"

    def tools(self) -> list[Tool]:
        """The tools present, assembler and linker first."""
        return [t for t in (self.assembler, self.linker, self.offload_bundler, self.objdump, self.readelf) if t]

    def describe(self) -> dict[str, str]:
        """Tool name -> ``"<version> (<path>)"``, for the manifest's ``build.tools`` and ``variant.toolchain``."""
        return {t.name: t.describe() for t in self.tools()}


# ---------------------------------------------------------------------------------------------
# Finding the tools


def _is_exe(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


# tool_version answers by the executable's identity (path, size, mtime): the build cache persists this
# table so that a rebuild with nothing to compile starts no tool process.
VERSION_MEMO: dict[str, str] = {}


def _memo_key(argv: Sequence[str]) -> str | None:
    try:
        st = os.stat(argv[0])
    except OSError:
        return None
    return f"{os.path.realpath(argv[0])}|{st.st_size}|{st.st_mtime_ns}|{' '.join(argv[1:])}"


def tool_version(argv: Sequence[str]) -> str:
    """The version a tool reports for ``--version`` (``"22.1.8"``).

    Raises:
        ToolchainError: the tool cannot run.
    """
    key = _memo_key(argv)
    if key is not None and key in VERSION_MEMO:
        return VERSION_MEMO[key]
    version = _run_version(argv)
    if key is not None:
        VERSION_MEMO[key] = version
    return version


def tool_versions(argvs: Sequence[Sequence[str]]) -> list[str]:
    """:func:`tool_version` of each tool; those not in the memo run side by side (each run is ~20-30 ms of waiting
    for a process, on the path to the build's first worker)."""
    if sum(_memo_key(a) not in VERSION_MEMO for a in argvs) < 2:
        return [tool_version(a) for a in argvs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(argvs)) as ex:
        return list(ex.map(tool_version, argvs))


def _run_version(argv: Sequence[str]) -> str:
    try:
        r = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60, check=False,
                           env=_hygiene.tool_env())
    except OSError as e:
        raise ToolchainError(f"run {' '.join(argv)} --version: expected a runnable tool, got {e}") from None
    out = r.stdout + r.stderr
    m = _VERSION_RE.search(out)
    if m:
        return m.group(1)
    first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")
    return first or "unknown"


def candidate_dirs(
    environ: Mapping[str, str] | None = None, system_dirs: Sequence[Path | str] | None = None
) -> list[tuple[str, Path]]:
    """The folders searched for llvm-mc and ld.lld when no folder is named, in order, without repeats.

    Args:
        environ: the environment to read ``ROCM_PATH`` and ``PATH`` from (default: ``os.environ``).
        system_dirs: the fixed system folders (default: ``/opt/rocm/llvm/bin``, then
            ``/usr/lib/llvm-N/bin`` newest first).

    Returns:
        ``(origin, folder)`` pairs.
    """
    environ = os.environ if environ is None else environ
    out: list[tuple[str, Path]] = []
    rocm = environ.get("ROCM_PATH", "").strip()
    if rocm:
        out.append(("ROCM_PATH", Path(rocm) / "llvm" / "bin"))
    if system_dirs is None:
        out.append(("/opt/rocm", Path("/opt/rocm/llvm/bin")))
        versioned = []
        for d in Path("/usr/lib").glob("llvm-*"):
            m = re.fullmatch(r"llvm-(\d+)", d.name)
            if m:
                versioned.append((int(m.group(1)), d))
        out += [(str(d), d / "bin") for _, d in sorted(versioned, reverse=True)]
    else:
        out += [(str(d), Path(d)) for d in system_dirs]
    out += [("PATH", Path(p)) for p in environ.get("PATH", "").split(os.pathsep) if p]
    seen: set[str] = set()
    unique = []
    for origin, d in out:
        key = os.path.realpath(d)
        if key not in seen:
            seen.add(key)
            unique.append((origin, d))
    return unique


def _from_dir(origin: str, folder: Path) -> Toolchain | str:
    """A toolchain from one folder, or a sentence saying what the folder lacks."""
    if not folder.is_dir():
        return "no such folder"
    missing = [t for t in REQUIRED_TOOLS if not _is_exe(folder / t)]
    if missing:
        return f"no {' or '.join(missing)}"

    names = ("llvm-mc", "ld.lld", "clang-offload-bundler", "llvm-objdump", "llvm-readelf")
    present = [n for n in names if _is_exe(folder / n)]
    versions = dict(zip(present, tool_versions([[str(folder / n)] for n in present])))
    tools = [Tool(n, (str(folder / n),), versions[n]) if n in versions else None for n in names]
    return Toolchain(origin, folder, *tools)


def _from_ziglang() -> Toolchain | str:
    """The ``ziglang`` wheel's clang and ld.lld, or why not."""
    spec = importlib.util.find_spec("ziglang")
    if spec is None or not spec.submodule_search_locations:
        return "module not installed in this Python"
    folder = Path(list(spec.submodule_search_locations)[0])
    zig = folder / "zig"
    if not _is_exe(zig):
        return f"no zig executable in {folder}"
    clang, lld = (str(zig), "clang"), (str(zig), "ld.lld")
    return Toolchain("ziglang", folder, Tool("zig clang", clang, tool_version(clang)),
                     Tool("zig ld.lld", lld, tool_version(lld)))


def find_toolchain(
    llvm_bin: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    system_dirs: Sequence[Path | str] | None = None,
    use_ziglang: bool = True,
) -> Toolchain:
    """Find llvm-mc and ld.lld (plus clang-offload-bundler, llvm-objdump, llvm-readelf when beside them).

    Args:
        llvm_bin: a folder named by the user (``--llvm-bin``); the only place looked at when given.
        environ: environment for ``FLYSHIP_LLVM_BIN``, ``ROCM_PATH`` and ``PATH`` (default: ``os.environ``).
        system_dirs: replaces the fixed system folders (see :func:`candidate_dirs`); for tests.
        use_ziglang: try the ``ziglang`` wheel last.

    Returns:
        The first complete toolchain in the search order (module docstring).

    Raises:
        ToolchainError: nothing found; the message lists every path tried, what each lacked, and
            the Debian, ROCm and pip packages that provide the tools.

    Example:
        >>> tc = find_toolchain()
        >>> tc.describe()["llvm-mc"]   # doctest: +SKIP
        '22.1.8 (/usr/lib/llvm-22/bin/llvm-mc)'
    """
    from_env = env.llvm_bin() if environ is None else environ.get("FLYSHIP_LLVM_BIN", "").strip()
    environ = os.environ if environ is None else environ
    named = None
    if llvm_bin is not None and str(llvm_bin).strip():
        named = ("--llvm-bin", Path(llvm_bin))
    elif from_env:
        named = ("FLYSHIP_LLVM_BIN", Path(from_env))
    if named is not None:
        found = _from_dir(*named)
        if isinstance(found, Toolchain):
            return found
        raise ToolchainError(f"find LLVM tools: expected {' and '.join(REQUIRED_TOOLS)} in the folder named by "
                             f"{named[0]}, got {found} in {named[1]}; {INSTALL_HINT}")
    tried = []
    for origin, folder in candidate_dirs(environ, system_dirs):
        found = _from_dir(origin, folder)
        if isinstance(found, Toolchain):
            return found
        tried.append(f"{folder} ({origin}): {found}")
    if use_ziglang:
        found = _from_ziglang()
        if isinstance(found, Toolchain):
            return found
        tried.append(f"python -m ziglang: {found}")
    raise ToolchainError(f"find LLVM tools: expected {' and '.join(REQUIRED_TOOLS)}, got none; tried:\n  "
                         + "\n  ".join(tried) + f"\n{INSTALL_HINT}")


# ---------------------------------------------------------------------------------------------
# Running the tools


def run_tool(tool: Tool, args: Sequence[str], *, operation: str, environ: Mapping[str, str] | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``tool`` with ``args``; raise with its stderr when it fails.

    Args:
        tool: the tool.
        args: arguments after the tool's command prefix.
        operation: what is being done, for the error (``"assemble add.gfx942.s for gfx942"``).
        environ: the environment (default: inherited).
        timeout: seconds.

    Returns:
        The finished process (text stdout/stderr).

    Raises:
        ToolchainError: the tool could not start, timed out, or exited non-zero; names the tool, version,
            path and command, and carries the tool's stderr.
    """
    cmd = [*tool.argv, *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                           env=_hygiene.tool_env(environ))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"{operation}: expected {tool.name} {tool.describe()} to run, got {e}") from None
    if r.returncode != 0:
        raise ToolchainError(f"{operation}: expected {tool.name} {tool.describe()} to succeed, got exit "
                             f"{r.returncode}:\n{(r.stderr or r.stdout).strip()}\ncommand: {' '.join(cmd)}")
    return r


def _split_target(target: str) -> tuple[str, list[str]]:
    """``gfx942:sramecc+:xnack-`` -> (``gfx942``, [``+sramecc``, ``-xnack``]) (target ID grammar, AMDGPUUsage)."""
    processor, *feats = target.strip().split(":")
    if not re.fullmatch(r"gfx[0-9a-z-]+", processor) or any(not re.fullmatch(r"[a-z0-9_]+[+-]", f) for f in feats):
        raise ToolchainError(f"parse AMDGPU target {target!r}: expected a target ID like 'gfx942' or "
                             f"'gfx942:sramecc+:xnack-'")
    return processor, [f[-1] + f[:-1] for f in feats]


def assembler_args(toolchain: Toolchain, triple: str, target: str, source: Path, output: Path) -> list[str]:
    """Arguments that assemble ``source`` into the object ``output`` for ``triple`` and ``target``.

    llvm-mc takes ``-mcpu=<processor> -mattr=<+f,-g>``; a clang driver takes ``-mcpu=<target id>``.
    """
    processor, mattr = _split_target(target)
    if toolchain.assembler_is_clang:
        return ["-target", triple, f"-mcpu={target}", "-c", "-x", "assembler", str(source), "-o", str(output)]
    args = [f"-triple={triple}", f"-mcpu={processor}"]
    if mattr:
        args.append("-mattr=" + ",".join(mattr))
    return args + ["-filetype=obj", str(source), "-o", str(output)]


def check_targets(toolchain: Toolchain, archs: Sequence[str]) -> None:
    """Prove the assembler knows every requested target before anything is compiled.

    Assembles a file holding only ``.amdgcn_target "amdgcn-amd-amdhsa-unknown-<target>"`` per target: an
    assembler that does not know the processor fails on it (llvm-mc alone only warns and exits 0).

    Args:
        toolchain: the tools.
        archs: AMD target IDs (``gfx942``, ``gfx950``, ``gfx942:sramecc+:xnack-``).

    Raises:
        ToolchainError: a target the assembler does not know; names the target, the tool, its version and
            path, and how to get an LLVM that knows it.
    """
    with tempfile.TemporaryDirectory(prefix="flyship-probe-") as tmp:
        for target in dict.fromkeys(archs):
            _split_target(target)
            src = Path(tmp) / "probe.s"
            src.write_text(f'\t.amdgcn_target "{PROBE_TRIPLE}-{target}"\n')
            cmd = [*toolchain.assembler.argv,
                   *assembler_args(toolchain, PROBE_TRIPLE, target, src, Path(tmp) / "probe.o")]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                                   env=_hygiene.tool_env())
            except (OSError, subprocess.TimeoutExpired) as e:
                raise ToolchainError(f"check target {target}: expected {toolchain.assembler.describe()} to run, "
                                     f"got {e}") from None
            said = (r.stderr + r.stdout).strip()
            if r.returncode != 0 or _UNKNOWN_PROCESSOR in said:
                first = next((ln for ln in said.splitlines() if ln.strip()), f"exit {r.returncode}")
                raise ToolchainError(
                    f"check target {target}: expected an assembler that knows {target}, got "
                    f"{toolchain.assembler.name} {toolchain.assembler.describe()} (found via {toolchain.origin}), "
                    f"which says: {first.strip()}; {NEWER_LLVM_HINT}")


# ---------------------------------------------------------------------------------------------
# A ROCm-shaped root for FlyDSL's own link step


def _has_bitcode(d: Path) -> bool:
    return d.is_dir() and any(d.glob("*.bc"))


def find_device_bitcode(environ: Mapping[str, str] | None = None,
                        candidates: Sequence[Path | str] | None = None) -> Path:
    """The folder of AMDGPU device library bitcode (``ocml.bc``, ``ockl.bc``, ``oclc_*.bc``).

    Args:
        environ: environment for ``ROCM_PATH`` (default: ``os.environ``).
        candidates: replaces the system folders searched after ``$ROCM_PATH/amdgcn/bitcode``; for tests.

    Returns:
        The first folder holding ``*.bc`` files.

    Raises:
        ToolchainError: none found; lists every folder tried and the packages that provide the bitcode.
    """
    environ = os.environ if environ is None else environ
    dirs: list[Path] = []
    rocm = environ.get("ROCM_PATH", "").strip()
    if rocm:
        dirs.append(Path(rocm) / "amdgcn" / "bitcode")
    if candidates is None:
        dirs += [Path(d) for d in SYSTEM_BITCODE_DIRS]
        for pattern in SYSTEM_BITCODE_GLOBS:
            dirs += sorted(Path("/").glob(pattern.lstrip("/")), reverse=True)
    else:
        dirs += [Path(d) for d in candidates]
    for d in dirs:
        if _has_bitcode(d):
            return d
    raise ToolchainError(
        "find AMDGPU device bitcode: expected ocml.bc, ockl.bc, ... in one of: "
        + ", ".join(str(d) for d in dirs)
        + ", got none; install Debian's rocm-device-libs (`apt-get install rocm-device-libs`, into "
        "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode), or ROCm's rocm-device-libs (/opt/rocm/amdgcn/bitcode), "
        "or set ROCM_PATH to a ROCm root that has amdgcn/bitcode")


def _complete_rocm_root(root: Path) -> bool:
    return _is_exe(root / "llvm" / "bin" / "ld.lld") and _has_bitcode(root / "amdgcn" / "bitcode")


@contextlib.contextmanager
def rocm_root(toolchain: Toolchain, *, environ: Mapping[str, str] | None = None,
              bitcode_dirs: Sequence[Path | str] | None = None, parent: Path | None = None) -> Iterator[Path]:
    """A folder shaped like a ROCm install for FlyDSL's link step: ``llvm/bin/ld.lld`` + ``amdgcn/bitcode``.

    FlyDSL (MLIR's ROCDL serializer) links with ``$ROCM_PATH/llvm/bin/ld.lld`` and the device libraries in
    ``$ROCM_PATH/amdgcn/bitcode``; without them it fails with ``lld invocation failed``. Set the yielded
    path as ``ROCM_PATH`` in FlyDSL's environment.

    Args:
        toolchain: whose ``ld.lld`` to use (for ziglang, a small script running ``zig ld.lld``).
        environ: environment for ``ROCM_PATH`` (default: ``os.environ``).
        bitcode_dirs: replaces the system bitcode folders (see :func:`find_device_bitcode`); for tests.
        parent: the folder to make the temporary one in (a build's scratch folder, which the next build removes
            when this one is killed); default: the system's temporary folder.

    Yields:
        ``$ROCM_PATH`` itself when it already has both parts; otherwise a temporary folder of symlinks,
        removed on exit.

    Raises:
        ToolchainError: no device bitcode anywhere (names rocm-device-libs and the folders tried).
    """
    environ = os.environ if environ is None else environ
    given = environ.get("ROCM_PATH", "").strip()
    if given and _complete_rocm_root(Path(given)):
        yield Path(given)
        return
    bitcode = find_device_bitcode(environ, bitcode_dirs)
    with tempfile.TemporaryDirectory(prefix="flyship-rocm-", dir=parent) as tmp:
        root = Path(tmp)
        (root / "llvm" / "bin").mkdir(parents=True)
        (root / "amdgcn").mkdir()
        lld = root / "llvm" / "bin" / "ld.lld"
        if len(toolchain.linker.argv) == 1:
            lld.symlink_to(os.path.abspath(toolchain.linker.path))  # keep the name: lld picks its flavor from argv[0]
        else:  # zig ld.lld: FlyDSL runs ld.lld as one executable
            lld.write_text("#!/bin/sh\nexec " + shlex.join(toolchain.linker.argv) + ' "$@"\n')
            lld.chmod(0o755)
        (root / "amdgcn" / "bitcode").symlink_to(os.path.abspath(bitcode), target_is_directory=True)
        yield root


__all__ = [
    "Tool", "Toolchain", "ToolchainError", "find_toolchain", "candidate_dirs", "check_targets", "run_tool",
    "assembler_args", "tool_version", "find_device_bitcode", "rocm_root", "INSTALL_HINT",
]
