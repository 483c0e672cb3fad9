"""Assemble FlyDSL's ``final_isa.s`` into a linked AMDGPU code object (``.hsaco``).

Only what the assembler needs is read from the ISA, and the instructions are never edited:

* the ``.amdgcn_target "<triple>-<target id>"`` directive gives the ``-triple`` (FlyDSL up to 0.3.0 writes
  ``amdgcn-amd-amdhsa--gfxNNN``, later ``amdgcn-amd-amdhsa-unknown-gfxNNN``; the assembler refuses a
  directive whose triple differs from ``-triple``) and the processor and features (``-mcpu``/``-mattr``);
* ``.amdhsa_code_object_version N`` gives the code object version; asking for another version (5 or 6)
  rewrites this one directive and nothing else.

gfx11 / gfx12 (RDNA) are a toolchain limit, reported as one (:func:`_toolchain_limit`), not as a kernel error:
LLVM 22's AMDGPU printer writes ``.amdhsa_inst_pref_size`` as an MC expression over the code size
(``((instprefsize(.Lfunc_end0-k)<<4)&1008)>>4``) that llvm-mc 22 cannot parse ("expected ')'"). Writing the
value in (it is in FlyDSL's descriptor) was tried: the ISA then assembles, but llvm-mc encodes the unused
``src2`` of two-source VOP3 instructions as 0 where LLVM's code generator writes the inline constant 0 (0x80), so
``.text`` differs from FlyDSL's binary (9 instructions of the 2-D add) and the proof cannot show the two equal.

Code object v5 vs v6 (LLVM AMDGPUUsage "ELF Header" and "Code Object Metadata"; AMDGPUMetadata.h), checked
by assembling the same FlyDSL ISA both ways with LLVM 22: ``e_ident[EI_ABIVERSION]`` is 3 for v5
(ELFABIVERSION_AMDGPU_HSA_V5) and 4 for v6; the metadata version ``amdhsa.version`` is 1.2 for both
(VersionMinorV5 == VersionMinorV6 == 2); ``.text``, ``.rodata`` (kernel descriptors), the metadata note and
``e_flags`` are byte-identical for a specific processor. v6 adds only generic processors
(``gfx9-4-generic``...): their ``e_flags`` carry EF_AMDGPU_GENERIC_VERSION bits that v5 cannot express, and
llvm-mc silently drops them for v5, so a v5 build of a generic target is refused here. The ROCR loader
accepts v6 from ROCm 6.2.0; v5 also loads on older runtimes.

Then ``ld.lld -shared`` links, as FlyDSL itself does. A linked code object with undefined symbols is
refused (a device-library call that was never linked would only show at run time as "shared object init
failed").
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.errors import CodeObjectError

from flyship.compiler.toolchain import Toolchain, ToolchainError, assembler_args, run_tool

SUPPORTED_CODE_OBJECT_VERSIONS = (5, 6)
# amdhsa.version of the metadata for each code object version (AMDGPUMetadata.h: VersionMajorV5/V6,
# VersionMinorV5/V6).
METADATA_VERSION = {5: [1, 2], 6: [1, 2]}
_TARGET_RE = re.compile(r'^[ \t]*\.amdgcn_target[ \t]+"([^"]*)"', re.MULTILINE)
_VERSION_RE = re.compile(r"^([ \t]*\.amdhsa_code_object_version[ \t]+)(\d+)", re.MULTILINE)
_UNKNOWN_PROCESSOR = "is not a recognized processor"
# The metadata's copy of the target (``amdhsa.target: amdgcn-amd-amdhsa-unknown-gfx942`` in .amdgpu_metadata).
_META_TARGET_RE = re.compile(r"^([ \t]*amdhsa\.target:[ \t]+)(['\"]?)([^'\"\s]+)\2[ \t]*$", re.MULTILINE)


# The kinds of this module's ToolchainErrors, the words a failure reason starts with:
ASSEMBLE = "AssembleError"  # the ISA could not be assembled or linked, or the code object is unusable
# The ISA is right but this toolchain cannot reproduce FlyDSL's code object from it (a known LLVM limit for the
# target); no change to the kernel or the spec helps: the build's next step is chosen by this word
# (compiler/pipeline/running.py), and docs/spec-api.md names it.
TOOLCHAIN_LIMIT = "ToolchainLimitError"


@dataclasses.dataclass(frozen=True)
class IsaHeader:
    """What the assembler needs from an ISA file's directives.

    Attributes:
        triple: the triple of ``.amdgcn_target`` (``amdgcn-amd-amdhsa-unknown`` or ``amdgcn-amd-amdhsa``).
        target: the target ID (``gfx942``, ``gfx942:sramecc+:xnack-``, ``gfx9-4-generic``).
        code_object_version: ``.amdhsa_code_object_version``, or None when the file has none.
    """

    triple: str
    target: str
    code_object_version: int | None

    @property
    def processor(self) -> str:
        return self.target.split(":")[0]

    @property
    def features(self) -> frozenset[str]:
        return frozenset(self.target.split(":")[1:])


def read_isa_header(isa_text: str, where: str = "<isa>") -> IsaHeader:
    """Read the ``.amdgcn_target`` and ``.amdhsa_code_object_version`` directives.

    Args:
        isa_text: the AMDGPU assembly (FlyDSL's ``NN_final_isa.s``).
        where: a name for error messages.

    Returns:
        The header.

    Raises:
        ToolchainError (kind ASSEMBLE): no or several ``.amdgcn_target`` directives, a target string that is not
            ``<arch>-<vendor>-<os>-<environment>-<target id>``, or several version directives.
    """
    targets = _TARGET_RE.findall(isa_text)
    if len(targets) != 1:
        raise ToolchainError(f"read ISA {where}: expected one .amdgcn_target directive, got {len(targets)}; "
                             "pass the final_isa.s FlyDSL dumped (FLYDSL_DUMP_IR=1)", kind=ASSEMBLE)
    # "<arch>-<vendor>-<os>-<environment>-<target id>": the environment may be empty ("amdhsa--gfx942")
    # and processor names may hold dashes (gfx9-4-generic), so split on the first four dashes only.
    parts = targets[0].split("-", 4)
    if len(parts) != 5 or parts[0] != "amdgcn" or not parts[4].startswith("gfx"):
        raise ToolchainError(f"read ISA {where}: expected .amdgcn_target \"amdgcn-amd-amdhsa-<env>-gfxNNN\", "
                             f"got {targets[0]!r}", kind=ASSEMBLE)
    triple = "-".join(parts[:4]) if parts[3] else "-".join(parts[:3])
    versions = _VERSION_RE.findall(isa_text)
    if len(versions) > 1:
        raise ToolchainError(f"read ISA {where}: expected at most one .amdhsa_code_object_version, "
                             f"got {len(versions)}", kind=ASSEMBLE)
    return IsaHeader(triple, parts[4], int(versions[0][1]) if versions else None)


def set_code_object_version(isa_text: str, version: int, where: str = "<isa>") -> str:
    """The ISA with its ``.amdhsa_code_object_version`` directive set to ``version``; nothing else changes.

    Args:
        isa_text: the ISA.
        version: 5 or 6.
        where: a name for error messages.

    Returns:
        The new text (the same text when the version already matches).

    Raises:
        ToolchainError (kind ASSEMBLE): an unsupported version, a generic processor asked for v5, or no version
            directive.
    """
    header = read_isa_header(isa_text, where)
    if version not in SUPPORTED_CODE_OBJECT_VERSIONS:
        raise ToolchainError(f"set code object version of {where}: expected one of "
                             f"{SUPPORTED_CODE_OBJECT_VERSIONS}, got {version}", kind=ASSEMBLE)
    if version < 6 and "generic" in header.processor:
        raise ToolchainError(f"set code object version of {where}: expected a specific processor for v{version}, "
                             f"got the generic target {header.target}, which needs code object v6 (its ELF "
                             "e_flags carry the generic version); build v6 or a specific processor", kind=ASSEMBLE)
    if header.code_object_version == version:
        return isa_text
    if header.code_object_version is None:
        raise ToolchainError(f"set code object version of {where}: expected an .amdhsa_code_object_version "
                             "directive to change, got none", kind=ASSEMBLE)
    if header.code_object_version not in SUPPORTED_CODE_OBJECT_VERSIONS:
        raise ToolchainError(f"set code object version of {where}: expected an ISA declaring v5 or v6 (same "
                             f"metadata version {METADATA_VERSION[6]}), got v{header.code_object_version}; "
                             "assemble it at its own version", kind=ASSEMBLE)
    return _VERSION_RE.sub(lambda m: f"{m.group(1)}{version}", isa_text, count=1)


def set_target_features(isa_text: str, target: str, where: str = "<isa>") -> str:
    """The ISA of a bare processor (xnack and sramecc "any") declared for the target ID ``target``
    (``gfx942:sramecc+:xnack-``): the ``.amdgcn_target`` directive and the metadata's ``amdhsa.target`` get the
    features; no instruction or other directive changes.

    Sound because code compiled for a feature's "any" setting is correct under either setting (LLVM
    AMDGPUUsage, "Target Features": "any" code runs on both, possibly slower); the assembler then writes the
    requested settings into ``e_flags`` (EF_AMDGPU_FEATURE_XNACK/SRAMECC_V4) and the runtime loads the code object
    only on devices in that mode. Checked with LLVM 22 on FlyDSL's gfx942 ISA: ``.text`` and ``.rodata`` (kernel
    descriptors) byte-identical to the processor-only assembly, ``e_flags`` 0x54c -> 0xe4c.

    Args:
        isa_text: the ISA (FlyDSL's ``NN_final_isa.s``, for the bare processor).
        target: the target ID with features; a bare processor returns the text unchanged.
        where: a name for error messages.

    Returns:
        The new text.

    Raises:
        ToolchainError (kind ASSEMBLE): the ISA is for another processor, or already names features that differ.
    """
    header = read_isa_header(isa_text, where)
    processor = target.split(":")[0]
    if _same_target(header.target, target):
        return isa_text
    if header.processor != processor or header.features:
        raise ToolchainError(f"set target features of {where}: expected an ISA for the bare processor {processor} "
                             f"(features 'any'), got .amdgcn_target {header.triple}-{header.target}; compile for "
                             f"{processor} and let flyship declare {target}", kind=ASSEMBLE)
    out, n = _TARGET_RE.subn(lambda m: m.group(0).replace(f"-{header.target}\"", f"-{target}\""), isa_text, count=1)
    if n != 1:  # read_isa_header found exactly one
        raise ToolchainError(f"set target features of {where}: expected one .amdgcn_target directive to change",
                             kind=ASSEMBLE)
    return _META_TARGET_RE.sub(lambda m: m.group(1) + m.group(2) + (m.group(3) + target[len(processor):] if
                                                                     m.group(3).endswith(f"-{processor}") else
                                                                     m.group(3)) + m.group(2), out)


def _same_target(a: str, b: str) -> bool:
    pa, *fa = a.split(":")
    pb, *fb = b.split(":")
    return pa == pb and set(fa) == set(fb)


def assemble(
    isa_text: str,
    target: str,
    toolchain: Toolchain,
    workdir: str | Path,
    code_object_version: int | None = None,
    *,
    name: str | None = None,
) -> bytes:
    """Assemble and link FlyDSL's ISA into a code object.

    Runs ``llvm-mc -triple=<from .amdgcn_target> -mcpu=<processor> [-mattr=<features>] -filetype=obj``
    (or ``zig clang -target <triple> -mcpu=<target id> -c -x assembler``), then ``ld.lld -shared``.

    Args:
        isa_text: the ISA (FlyDSL's ``NN_final_isa.s``).
        target: the target ID it must be for (``gfx942``, ``gfx942:sramecc+:xnack-``); must equal the
            ISA's ``.amdgcn_target``.
        toolchain: the tools (:func:`flyship.compiler.toolchain.find_toolchain`).
        workdir: folder for ``<name>.s``, ``<name>.o`` and ``<name>.hsaco`` (kept for inspection).
        code_object_version: 5 or 6; None keeps what the ISA declares.
        name: file stem in ``workdir`` (default: the target with ``:`` as ``_``).

    Returns:
        The linked code object's bytes.

    Raises:
        ToolchainError (kind ASSEMBLE): the ISA is for another target, the assembler or linker failed (with its
            stderr, the target and the file), the result is not the requested code object version, or it has undefined
            symbols (named).

    Example:
        >>> hsaco = assemble(Path("22_final_isa.s").read_text(), "gfx942", find_toolchain(), "/tmp/w")  # doctest: +SKIP
    """
    stem = name or target.replace(":", "_")
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    src, obj, out = work / f"{stem}.s", work / f"{stem}.o", work / f"{stem}.hsaco"
    isa_text, header, want_version = _prepare(isa_text, target, code_object_version, src)
    operation = f"assemble {src} for {target}"
    try:
        r = run_tool(toolchain.assembler, assembler_args(toolchain, header.triple, header.target, src, obj),
                     operation=operation)
    except ToolchainError as e:
        raise (_toolchain_limit(str(e), toolchain, header, operation)
               or ToolchainError(str(e), kind=ASSEMBLE)) from None
    _check_assembler_stderr(r.stderr, toolchain, header, operation)
    try:
        run_tool(toolchain.linker, ["-shared", str(obj), "-o", str(out)], operation=f"link {obj} for {target}")
    except ToolchainError as e:
        raise ToolchainError(str(e), kind=ASSEMBLE) from None
    data = out.read_bytes()
    check_linked(data, str(out), want_version)
    return data


def _prepare(isa_text: str, target: str, code_object_version: int | None, src: Path) -> tuple[str, IsaHeader,
                                                                                                int | None]:
    """Check the ISA is for ``target``, set its code object version, write it to ``src`` (kept for inspection).

    Returns:
        The text to assemble, its header and the code object version the result must have.
    """
    header = read_isa_header(isa_text, str(src))
    if not _same_target(header.target, target):
        raise ToolchainError(f"assemble {src}: expected an ISA for target {target}, got .amdgcn_target "
                             f"{header.triple}-{header.target}; pass the ISA FlyDSL compiled for {target} "
                             "(set FLYDSL_GPU_ARCH per build)", kind=ASSEMBLE)
    if code_object_version is not None:
        isa_text = set_code_object_version(isa_text, code_object_version, str(src))
    want_version = code_object_version if code_object_version is not None else header.code_object_version
    src.write_text(isa_text)
    return isa_text, header, want_version


def _toolchain_limit(stderr: str, toolchain: Toolchain, header: IsaHeader,
                     operation: str) -> ToolchainError | None:
    """The error for an assembler failure that is a known limit of the toolchain rather than of the kernel
    (module docstring: ``instprefsize`` on gfx11 / gfx12), or None for any other failure."""
    if "instprefsize" not in stderr:
        return None
    return ToolchainError(
        f"{operation}: expected {toolchain.assembler.name} {toolchain.assembler.describe()} to parse the ISA FlyDSL "
        f"wrote for {header.processor}, got a toolchain limit, not a kernel or spec error: its parser cannot read "
        "the .amdhsa_inst_pref_size (instprefsize(...)) expression that LLVM's own AMDGPU printer writes for "
        "gfx11 / gfx12 targets, and FlyDSL's binary cannot be reproduced from that ISA (the proof would fail) "
        f"with this LLVM; build FlyDSL ops for CDNA targets (gfx942, gfx950), limit the spec with "
        f"Spec(targets=...) or pass --keep-going to ship the rest (the loader falls back to the reference on "
        f"{header.processor}), or build Triton kernels for it (Triton ships its own code object)\n"
        f"assembler output:\n{stderr.strip()[:2000]}", kind=TOOLCHAIN_LIMIT)


def _check_assembler_stderr(stderr: str, toolchain: Toolchain, header: IsaHeader, operation: str) -> None:
    if _UNKNOWN_PROCESSOR in stderr:  # llvm-mc only warns and exits 0 on an unknown processor
        raise ToolchainError(f"{operation}: expected {toolchain.assembler.name} {toolchain.assembler.describe()} "
                             f"to know {header.processor}, got: {stderr.strip()}; run check_targets first",
                             kind=ASSEMBLE)


class Assembler:
    """llvm-mc and ld.lld started BEFORE the ISA exists, so their start-up (loading libLLVM, ~30-70 ms of wall
    time each on a loaded machine, most of their cost) overlaps the DSL's compile; :meth:`assemble` then hands
    them the ISA.

    llvm-mc reads the ISA on stdin and writes the object into a FIFO; ld.lld, started on that FIFO, reads it
    as a stream (LLVM reads a non-regular file to EOF) and writes the code object. The result is the same
    bytes as :func:`assemble` (``tests/compiler/test_assemble.py`` compares both). Where the tools cannot be
    started early (a clang driver renames its output into place, replacing a FIFO; no ``os.mkfifo``), or the
    ISA turns out to need another triple or target than the one guessed, :meth:`assemble` runs
    :func:`assemble`. Use as a context manager: leaving it ends both processes if they still run.

    Example:
        >>> with Assembler(toolchain, "gfx942", "amdgcn-amd-amdhsa-unknown", "/tmp/w") as a:  # doctest: +SKIP
        ...     hsaco = a.assemble(isa_text)
    """

    def __init__(self, toolchain: Toolchain, target: str, triple: str, workdir: str | Path, *,
                 name: str | None = None):
        self.toolchain, self.target, self.triple = toolchain, target, triple
        self.work = Path(workdir)
        self.stem = name or target.replace(":", "_")
        self._mc: subprocess.Popen | None = None
        self._lld: subprocess.Popen | None = None
        self._argv: tuple[list[str], list[str]] = ([], [])

    def __enter__(self) -> Assembler:
        if self.toolchain.assembler_is_clang or not hasattr(os, "mkfifo"):
            return self
        self.work.mkdir(parents=True, exist_ok=True)
        fifo, out = self.work / f"{self.stem}.o", self.work / f"{self.stem}.hsaco"
        os.mkfifo(fifo)
        mc = [*self.toolchain.assembler.argv, *assembler_args(self.toolchain, self.triple, self.target, Path("-"),
                                                              fifo)]
        lld = [*self.toolchain.linker.argv, "-shared", str(fifo), "-o", str(out)]
        self._argv = (mc, lld)
        try:
            self._lld = subprocess.Popen(lld, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
            self._mc = subprocess.Popen(mc, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        except OSError:
            self._end()  # assemble() runs them the usual way and reports the error
        return self

    def __exit__(self, *exc: object) -> None:
        self._end()

    def _end(self) -> None:
        for p in (self._mc, self._lld):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.communicate()
        self._mc = self._lld = None

    def assemble(self, isa_text: str, code_object_version: int | None = None) -> bytes:
        """Assemble and link ``isa_text``, as :func:`assemble` does.

        Raises:
            ToolchainError (kind ASSEMBLE): as :func:`assemble`.
        """
        header = read_isa_header(isa_text, f"{self.stem}.s")
        if self._mc is None or header.triple != self.triple or not _same_target(header.target, self.target):
            self._end()
            fallback = self.work / "sequential"
            return assemble(isa_text, self.target, self.toolchain, fallback, code_object_version, name=self.stem)
        src, out = self.work / f"{self.stem}.s", self.work / f"{self.stem}.hsaco"
        isa_text, header, want_version = _prepare(isa_text, self.target, code_object_version, src)
        operation = f"assemble {src} for {self.target}"
        mc, lld = self._mc, self._lld
        try:
            _, mc_err = mc.communicate(isa_text, timeout=600)
            if mc.returncode != 0:
                self._end()
                limit = _toolchain_limit(mc_err, self.toolchain, header, operation)
                if limit is not None:
                    raise limit
                raise ToolchainError(f"{operation}: expected {self.toolchain.assembler.name} "
                                     f"{self.toolchain.assembler.describe()} to succeed, got exit {mc.returncode}:\n"
                                     f"{mc_err.strip()}\ncommand: {' '.join(self._argv[0])} < {src}", kind=ASSEMBLE)
            _check_assembler_stderr(mc_err, self.toolchain, header, operation)
            lld_out, lld_err = lld.communicate(timeout=600)
            if lld.returncode != 0:
                raise ToolchainError(f"link {src.with_suffix('.o')} for {self.target}: expected "
                                     f"{self.toolchain.linker.name} {self.toolchain.linker.describe()} to succeed, got "
                                     f"exit {lld.returncode}:\n{(lld_err or lld_out).strip()}\ncommand: "
                                     f"{' '.join(self._argv[1])}", kind=ASSEMBLE)
        except subprocess.TimeoutExpired:
            raise ToolchainError(f"{operation}: expected the assembler and linker to finish within 600 s",
                                 kind=ASSEMBLE) from None
        finally:
            self._end()
        data = out.read_bytes()
        check_linked(data, str(out), want_version)
        return data


def check_linked(data: bytes, where: str, code_object_version: int | None = None) -> None:
    """Refuse a linked code object that cannot load: undefined symbols, or another code object version.

    Args:
        data: the code object.
        where: its name for messages.
        code_object_version: the version it must have (``e_ident[EI_ABIVERSION]``), or None.

    Raises:
        ToolchainError (kind ASSEMBLE): undefined symbols (named; usually a device-library function such as ``__ocml_*``
            that FlyDSL links from bitcode but plain assembly cannot), the wrong version, or the wrong
            metadata version.
    """
    try:
        co = CodeObjectFile(data, where)
        undefined = co.undefined_symbols()
        version = co.code_object_version
        meta_version = list(co.metadata.get("amdhsa.version", []))
    except CodeObjectError as e:
        raise ToolchainError(f"check linked code object {where}: {e}", kind=ASSEMBLE) from None
    if undefined:
        raise ToolchainError(
            f"check linked code object {where}: expected no undefined symbols, got {', '.join(undefined)}; the "
            "kernel calls functions that were never linked in (device-library calls need FlyDSL's bitcode link, "
            "and the HIP runtime would only report 'shared object init failed'); avoid the call or inline it",
                             kind=ASSEMBLE)
    if code_object_version is not None and version != code_object_version:
        raise ToolchainError(f"check linked code object {where}: expected code object v{code_object_version}, "
                             f"got v{version} (e_ident ABI version)", kind=ASSEMBLE)
    if version in METADATA_VERSION and meta_version and meta_version != METADATA_VERSION[version]:
        raise ToolchainError(f"check linked code object {where}: expected metadata amdhsa.version "
                             f"{METADATA_VERSION[version]} for code object v{version}, got {meta_version}",
                             kind=ASSEMBLE)


__all__ = ["ASSEMBLE", "TOOLCHAIN_LIMIT", "Assembler", "IsaHeader", "read_isa_header", "set_code_object_version",
           "set_target_features", "assemble", "check_linked", "SUPPORTED_CODE_OBJECT_VERSIONS"]
