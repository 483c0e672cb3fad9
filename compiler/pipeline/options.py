"""What a build is asked (:class:`BuildOptions`), what it reports (:class:`Row`) and how it fails."""

from __future__ import annotations

import dataclasses
from typing import Optional

from flyship.bundle import manifest as M
from flyship.errors import CompileError


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """Options of one ``flyc-build`` run (the CLI parses into this).

    Attributes:
        spec_path: the spec file.
        out_dir: bundle directory to create.
        archs: target IDs (``gfx942``, ``gfx950``, ``sm_90``...).
        jobs: worker processes in all (at least one per target).
        force: replace an existing ``out_dir``.
        keep_ir: also write each code object's ``.s``.
        llvm_bin: folder with llvm-mc / ld.lld, searched first.
        offload_bundle: also write one clang offload bundle per specialization holding every AMD target.
        code_object_version: 5 or 6; None keeps what the frontend emitted.
        cache: reuse and fill the build cache (``FLYSHIP_CACHE_DIR``); ``--no-cache`` turns it off.
        executor: ``local`` (process pools on this machine) or ``ray[:ADDRESS]`` (a Ray cluster).
        keep_going: when kernels fail, still write a bundle of what built, with the failures recorded in the
            manifest (``failed``); :func:`build` then raises :class:`PartialBuildError` after writing it.
    """

    spec_path: str
    out_dir: str
    archs: tuple[str, ...]
    jobs: int = 1
    force: bool = False
    keep_ir: bool = False
    llvm_bin: Optional[str] = None
    offload_bundle: bool = False
    code_object_version: Optional[int] = None
    cache: bool = True
    executor: str = "local"
    keep_going: bool = False


class PartialBuildError(CompileError):
    """``--keep-going``: the bundle was written without the kernels that failed (listed, each with a next step).

    Attributes:
        rows: the summary rows of what built.
        failures: the manifest's ``failed`` entries.
    """

    def __init__(self, message: str, rows: list["Row"], failures: tuple[M.Failure, ...], details: str = "") -> None:
        super().__init__(message, details=details)
        self.rows = rows
        self.failures = failures


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the build's summary table: one launch of a compiled variant.

    Attributes:
        seconds: the compile time of the whole variant (all its launches compile in one task).
        symbol: the kernel's symbol.
        launch: which launch of one call this is, from 1 up to ``launches`` (1 of 1 for most ops).
    """

    op: str
    spec: str
    target: str
    vgprs: int
    sgprs: int
    lds: int
    kernarg_bytes: int
    seconds: float
    cached: bool = False
    occupancy: str = "n/a"
    symbol: str = ""
    launch: int = 1
    launches: int = 1
    note: str = ""  # how the build differs from the DSL's own JIT for the example call (Frontend.build_note)
