"""flyc-build's content-addressed build cache: the key of each compile and the store that holds results.

Two levels, both keyed by sha256 over canonical JSON:

* **Task entries**, one per (op, specialization, target): the key covers everything that determines the
  code object (:func:`task_key`): the kernel's source and what it closes over (:mod:`.kernel_sources`: the
  source files of the kernel's module and, recursively, of every module of the user's it reaches, plus the
  values captured in the kernel's closure), the op's parameters and grid, the specialization (dtypes, shapes, scalars,
  constexprs, constraints, options), the target ID, the frontend and its DSL's version (the packages each
  frontend names, and torch), the LLVM tools' versions, the code object version and ``--keep-ir``, the
  DSL-relevant environment (each frontend's prefixes, such as ``FLYDSL_*``, ``TRITON_*``; ``LLVM_*``, ...) and
  flyship's own version and compile-side source (the frontend adapters, assembly, proof, the bundle contract). The entry holds the compiled variant with its
  proof; its code object and ISA are blobs named by their sha256.
* **Build entries**, one per (spec file, flyc-build options, environment): the bundle's files as blobs
  plus the list of every file the spec file read while it was imported (its modules, data files) with
  their sha256. A rebuild whose recorded files all hash the same writes the bundle without importing
  the spec, FlyDSL or torch: this is what makes a no-op rebuild take well under a second (the idea of
  ccache's direct mode and ninja's depfiles).

Every blob is checked against its name when read: a corrupt entry is deleted and rebuilt, never trusted.
Writes go to a temporary file in the same folder and are renamed into place (atomic on POSIX), and each
entry write holds a file lock, so concurrent builds share one cache safely. Pickled variants are read with
an unpickler that only admits flyship's own result classes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import io
import json
import os
import pickle
import platform
import sys
import sysconfig
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from filelock import FileLock

from flyship.version import __version__
from flyship.bundle import files as _files
from flyship.bundle import trust as _trust
from flyship.bundle.files import atomic_write
from flyship.compiler import frontends as _frontends

CACHE_FORMAT = 1
# Environment variables that steer code generation: each frontend names its DSL's (Frontend.env_prefixes,
# env_names); these are every build's (flyship's LLVM toolchain, the ROCm runtime). Cache and dump folders are
# not code.
_ENV_PREFIXES = ("LLVM_", "ROCM_", "HIP_")
_ENV_SKIP = ("CACHE", "DUMP")
# Keyed by version (flyship: by its source), not walked, besides each frontend's Frontend.packages.
_VERSIONED = ("torch", "flyship")


# ---------------------------------------------------------------------------------------------
# Fingerprints


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path | str) -> Optional[str]:
    """sha256 of a file's bytes, None when it cannot be read (deleted, a folder)."""
    try:
        return sha256_bytes(Path(path).read_bytes())
    except OSError:
        return None


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)


def _json_default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__class__": type(obj).__qualname__, **{f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}}
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, bytes):
        return sha256_bytes(obj)
    return repr(obj)


def digest(obj: Any) -> str:
    """sha256 of ``obj`` as canonical JSON (sorted keys; dataclasses by field; anything else by ``repr``)."""
    return sha256_bytes(_canonical(obj).encode())


def _library_roots() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(sorted(str(Path(p).resolve()) + os.sep for p in paths if p))


_LIB_ROOTS = _library_roots()
_SYSTEM_ROOTS = ("/proc/", "/sys/", "/dev/", "/run/")  # process state (torch reads /proc/self/maps), not inputs
_FLYSHIP_ROOTS: tuple[str, ...] = ()


def _flyship_roots() -> tuple[str, ...]:
    global _FLYSHIP_ROOTS
    if not _FLYSHIP_ROOTS:
        import flyship.bundle
        import flyship.compiler

        import flyship

        dirs = {Path(m.__file__).resolve().parent for m in (flyship, flyship.bundle, flyship.compiler)}
        _FLYSHIP_ROOTS = tuple(sorted(str(d) + os.sep for d in dirs))
    return _FLYSHIP_ROOTS


def is_user_file(path: str | os.PathLike) -> bool:
    """True for a regular file of the user's (a spec, a kernel module, a data file it reads); False for the
    standard library, installed packages (keyed by their versions instead), flyship itself (keyed by its
    source fingerprint), bytecode caches and anything that is not a regular file."""
    try:
        p = Path(path).resolve()
    except (OSError, RuntimeError):
        return False
    s = str(p)
    if s.startswith(_SYSTEM_ROOTS) or not p.is_file() or "__pycache__" in p.parts or p.suffix in (".pyc", ".so"):
        return False
    if "site-packages" in p.parts or "dist-packages" in p.parts:
        return False
    return not s.startswith(_LIB_ROOTS) and not s.startswith(_flyship_roots())


