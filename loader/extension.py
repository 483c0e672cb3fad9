"""Build, cache and import the loader's C++ extension (``csrc/``): one core plus one driver shim.

The shim is chosen when the extension is built (:func:`choose_flavor`): ``FLYSHIP_FLAVOR`` if set,
else ROCm torch -> ``hip``, CUDA torch -> ``cuda``, CPU-only torch -> ``hip`` when HIP headers exist
(how CI compiles and links the HIP flavor against Debian's HIP 5.2). Only driver APIs are called, so
the extension is a plain C++ extension: no nvcc or hipcc, ``-O2``. The core's units (``csrc/*.cpp``) are
compiled as one translation unit on a machine of few cores (torch's headers are parsed once, not once per unit)
and as a few parallel ones on many cores (:func:`compile_sources`, loader/units.py), plus the shim.

The build is cached under ``$FLYSHIP_EXTENSIONS_DIR`` (else ``$TORCH_EXTENSIONS_DIR``, else
``~/.cache/torch_extensions``) in ``flyship/<name>``; ``<name>`` carries the flavor, the Python ABI,
the torch version and a hash of the sources, compiler, flags and paths, so a change of any of them
builds afresh. A cached build is imported directly, without ninja or a compiler (``flyship prebuild`` fills
the cache at image-build time). A file lock makes N processes starting together build once. The HIP and CUDA
toolkits a build compiles against are found by :mod:`flyship.loader.toolkits`.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from flyship import env
from flyship.bundle.frozen import frozen
from flyship.errors import ConfigError, LoadError
from flyship.loader import toolkits

CSRC = Path(__file__).parent.parent / "csrc"
# Flavors never chosen by default: hip-nvidia (test-only: the HIP shim on HIP's NVIDIA platform, see
# hip_nvidia_config), record (test-only, driver_record.cpp: runs no GPU, records launches) and emulate
# (driver_emulate.cpp: runs each launch on the CPU emulator, flyship.loader.emulated_device).
SHIM_SOURCES = {"hip": "driver_hip.cpp", "cuda": "driver_cuda.cpp", "hip-nvidia": "driver_hip.cpp",
                "record": "driver_record.cpp", "emulate": "driver_emulate.cpp"}
# The flavors whose calls run on CPU tensors and touch no GPU (any number of them may sit beside one GPU flavor).
HOST_FLAVORS = ("record", "emulate")
# The core: every csrc/*.cpp that is not a driver shim (one unit per job, see csrc/bundle.h).
CORE_SOURCES = tuple(sorted(p.name for p in CSRC.glob("*.cpp") if not p.name.startswith("driver_")))
HEADERS = tuple(sorted(p.name for p in CSRC.glob("*.h")))


# The extension could not be configured or built (the message lists what was tried): a LoadError, kept under this
# exported name (flyship.loader.ExtensionBuildError) for code that catches it; nothing tells it apart by class.
ExtensionBuildError = LoadError


@frozen
class BuildConfig:
    """Everything that decides the extension binary.

    Attributes:
        flavor: ``"hip"``, ``"cuda"`` or ``"emulate"`` (or the test-only ``"hip-nvidia"`` and ``"record"``).
        sources: C++ sources compiled into the extension.
        include_dirs: extra include directories (the HIP or CUDA headers).
        cflags: extra compiler flags.
        ldflags: extra linker flags (the runtime library and its rpath).
        name: module name, unique per content (see the module docstring).
        directory: build and cache directory.
    """

    flavor: str
    sources: tuple[str, ...]
    include_dirs: tuple[str, ...]
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    name: str
    directory: Path

    @property
    def library(self) -> Path:
        """Path of the built module."""
        return self.directory / f"{self.name}.so"  # the name torch.utils.cpp_extension gives it


def choose_flavor() -> str:
    """The driver shim to build: ``FLYSHIP_FLAVOR``, else from the torch build (see module docstring).

    Raises:
        ExtensionBuildError: CPU-only torch and no HIP headers; names the paths tried.
    """
    forced = env.flavor()
    if forced:
        return forced
    torch = toolkits.import_torch()
    if torch.version.hip:
        return "hip"
    if torch.version.cuda:
        return "cuda"
    if toolkits.find_hip_headers() is not None:
        return "hip"
    tried = ", ".join(str(r / "include" / "hip" / "hip_runtime_api.h") for r in toolkits.hip_roots())
    raise ExtensionBuildError(
        "build flyship extension: expected a ROCm or CUDA build of torch, or HIP headers, got a CPU-only torch "
        f"{torch.__version__} and no HIP headers (tried {tried}); install a GPU build of torch, or set "
        "FLYSHIP_FLAVOR and FLYSHIP_HIP_PATH / CUDA_HOME to build the shim against a toolkit"
    )


def _sanitize(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_")


def extensions_root() -> Path:
    base = (env.extensions_dir() or os.environ.get("TORCH_EXTENSIONS_DIR")
            or str(Path.home() / ".cache" / "torch_extensions"))
    return Path(base) / "flyship"


def extension_name(flavor: str, sources: tuple[str, ...] | None = None, cflags: tuple[str, ...] | None = None) -> str:
    """The module name of the extension: ``flyship_<flavor>_<python tag>_torch<version>_<hash>``.

    The name says what the binary is made of (the C++ sources and headers, the flavor, torch's version and
    commit, the Python ABI, the compile flags), never where or by whom it was built, and it is computed without
    looking for a toolkit: a later process with another HOME, CXX, cache folder or current directory, in an
    image without headers or compiler, computes the same name and finds a prebuilt extension (flyship
    prebuild). A compiler that would make an incompatible binary (a static libstdc++) is refused after the build
    (:func:`check_shared_libstdcxx`). To rebuild against another HIP or CUDA install, use another
    ``FLYSHIP_EXTENSIONS_DIR`` (or delete the cached folder).
    """
    if sources is None:
        sources = tuple(str(CSRC / s) for s in (*CORE_SOURCES, SHIM_SOURCES[flavor]))
    if cflags is None:
        cflags = tuple(_cflags(flavor))
    torch = toolkits.import_torch()
    h = hashlib.sha256()
    for f in sorted({*sources, *(str(CSRC / x) for x in HEADERS)}):
        h.update(Path(f).name.encode() + b"\0" + Path(f).read_bytes() + b"\0")
    if flavor == "hip-nvidia" and env.hip_nvidia_include():  # the test header is source too
        for f in sorted(Path(env.hip_nvidia_include()).rglob("*.h")):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for part in (flavor, torch.__version__, getattr(torch.version, "git_version", ""), sys.implementation.cache_tag,
                 sys.abiflags if hasattr(sys, "abiflags") else "", *cflags):
        h.update(str(part).encode() + b"\0")
    return "_".join(("flyship", _sanitize(flavor), _sanitize(sys.implementation.cache_tag),  # a Python identifier
                     "torch" + _sanitize(torch.__version__), h.hexdigest()[:12]))


def _cflags(flavor: str) -> list[str]:
    platform = {"hip": ["-D__HIP_PLATFORM_AMD__=1"], "hip-nvidia": ["-D__HIP_PLATFORM_NVIDIA__=1"]}
    return ["-O2", "-fvisibility=hidden"] + platform.get(flavor, [])


def config(flavor: str | None = None) -> BuildConfig:
    """Work out sources, paths and flags for a flavor (default: :func:`choose_flavor`).

    Raises:
        ExtensionBuildError: headers or the runtime library are missing.
    """
    flavor = flavor or choose_flavor()
    if flavor not in SHIM_SOURCES:
        raise ExtensionBuildError(f"build flyship extension: expected flavor 'hip', 'cuda' or 'emulate' (or the "
                                  f"test-only 'hip-nvidia', 'record'), got {flavor!r}")
    sources = tuple(str(CSRC / s) for s in (*CORE_SOURCES, SHIM_SOURCES[flavor]))
    cflags = _cflags(flavor)
    name = extension_name(flavor, sources, tuple(cflags))  # what the binary is made of, never where a toolkit is
    if flavor == "hip":
        inc = toolkits.find_hip_headers()
        if inc is None:
            tried = ", ".join(str(r / "include") for r in toolkits.hip_roots())
            raise ExtensionBuildError(f"build flyship extension (hip): expected hip/hip_runtime_api.h, found none in "
                                      f"{tried}; install ROCm or set FLYSHIP_HIP_PATH to its root")
        from flyship.loader import hip_library

        lib, _ = toolkits.find_hip_library()
        include_dirs = (str(inc),)
        # Not linked: the shim opens it on first use by these names, from the rpath first (loader/hip_library.py).
        cflags.append(hip_library.cflag(hip_library.names(lib)))
        ldflags = ("-ldl", f"-Wl,-rpath,{lib.parent}")
    elif flavor == "hip-nvidia":
        include_dirs, _, ldflags = toolkits.hip_nvidia_config()  # its platform flag is in _cflags
    elif flavor in HOST_FLAVORS:  # no GPU SDK: the recording and emulating drivers call no runtime
        include_dirs, ldflags = (), ()
    else:
        inc, tried = toolkits.find_cuda_header()
        if inc is None:
            raise ExtensionBuildError("build flyship extension (cuda): expected cuda.h, found none; tried "
                                      + ", ".join(tried) + "; install the CUDA toolkit headers or set CUDA_HOME")
        lib = toolkits.find_cuda_library()
        include_dirs = (str(inc),)
        ldflags = (str(lib),)
    root = extensions_root()
    return BuildConfig(flavor, sources, include_dirs, tuple(cflags), ldflags, name, root / name)


def compile_sources(cfg: BuildConfig, directory: Path) -> list[str]:
    """The translation units to compile: the core's units grouped into files in ``directory`` (loader/units.py: one
    on a machine of few cores, a few compiled in parallel on many; ``FLYSHIP_BUILD_UNITS`` sets the count), and
    the driver shim."""
    from flyship.loader import units

    core = [s for s in cfg.sources if not Path(s).name.startswith("driver_")]
    groups = env.build_units() or units.default_groups(len(core))
    return [*units.write_units(core, groups, directory), *(s for s in cfg.sources if s not in core)]


_held_descriptors: list[int] = []  # the libraries imported through /proc/self/fd (see _import)


def _import(name: str, library: Path, group_ok: bool = False) -> ModuleType:
    """Import the extension module ``name`` from the file ``library`` (any folder; the module's init function is
    named after ``name``, so a prebuilt copy keeps its file name): exactly the bytes that were checked.

    The library is opened once and checked through that descriptor (:func:`flyship.loader.prebuilt.open_checked`:
    trusted path, owner and mode, record, sha256, a whole ELF shared library), then imported through the same
    descriptor (``/proc/self/fd/N``): a path swapped between the check and the import (a link flipped to a planted
    library) cannot change what is loaded. Where there is no ``/proc/self/fd`` the path is imported after the check.

    Raises:
        ExtensionBuildError: the library is refused (the reason), or its import fails (another torch or system).
    """
    from flyship.loader import prebuilt

    fd, why = prebuilt.open_checked(library, name, group_ok=group_ok)
    if fd is None:
        raise ExtensionBuildError(f"import flyship extension {library}: refused: {why}; delete it and run `flyship "
                                  "prebuild` again (or unset FLYSHIP_EXTENSION_PATH)")
    if not os.path.isdir("/proc/self/fd"):
        os.close(fd)
        through = str(library)
    else:
        # The descriptor stays open for the life of the process: the dynamic loader knows a loaded library by the
        # name it was opened by, so a later library opened through the same (reused) descriptor number would be
        # taken for this one. One descriptor per extension imported (one or two per process).
        _held_descriptors.append(fd)
        through = f"/proc/self/fd/{fd}"
    # The loader named: the descriptor's path has no .so suffix to choose one by.
    spec = importlib.util.spec_from_file_location(name, through,
                                                  loader=importlib.machinery.ExtensionFileLoader(name, through))
    if spec is None or spec.loader is None:
        raise ExtensionBuildError(f"import flyship extension: cannot import {library}")
    try:  # (an extension module is dlopened and initialized by module_from_spec, not by exec_module)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as e:
        raise ExtensionBuildError(f"import flyship extension {library}: {e}; delete it and run `flyship "
                                  "prebuild` again (it was built for another torch, flavor or system)") from e
    module.__file__ = str(library)
    return module


def installed_dir() -> Path:
    """Where ``flyship prebuild`` installs the extension into the environment: ``<sys.prefix>/share/flyship/extensions``
    (the virtual environment or the image's Python, whatever the user's HOME)."""
    return Path(sys.prefix) / "share" / "flyship" / "extensions"


def search_dirs(near: Path | None = None) -> list[Path]:
    """Folders searched, in order, for a prebuilt ``<name>.so`` before the build cache: ``FLYSHIP_EXTENSION_PATH``,
    the folder holding the bundle (``near``: a prebuilt extension shipped beside the bundle), the environment
    (:func:`installed_dir`)."""
    dirs = [Path(d) for d in env.extension_path()]
    if near is not None:
        dirs.append(Path(near))
    dirs.append(installed_dir())
    return dirs


def find_prebuilt(name: str, near: Path | None = None) -> Path | None:
    """The first ``<name>.so`` in :func:`search_dirs` that :func:`flyship.loader.prebuilt.refusal` accepts, or
    None; a refused candidate is never opened (each refusal is printed once, with its reason)."""
    from flyship.loader import prebuilt

    for d in search_dirs(near):
        candidate = d / f"{name}.so"
        if not os.path.lexists(candidate):
            continue
        why = prebuilt.refusal(candidate, name)
        if why is None:
            return candidate
        _say(f"flyship: not importing the prebuilt extension {candidate}: {why}")
    return None


def install(library: Path, dest: Path) -> Path:
    """Copy a built extension into the folder ``dest`` under its own name (a temporary file, then a rename).

    Raises:
        ConfigError: ``dest`` cannot be created or written (a missing parent under /proc, a file in the way, no
            permission, a full disk).
    """
    tmp = None
    try:
        dest.mkdir(mode=0o755, parents=True, exist_ok=True)  # lookup refuses a folder others can write
        fd, tmp = tempfile.mkstemp(prefix=f".{library.name}.", dir=dest)
        os.close(fd)
        shutil.copyfile(library, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest / library.name)
        from flyship.loader import prebuilt

        tmp = None
        prebuilt.write_record(dest / library.name, library.name[: -len(".so")])
    except OSError as e:
        raise ConfigError(f"install the flyship extension into {dest}: expected a folder it can create and write, "
                          f"got {type(e).__name__}: {e.strerror or e}{f' ({e.filename})' if e.filename else ''}; "
                          "pass a writable folder (flyship prebuild -o DIR)") from e
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return dest / library.name


def build(cfg: BuildConfig, verbose: bool | None = None) -> Path:
    """Compile and link the extension into ``cfg.directory`` unless it is there already.

    Under a file lock, so N processes starting together (torchrun) build once; the others wait, each saying so in
    one line. The build runs in a private temporary folder and its module is renamed into place only once it is
    complete and checked, so an interrupted build never leaves a library that a later load would trust.

    Returns:
        The path of the built module.

    Raises:
        ExtensionBuildError: no C++ compiler (one paragraph: what to install, or how to ship a prebuilt one), or the
            compiler or linker failed (the telling line in the message, the full log in a file it names).
    """
    from filelock import FileLock, Timeout

    cfg.directory.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(cfg.directory) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if not cfg.library.is_file():
            _say(f"flyship: waiting for another process that is building the C++ extension ({cfg.flavor}) in "
                 f"{cfg.directory}")
        lock.acquire()
    try:
        if os.path.lexists(cfg.library):
            from flyship.bundle import trust
            from flyship.loader import prebuilt

            why = trust.untrusted_reason(cfg.library, group_ok=True)  # its own cache: as the build cache
            if why is not None:  # planted in a shared extensions folder: never dlopen it
                raise ExtensionBuildError(f"load flyship extension: refused {cfg.library}: {why}; delete it, or set "
                                          "FLYSHIP_EXTENSIONS_DIR to a folder only you can write")
            bad = prebuilt.refusal(cfg.library, cfg.name, group_ok=True)
            if bad is None:
                return cfg.library
            # 0 bytes, truncated, foreign, or built before records existed: never imported, built again
            _say(f"flyship: the cached C++ extension {cfg.library} fails verification ({bad}); building it again")
            cfg.library.unlink()
            prebuilt.record_path(cfg.library).unlink(missing_ok=True)
        missing = _missing_compiler(cfg)
        if missing is not None:  # before the "building" line and torch's own compiler checks, one paragraph
            raise ExtensionBuildError(missing)
        _say(f"flyship: building the C++ extension ({cfg.flavor} flavor) in {cfg.directory} with "
             f"{os.environ.get('CXX', 'c++')}; this takes ~25-35 s on 16 idle cores, 1-3 minutes on 2 busy ones, once "
             "(`flyship prebuild` does it ahead of time)")
        cfg.directory.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=cfg.directory))
        try:
            built = _compile(cfg, work, verbose)
            check_shared_libstdcxx(built)
            from flyship.loader import prebuilt

            # the record first: a reader that sees the new record beside an old library refuses it and waits here
            prebuilt.write_record(built, cfg.name)
            os.replace(prebuilt.record_path(built), prebuilt.record_path(cfg.library))
            os.replace(built, cfg.library)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return cfg.library
    finally:
        lock.release()


def _say(line: str) -> None:
    """One line to stderr, where a workload's logs keep it."""
    print(line, file=sys.stderr, flush=True)


