"""Everything that differs between FlyDSL releases, one adapter class per range of versions.

flyc-build runs in the user's Python with the FlyDSL that is already there (flyship never installs or
replaces it), so the compile stage meets every release from :data:`OLDEST` to :data:`NEWEST`. What
changed between them, measured on these machines (docs/flydsl-versions.md has the table):

* how to compile without a GPU: ``COMPILE_ONLY=1`` (bare name) and a direct call of the ``@flyc.jit``
  launcher with CPU tensors as placeholders works in every release; ``flyc.compile`` returns a
  ``CompiledFunction`` only from 0.4.0 (in 0.1.5 it aborts the process wanting ``libamdhip64.so.7``);
* the ISA dump: ``21_final_isa.s`` up to 0.3.2, ``22_final_isa.s`` from 0.3.4;
* the ``.amdgcn_target`` triple: ``amdgcn-amd-amdhsa--gfxNNN`` up to 0.3.0,
  ``amdgcn-amd-amdhsa-unknown-gfxNNN`` from 0.3.1;
* the tensor ABI: a torch tensor is a static layout (the kernel argument is a bare pointer, the shape is
  compiled in) before 0.2.0, a dynamic layout (pointer + packed struct of its dynamic shape and stride
  values) from 0.2.0;
* the authoring API: ``IntTuple.unpack()`` from 0.2.0 (``to_py_value()`` before), ``fx.make_rmem_tensor``
  from 0.1.8 (``fx.memref_alloca`` before), ``flydsl.compiler.jit_function._create_mlir_context`` from
  0.1.8.

The rest of the frontend asks the adapter (:func:`current`), never ``flydsl.__version__``. Adding a
release: docs/flydsl-versions.md, "Adding a FlyDSL version".
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar, MutableMapping

from flyship.errors import CompileError

Version = tuple[int, ...]

OLDEST = "0.1.5"  # the oldest release flyship builds with (the version matrix tests it)
NEWEST = "0.5.0"  # the newest release flyship has been tested with

TENSOR_ABIS = ("static", "dynamic")


class FlydslVersionError(CompileError, RuntimeError):
    """The installed FlyDSL is missing, unreadable or outside the supported range."""


def parse_version(text: str) -> Version:
    """``"0.3.4.1"`` -> ``(0, 3, 4, 1)``; a local or pre-release suffix (``+rocm``, ``.dev12``, ``rc1``) is
    dropped, so a development build counts as the release it leads to.

    Raises:
        FlydslVersionError: the text does not start with a dotted version.
    """
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", text or "")
    if not m:
        raise FlydslVersionError(f"FlyDSL version: expected a dotted version like 0.5.0, got {text!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def _fmt(v: Version) -> str:
    return ".".join(map(str, v))


class FlydslAdapter:
    """The facts and methods of one range of FlyDSL releases, ``[first, until)``.

    Subclasses override only what changed at their first release.
    """

    first: ClassVar[Version]
    until: ClassVar[Version]  # exclusive
    #: what a torch tensor becomes at the launcher's boundary: ``static`` (bare pointer) or ``dynamic``
    tensor_abi: ClassVar[str] = "dynamic"
    #: the environment component of the ``.amdgcn_target`` triple (``""`` gives ``amdgcn-amd-amdhsa--gfxNNN``)
    triple_env: ClassVar[str] = "unknown"
    #: ``flyc.compile`` returns a ``CompiledFunction`` without a GPU (else: call the launcher)
    compile_returns_function: ClassVar[bool] = False
    #: authoring API: ``IntTuple.unpack`` exists (else ``to_py_value``)
    has_unpack: ClassVar[bool] = True
    #: authoring API: ``fx.make_rmem_tensor`` exists (else ``fx.memref_alloca``)
    has_rmem_tensor: ClassVar[bool] = True

    def __init__(self, version: str):
        self.version = version
        self.parsed = parse_version(version)

    # -- the dump --------------------------------------------------------------------------------
    def isa_dump_name(self) -> str:
        """The file name of the final ISA in a kernel's dump folder (its stage number moved)."""
        return "22_final_isa.s" if self.parsed >= (0, 3, 4) else "21_final_isa.s"

    @property
    def triple(self) -> str:
        """The triple of the ``.amdgcn_target`` directive this range writes."""
        return f"amdgcn-amd-amdhsa-{self.triple_env}"

    def check_isa_target(self, isa: str, where: str) -> None:
        """The ISA's ``.amdgcn_target`` has this range's triple (else the adapter table is wrong for this
        release, and so may be the rest of what it says).

        Raises:
            FlydslVersionError: naming both triples and the FlyDSL version.
        """
        m = re.search(r'^[ \t]*\.amdgcn_target[ \t]+"([^"]*)"', isa, re.M)
        if not m:
            return  # the assembler reports a missing directive with more context
        got = "-".join(m.group(1).split("-")[:4])
        if got != self.triple:
            raise FlydslVersionError(
                f"{where}: expected .amdgcn_target triple {self.triple!r} from FlyDSL {self.version} "
                f"({type(self).__name__}), got {got!r}; the version adapter does not fit this release: see "
                "docs/flydsl-versions.md, 'Adding a FlyDSL version'")

    # -- compiling without a GPU -----------------------------------------------------------------
    def environment(self) -> dict[str, str | None]:
        """Environment for a compile-only process, set before ``flydsl`` is imported (None: unset it).

        The IR dump stays off: flyship takes the ISA, FlyDSL's code object and the host function from the
        normal compile (``capture.py``); a dump would run each pipeline stage in its own pass manager.
        """
        return {"COMPILE_ONLY": "1", "FLYDSL_DUMP_IR": None, "FLYDSL_DEBUG_DUMP_ASM": None,
                "FLYDSL_RUNTIME_ENABLE_CACHE": "0"}

    def compile(self, launcher: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Trace and compile ``launcher`` for the placeholder CPU tensors without launching anything.

        Every release compiles on a direct call under ``COMPILE_ONLY=1``.
        """
        launcher(*args, **kwargs)

    def mlir_context(self) -> Any:
        """An MLIR context with FlyDSL's dialects loaded, to parse dumped stages (``host_ir.analyze``)."""
        from flydsl.compiler.jit_function import _create_mlir_context

        return _create_mlir_context()


class Flydsl01(FlydslAdapter):
    """0.1.5 ... 0.1.8: static-layout tensors (bare pointer, shape compiled in), ``--`` triple."""

    first, until = (0, 1, 5), (0, 2, 0)
    tensor_abi = "static"
    triple_env = ""
    has_unpack = False

    @property
    def has_rmem_tensor(self) -> bool:  # type: ignore[override]
        return self.parsed >= (0, 1, 8)

    def mlir_context(self) -> Any:
        from flydsl._mlir import ir

        ctx = ir.Context()
        ctx.load_all_available_dialects()
        return ctx


class Flydsl02(FlydslAdapter):
    """0.2.0 ... 0.3.0: dynamic-layout tensors (pointer + shape/stride struct), ``--`` triple."""

    first, until = (0, 2, 0), (0, 3, 1)
    triple_env = ""


class Flydsl031(FlydslAdapter):
    """0.3.1 ... 0.3.4.1: ``-unknown-`` triple; kernels carry ``.reqd_workgroup_size``."""

    first, until = (0, 3, 1), (0, 4, 0)


class Flydsl04(FlydslAdapter):
    """0.4.0 ... 0.5.x: ``flyc.compile`` compiles for CPU placeholder tensors and returns a
    ``CompiledFunction`` (without ``COMPILE_ONLY``; with it, the same compile and None)."""

    first, until = (0, 4, 0), (0, 6, 0)
    compile_returns_function = True

    def environment(self) -> dict[str, str | None]:
        return {**super().environment(), "COMPILE_ONLY": None}

    def compile(self, launcher: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
        import flydsl.compiler as flyc

        compiled = flyc.compile(launcher, *args, **kwargs)
        if compiled is None and not os.environ.get("COMPILE_ONLY"):
            raise FlydslVersionError(f"flyc.compile: expected a CompiledFunction from FlyDSL {self.version}, got "
                                     "None; the version adapter does not fit this release")


ADAPTERS: tuple[type[FlydslAdapter], ...] = (Flydsl01, Flydsl02, Flydsl031, Flydsl04)


def supported_range() -> str:
    return f"{OLDEST} to {NEWEST}"


def adapter_for(version: str) -> FlydslAdapter:
    """The adapter of the range holding ``version``.

    Raises:
        FlydslVersionError: the version is outside every range, naming the supported range.
    """
    v = parse_version(version)
    if parse_version(OLDEST) <= v:
        for cls in ADAPTERS:
            if cls.first <= v < cls.until:
                return cls(version)
    raise FlydslVersionError(
        f"FlyDSL version: expected {supported_range()}, got {version}; flyc-build uses the FlyDSL already "
        f"installed in this Python ({os.environ.get('VIRTUAL_ENV') or 'the running interpreter'}): run it under a "
        "Python whose FlyDSL is in that range (flyship never installs or replaces FlyDSL)")


def installed_version() -> str:
    """``flydsl.__version__`` of the FlyDSL this Python imports (the package metadata when the module
    does not say).

    Raises:
        FlydslVersionError: FlyDSL is not installed here.
    """
    try:
        import flydsl
    except ImportError as e:
        raise FlydslVersionError(
            f"FlyDSL: expected an importable flydsl ({supported_range()}), got {type(e).__name__}: {e}; run "
            "flyc-build with the Python that has FlyDSL (flyship's 'compiler' extra does not install it)") from None
    v = getattr(flydsl, "__version__", None)
    if not v:
        from importlib.metadata import version as _dist_version

        v = _dist_version("flydsl")
    return str(v)


_CURRENT: FlydslAdapter | None = None


def current() -> FlydslAdapter:
    """The adapter for the installed FlyDSL (imports ``flydsl``; cached per process).

    Raises:
        FlydslVersionError: FlyDSL missing or outside the supported range.
    """
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = adapter_for(installed_version())
    return _CURRENT


def apply_compile_environment(environ: MutableMapping[str, str]) -> None:
    """Set the installed release's compile-only environment in ``environ`` before ``flydsl`` is imported
    (the newest range's when FlyDSL is absent or unsupported: the version check reports that, earlier)."""
    installed = installed_version_without_import()
    try:
        env = adapter_for(installed or NEWEST).environment()
    except FlydslVersionError:
        env = adapter_for(NEWEST).environment()
    for k, v in env.items():
        if v is None:
            environ.pop(k, None)
        else:
            environ[k] = v


def check_installed() -> str | None:
    """At flyc-build's start: the installed FlyDSL's version (None when there is none), checked against
    the supported range without importing it.

    Raises:
        FlydslVersionError: FlyDSL is installed but outside the supported range.
    """
    installed = installed_version_without_import()
    if installed is not None:
        adapter_for(installed)
    return installed


def installed_version_without_import() -> str | None:
    """The installed FlyDSL's version from package metadata, without importing it (None when absent)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _dist_version

    try:
        return _dist_version("flydsl")
    except PackageNotFoundError:
        return None


def requires(minimum: str, why: str = "") -> None:
    """A spec or kernel module that needs a newer FlyDSL than :data:`OLDEST` says so first, before it imports
    what the older release lacks (``requires("0.5.0", "fx.struct")`` at the top of the spec file): an older
    FlyDSL is then refused naming both versions, before any import of the kernels or tracing.

    Raises:
        FlydslVersionError: FlyDSL is older than ``minimum``.
        ModuleNotFoundError: FlyDSL is not installed (as ``import flydsl`` would raise).
    """
    import sys

    need = parse_version(minimum)
    caller = sys._getframe(1).f_code.co_filename
    installed = installed_version_without_import()
    if installed is None:  # no FlyDSL at all: as importing it would fail, so flyc-build names the Python to use
        raise ModuleNotFoundError(f"No module named 'flydsl' ({caller} needs FlyDSL >= {minimum})", name="flydsl")
    if parse_version(installed) < need:
        raise FlydslVersionError(
            f"{caller}: expected FlyDSL >= {minimum}{f' (for {why})' if why else ''}, got "
            f"{installed or 'none installed'}; run flyc-build under a Python whose FlyDSL is >= {minimum} "
            "(flyship never installs or replaces FlyDSL), or build another spec")