_FLYSHIP_FP: Optional[str] = None


def flyship_fingerprint() -> str:
    """flyship's version plus the bytes of its compile-side source (compiler/ and bundle/): an edit to a
    frontend adapter, the assembler, the proof or the manifest code invalidates every entry."""
    global _FLYSHIP_FP
    if _FLYSHIP_FP is None:
        h = hashlib.sha256(__version__.encode())
        for root in _flyship_roots():
            if root.rstrip(os.sep).endswith(("compiler", "bundle")):
                for f in sorted(Path(root).rglob("*")):
                    if f.suffix in (".py", ".json") and "__pycache__" not in f.parts:
                        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
        _FLYSHIP_FP = h.hexdigest()
    return _FLYSHIP_FP


def package_versions() -> dict[str, str]:
    """Versions of the Python, each frontend's DSL (:meth:`Frontend.package_versions`) and torch (read from
    installed metadata; nothing is imported)."""
    out = {"python": platform.python_version(), "machine": platform.machine()}
    for fe in _frontends.registered():
        out.update(fe.package_versions())
    try:
        out["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        out["torch"] = "absent"
    return out


def versioned_packages() -> tuple[str, ...]:
    """Top-level packages keyed by their version (or flyship's by its source), whose modules are never walked."""
    return (*_VERSIONED, *(p for fe in _frontends.registered() for p in fe.packages))


def dsl_environment(environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment variables that can change what a frontend's DSL or LLVM generate."""
    environ = os.environ if environ is None else environ
    fes = _frontends.registered()
    prefixes = (*_ENV_PREFIXES, *(p for fe in fes for p in fe.env_prefixes))
    names = {n for fe in fes for n in fe.env_names}
    return {k: v for k, v in sorted(environ.items())
            if (k.startswith(prefixes) or k in names) and not any(s in k for s in _ENV_SKIP)}


def task_key(op: Any, spec: Any, target: str, context: dict[str, Any], sources: dict[str, Any]) -> str:
    """The cache key of one (op, specialization, target).

    Args:
        op: the :class:`flyship.compiler.spec.OpDecl`.
        spec: its :class:`flyship.compiler.spec.Spec`.
        target: the target ID text.
        context: what all tasks of a build share (:func:`build_context`).
        sources: :func:`kernel_sources` of ``op.kernel``.
    """
    decl = {"name": op.name, "frontend": op.frontend, "grid": op.grid,
            "args": [{"kind": type(a).__name__, **{k: v for k, v in dataclasses.asdict(a).items()
                                                    if k != "per_target" or v}} for a in op.args]}  # keys as before
    if getattr(op, "mutable_written", False):  # op(..., mutable=True): the write check does not refuse
        decl["mutable_written"] = True
    if getattr(op, "launches", ()):  # a multi-launch op: each kernel's parameters and grid
        decl["launches"] = [{"args": list(k.args), "grid": list(k.grid), "options": k.options} for k in op.launches]
    return digest({"format": CACHE_FORMAT, "context": context, "target": target, "op": decl,
                   "spec": dataclasses.asdict(spec), "kernel": sources})


def build_context(tools: dict[str, str], code_object_version: Optional[int], keep_ir: bool) -> dict[str, Any]:
    """What every task of one build shares in its key."""
    return {"flyship": __version__, "flyship_source": flyship_fingerprint(), "packages": package_versions(),
            "tools": {k: v.split(" (")[0] for k, v in sorted(tools.items())},
            "code_object_version": code_object_version, "keep_ir": keep_ir, "environment": dsl_environment()}


# ---------------------------------------------------------------------------------------------
# Files a spec file reads while it is imported (for build entries)


_RECORDERS: list[set] = []
_HOOKED = False


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _RECORDERS and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        for r in _RECORDERS:
            r.add(path)


@contextlib.contextmanager
def record_reads() -> Iterator[dict[str, str]]:
    """Record the user files opened (and the user modules imported) inside the block.

    Yields:
        A dict filled on exit: resolved path -> sha256 of each user file read.
    """
    global _HOOKED
    if not _HOOKED:  # an audit hook cannot be removed; it does nothing while no recorder is active
        sys.addaudithook(_audit)
        _HOOKED = True
    opened: set[str] = set()
    before = set(sys.modules)
    out: dict[str, str] = {}
    _RECORDERS.append(opened)
    try:
        yield out
    finally:
        _RECORDERS.remove(opened)
        for name in set(sys.modules) - before:
            f = getattr(sys.modules.get(name), "__file__", None)
            if f:
                opened.add(f)
        for p in sorted(opened):
            if is_user_file(p):
                rp = str(Path(p).resolve())
                out[rp] = sha256_file(rp) or "unreadable"


# ---------------------------------------------------------------------------------------------
# The store


_MAX_CACHED = 1 << 31  # bounds every read of the cache; no code object or entry comes near it


def _read_cached(path: Path) -> bytes:
    """A cache file's bytes, read once and bounded, only when it is a regular file (not a link) that the user or
    root owns and no one outside the owner's group can write (docs/security.md, "A shared build cache"): a
    forged entry must come from someone who could already write the user's files."""
    return _trust.read_trusted(path, _MAX_CACHED, what="build cache", group_ok=True)


class _ResultUnpickler(pickle.Unpickler):
    """Admits only flyship's result dataclasses and plain builtins: a planted pickle cannot run code."""

    _MODULES = ("flyship.bundle.model", "flyship.bundle.manifest", "flyship.compiler.frontends")  # and their submodules
    _BUILTINS = {"tuple", "list", "dict", "set", "frozenset", "int", "float", "str", "bytes", "bool", "NoneType"}

    def find_class(self, module: str, name: str) -> Any:
        ours = module in self._MODULES or module.startswith(tuple(m + "." for m in self._MODULES))
        if ours or (module == "builtins" and name in self._BUILTINS):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and (not ours or dataclasses.is_dataclass(obj)):
                return obj
        raise pickle.UnpicklingError(f"cache entry names {module}.{name}, which a build result never holds")


@dataclasses.dataclass(frozen=True)
class BuildEntry:
    """A whole bundle from the cache: its files (manifest included) and the summary rows."""

    files: dict[str, bytes]
    rows: list[dict[str, Any]]


class BuildCache:
    """The cache folder (``FLYSHIP_CACHE_DIR``): ``objects/`` blobs named by sha256, ``tasks/`` and
    ``builds/`` entries named by key, ``locks/``. Safe to share between concurrent builds."""

    def __init__(self, root: Path | str):
        self.root = Path(root) / f"v{CACHE_FORMAT}"
        self.hits = 0
        self.misses = 0
        self._tools_seen: dict[str, str] = {}

    # -- blobs
    def _blob_path(self, sha: str) -> Path:
        return self.root / "objects" / sha[:2] / sha

    def put_blob(self, data: bytes) -> str:
        sha = sha256_bytes(data)
        p = self._blob_path(sha)
        if _trust.untrusted_reason(p, group_ok=True) is not None or sha256_file(p) != sha:  # missing, a link, ...
            atomic_write(p, data)
        return sha

    def get_blob(self, sha: str) -> Optional[bytes]:
        """The blob's bytes, or None when missing or corrupt (a corrupt one is removed)."""
        p = self._blob_path(sha)
        try:
            data = _read_cached(p)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # a link, someone else's file: never read, never deleted
            return None
        if sha256_bytes(data) != sha:
            with contextlib.suppress(OSError):
                p.unlink()
            return None
        return data

    # -- entries
    def _entry_path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.json"

    def _lock(self, key: str) -> FileLock:
        d = self.root / "locks"
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / f"{key[:2]}.lock"), timeout=120)

    def _read_entry(self, kind: str, key: str) -> Optional[dict]:
        p = self._entry_path(kind, key)
        try:
            data = _files.parse_json(_read_cached(p), what=f"build cache entry {p}")
            if isinstance(data, dict) and data.get("format") == CACHE_FORMAT and data.get("key") == key:
                return data
        except (OSError, ValueError):
            pass
        if p.exists():
            self._drop(kind, key)
        return None

    def _write_entry(self, kind: str, key: str, data: dict) -> None:
        with self._lock(key):
            atomic_write(self._entry_path(kind, key),
                          json.dumps({"format": CACHE_FORMAT, "key": key, **data}, sort_keys=True).encode())

    def _drop(self, kind: str, key: str) -> None:
        with contextlib.suppress(OSError):
            self._entry_path(kind, key).unlink()

    # -- compiled variants
    def get_variant(self, key: str) -> Any:
        """The cached :class:`~flyship.compiler.frontends.CompiledVariant` (with its proof), or None."""
        e = self._read_entry("tasks", key)
        v = None
        if e is not None:
            try:
                blobs = {name: self.get_blob(sha) if sha else b"" for name, sha in e["blobs"].items()}
                if all(b is not None for b in blobs.values()):
                    v = _ResultUnpickler(io.BytesIO(blobs["variant"])).load()
                    v = dataclasses.replace(v, code_object=blobs["code_object"],
                                            isa=blobs["isa"].decode() if e["blobs"].get("isa") else None)
            except Exception:  # any damage: rebuild, never trust
                v = None
            if v is None:
                self._drop("tasks", key)
        if v is None:
            self.misses += 1
        else:
            self.hits += 1
        return v

    def put_variant(self, key: str, v: Any) -> None:
        skeleton = dataclasses.replace(v, code_object=b"", isa=None)
        blobs = {"variant": self.put_blob(pickle.dumps(skeleton, protocol=4)),
                 "code_object": self.put_blob(v.code_object),
                 "isa": self.put_blob(v.isa.encode()) if v.isa is not None else None}
        self._write_entry("tasks", key, {"blobs": blobs})

    # -- tool versions (see flyship.compiler.toolchain.VERSION_MEMO)
    def load_tool_versions(self) -> None:
        from flyship.compiler import toolchain as _tc

        try:
            data = _files.parse_json(_read_cached(self.root / "tool-versions.json"), what="build cache tool versions")
            if isinstance(data, dict) and all(type(v) is str for v in data.values()):
                _tc.VERSION_MEMO.update(data)
        except (OSError, ValueError):  # BundleError is a ValueError
            pass
        self._tools_seen = dict(_tc.VERSION_MEMO)

    def save_tool_versions(self) -> None:
        from flyship.compiler import toolchain as _tc

        if _tc.VERSION_MEMO != self._tools_seen:
            with self._lock("tool-versions"):
                atomic_write(self.root / "tool-versions.json", json.dumps(_tc.VERSION_MEMO, sort_keys=True).encode())

    # -- whole bundles
    def get_build(self, key: str) -> Optional[BuildEntry]:
        """The bundle of a build whose recorded input files are all unchanged, or None."""
        e = self._read_entry("builds", key)
        if e is None:
            return None
        try:
            for path, sha in e["deps"].items():
                if sha256_file(path) != sha:
                    return None
            files = {name: self.get_blob(sha) for name, sha in e["files"].items()}
            if any(b is None for b in files.values()):
                self._drop("builds", key)
                return None
            return BuildEntry(files=files, rows=list(e["rows"]))
        except (KeyError, TypeError, AttributeError):
            self._drop("builds", key)
            return None

    def put_build(self, key: str, deps: dict[str, str], files: dict[str, bytes], rows: list[dict]) -> None:
        self._write_entry("builds", key, {"deps": deps, "files": {n: self.put_blob(b) for n, b in files.items()},
                                          "rows": rows})