def _compile(cfg: BuildConfig, work: Path, verbose: bool | None) -> Path:
    """Run torch.utils.cpp_extension's build of ``cfg`` in the folder ``work``; returns the module built there."""
    from torch.utils import cpp_extension
    from torch.utils._cpp_extension_versioner import ExtensionVersioner

    # torch renames a second build of one name in one process (<name>_v1) when its inputs (the folder among
    # them) differ; each build here has a fresh folder and the name already carries the content.
    versioner = getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None)
    if isinstance(versioner, ExtensionVersioner):
        versioner.entries.pop(cfg.name, None)
    try:
        cpp_extension.load(
            name=cfg.name,
            sources=compile_sources(cfg, work),
            extra_cflags=list(cfg.cflags),
            extra_ldflags=list(cfg.ldflags),
            extra_include_paths=list(cfg.include_dirs),
            build_directory=str(work),
            verbose=env.verbose() if verbose is None else verbose,
            with_cuda=False,
            is_python_module=False,  # built here, imported by _import (one path for fresh and cached)
        )
    except subprocess.CalledProcessError as e:  # torch runs the compiler itself (its ABI check) before ninja
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else str(e.output or "")
        cmd = " ".join(map(str, e.cmd)) if isinstance(e.cmd, (list, tuple)) else str(e.cmd)
        raise _build_failed(cfg, f"$ {cmd}\n(exit {e.returncode})\n{out}") from None
    except (RuntimeError, OSError, ImportError) as e:  # ninja's failure: every compiler command and its output
        raise _build_failed(cfg, str(e)) from e
    built = work / cfg.library.name
    if not built.is_file():
        raise ExtensionBuildError(f"build flyship extension: expected {built} after the build, found none")
    return built


