"""Frontends turn one (op, specialization, target) into a verified code object and its launch facts.

Each frontend module exposes ``compile_variant(op, spec, target, ctx) -> CompiledVariant`` and is the
only code that imports its DSL (``flydsl`` or ``triton``), lazily, inside the worker process that
builds ``target``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from flyship.bundle.manifest import KernargLayout, KernelMetadata, Launch, Proof
from flyship.errors import CompileError


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """What a frontend needs besides the op: tools, scratch space, options.

    Attributes:
        workdir: a fresh temporary folder for this variant (never the user's cwd).
        toolchain: the LLVM toolchain (``flyship.compiler.toolchain.Toolchain``), or None when the
            frontend needs none (Triton ships its own).
        code_object_version: AMDHSA code object version to emit (5 or 6), None for the frontend's own.
        keep_ir: keep the ISA text in the result.
        rocm_root: ROCm-shaped root for FlyDSL's link step.
    """

    workdir: Path
    toolchain: object | None
    code_object_version: Optional[int] = None
    keep_ir: bool = False
    rocm_root: Optional[Path] = None


@dataclasses.dataclass(frozen=True)
class CompiledVariant:
    """The result of compiling one specialization for one target (picklable: crosses processes).

    Attributes:
        target: target ID (``gfx942``, ``sm_90``).
        code_object: the code object bytes (hsaco or cubin).
        format: ``hsaco`` or ``cubin``.
        symbol: kernel symbol.
        code_object_version: AMDHSA version or None.
        metadata: read from the code object.
        kernargs: kernarg layout with bindings to the op's arguments.
        launch: grid expressions, block, dynamic LDS.
        proof: how the code object was shown equal to the frontend's own.
        toolchain: tool -> version for the manifest.
        example_grid: the grid the frontend itself computed for the example shapes.
        constraints: guard constraints derived from the lowering (static strides, shapes).
        alignment: tensor -> data pointer alignment the kernel needs, in bytes.
        isa: assembly text when ``keep_ir``.
        seconds: wall time of the compile.
    """

    target: str
    code_object: bytes
    format: str
    symbol: str
    code_object_version: Optional[int]
    metadata: KernelMetadata
    kernargs: KernargLayout
    launch: Launch
    proof: Proof
    toolchain: dict[str, str]
    example_grid: tuple[int, int, int]
    constraints: tuple[str, ...] = ()
    alignment: dict[str, int] = dataclasses.field(default_factory=dict)
    isa: Optional[str] = None
    seconds: float = 0.0


class FrontendError(CompileError, RuntimeError):
    """A kernel failed to trace or compile; the message names op, specialization, target and the DSL's
    own message."""


def get(frontend: str):
    """The frontend module for ``"flydsl"`` or ``"triton"``."""
    if frontend == "flydsl":
        from flyship.compiler.frontends import flydsl as mod
    elif frontend == "triton":
        from flyship.compiler.frontends import triton as mod
    else:
        raise FrontendError(f"frontend: expected 'flydsl' or 'triton', got {frontend!r}")
    return mod