def build_key(spec_path: str, archs: tuple[str, ...], options: dict[str, Any], tools: dict[str, str]) -> str:
    """The key of a whole build, computable before the spec file is imported.

    Args:
        spec_path: the spec file (its resolved path is part of the key; its bytes are a recorded input).
        archs: the target IDs asked for, in order.
        options: the flyc-build options that change the bundle (offload bundle, ISA, code object version).
        tools: the LLVM toolchain found, tool -> ``"<version> (<path>)"`` (empty when none is found).
    """
    return digest({"format": CACHE_FORMAT, "spec": str(Path(spec_path).resolve()), "archs": list(archs),
                   "options": options, "tools": tools, "flyship": __version__,
                   "flyship_source": flyship_fingerprint(), "packages": package_versions(),
                   "environment": dsl_environment()})


def open_cache(enabled: bool, warn: Callable[[str], None]) -> Optional[BuildCache]:
    """The user's cache, or None when turned off or its folder cannot be created (the build then compiles
    everything, and says why once)."""
    if not enabled:
        return None
    from flyship import env

    root = env.cache_dir()
    try:
        (root / f"v{CACHE_FORMAT}").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        warn(f"flyc-build: cache folder {root} cannot be created ({e}); building without the cache "
             "(set FLYSHIP_CACHE_DIR to a writable folder)")
        return None
    return BuildCache(root)