_PREBUILD_HINT = ("build it once where a compiler exists, with this same Python and torch (this image plus g++): "
                  "`flyship prebuild -o DIR`, then ship DIR's flyship_*.so with its .so.json beside the bundle or in "
                  "a folder named by FLYSHIP_EXTENSION_PATH (docs/shipping.md)")


def _missing_compiler(cfg: BuildConfig) -> str | None:
    """The error paragraph when the C++ compiler torch would run (``$CXX``, else ``c++``) is not there, else None."""
    import shlex

    cxx = os.environ.get("CXX") or "c++"
    try:
        program = shlex.split(cxx)[0]  # CXX may hold a launcher and flags ("ccache g++")
    except (ValueError, IndexError):
        program = cxx
    if shutil.which(program):
        return None
    named = f"CXX={cxx!r}" if os.environ.get("CXX") else "'c++' (CXX is unset)"
    return (f"build flyship extension ({cfg.flavor}): expected a C++ compiler to build {cfg.name}.so, got none: "
            f"{named} is not an executable file or on PATH; and no prebuilt extension of that name was found "
            f"(FLYSHIP_EXTENSION_PATH, beside the bundle, {installed_dir()}). Either {_PREBUILD_HINT}; or install a "
            "C++ compiler here (apt-get install g++) or set CXX to one")


def _build_failed(cfg: BuildConfig, log: str) -> LoadError:
    """The error for a compiler or linker that ran and failed: one paragraph with the line that says why, the full
    log in a file it names (not the dump of every command line: docs/shipping.md)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    telling = [line for line in lines if re.search(r"error|not found|fatal|undefined reference", line, re.I)
               and not line.startswith(("FAILED:", "ninja: build stopped"))]
    why = (telling or lines or ["no output"])[-1][:300]
    cxx = os.environ.get("CXX") or "c++"
    try:
        fd, path = tempfile.mkstemp(prefix=f"{cfg.name}.", suffix=".build.log", dir=cfg.directory.parent)
        with os.fdopen(fd, "w") as f:
            f.write(log)
        where = f"the full log is {path}"
    except OSError:  # no writable folder: the tail of the log instead
        where = f"the log ends: {log[-1500:]}"
    return ExtensionBuildError(f"build flyship extension ({cfg.flavor}): the compiler {cxx!r} failed: {why}; "
                               f"{where}. Fix the compiler (CXX, FLYSHIP_VERBOSE=1 shows each command), or "
                               f"{_PREBUILD_HINT}")


def check_shared_libstdcxx(library: Path) -> None:
    """Refuse an extension that carries its own copy of libstdc++.

    torch's libraries use the shared libstdc++; a compiler that links it statically (seen: a ``CXX``
    wrapper that adds ``-static-libstdc++``) puts a second copy in the process, and the first error
    message that formats a number through a stream made by the other copy crashes (SIGSEGV in
    ``std::ostream::_M_insert``).

    Raises:
        ExtensionBuildError: ``DT_NEEDED`` names no libstdc++.
    """
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    with open(library, "rb") as f:
        needed = [t.needed for sec in ELFFile(f).iter_sections() if isinstance(sec, DynamicSection)
                  for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    if not any(n.startswith("libstdc++") for n in needed):
        cxx = os.environ.get("CXX", "c++")
        raise ExtensionBuildError(
            f"build flyship extension: expected {library.name} to link the shared libstdc++ as torch does, got a "
            f"static copy (it needs only {', '.join(needed)}); the compiler {cxx!r} links libstdc++ statically, "
            "and two copies in one process crash on the first error message; build with one that links it "
            "dynamically, e.g. CXX=c++"
        )


_lock = threading.Lock()
_loaded: dict[str, ModuleType] = {}


def _cached(name: str) -> Path | None:
    """The build cache's library of this name when it is there and trusted, found without a toolkit (no headers
    looked up, no cpp_extension imported: a warm load compiles nothing). A build renames its library into place
    only once complete (:func:`build`), so one that exists is whole; anything else goes through :func:`build`,
    which says what is wrong with it."""
    from flyship.bundle import trust

    from flyship.loader import prebuilt

    library = extensions_root() / name / f"{name}.so"
    if (os.path.lexists(library) and trust.untrusted_reason(library, group_ok=True) is None
            and prebuilt.refusal(library, name, group_ok=True) is None):  # bytes as built: never a 0-byte or torn copy
        return library
    return None


def extension(flavor: str | None = None, near: Path | None = None) -> ModuleType:
    """The extension module for this process: a prebuilt one (:func:`find_prebuilt`; ``near`` is the folder
    holding the bundle being loaded), else the build cache's, built on first use.

    Raises:
        ExtensionBuildError: see :func:`config` and :func:`build`.
    """
    flavor = flavor or choose_flavor()
    with _lock:
        if flavor not in _loaded:
            # One GPU driver per process (two would compete for the devices); the host drivers touch no device,
            # so they may sit beside one.
            gpu = [f for f in _loaded if f not in HOST_FLAVORS]
            if flavor not in HOST_FLAVORS and gpu:
                other = gpu[0]
                raise ExtensionBuildError(f"load flyship extension: expected one flavor per process, got {flavor!r} "
                                          f"after {other!r}; unset FLYSHIP_FLAVOR or use one value")
            name = extension_name(flavor)
            prebuilt = find_prebuilt(name, near) or _cached(name)
            if prebuilt is not None:
                _loaded[flavor] = _import(name, prebuilt, group_ok=prebuilt.parent.parent == extensions_root())
            else:
                cfg = config(flavor)
                _loaded[flavor] = _import(cfg.name, build(cfg), group_ok=True)
        return _loaded[flavor]
