"""The frontend protocol; the common tail every frontend's code object then goes through is
:mod:`flyship.compiler.frontends.tail`.

A frontend turns one (op, specialization, target) into a code object and the launch facts only it can
know (the grid, the block, what each kernel argument is bound to). Everything after that is the same for
every frontend and lives in :mod:`.tail` (``finish``); here are the protocol (:class:`Frontend`), what it is
given (:class:`BuildContext`, :class:`WorkerSetup`) and what it returns (:class:`KernelBuild`, then the
:class:`CompiledVariant` that crosses back to the build process).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import importlib.metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Optional, Sequence

from flyship.bundle import targets as _targets
from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.errors import BundleError
from flyship.bundle.manifest import KernargLayout, KernelMetadata, Launch, Proof, Workspace
from flyship.compiler.configs import Autotuned, Config
from flyship.errors import CompileError

if TYPE_CHECKING:  # the spec API imports the frontends (their registry); the frontends use its types in annotations
    from flyship.compiler.spec import OpDecl, Spec

# NVIDIA: 32-bit registers available to one block (CUDA C++ Programming Guide, "Technical Specifications
# per Compute Capability": 64 K registers per block for every sm_50 .. sm_120).
NV_REGISTERS_PER_BLOCK = 65536


class FrontendError(CompileError, RuntimeError):
    """A kernel failed to trace or compile; the message names op, specialization, target and the DSL's
    own message."""


class DSLError(FrontendError):
    """The DSL itself raised while tracing or compiling (its own message carried). Unlike flyship's own checks,
    which give the same answer every time, such a failure may come from state an earlier trace left in the
    process, so flyc-build retries it once in a fresh process."""


class ResourceError(FrontendError):
    """A compiled kernel exceeds a resource of its target (LDS / shared memory, registers, scratch spills,
    workgroup size). In a config space (docs/tuning.md) such a config is pruned, not a build failure."""


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
        trace_slot: a context manager factory; a :attr:`Frontend.pipelined` frontend holds it only while its
            DSL traces and compiles in this process (the CPU-bound part), so a build worker's assembly, proof
            and checks of one kernel overlap the next kernel's trace in another worker (flyc-build starts one
            worker more than ``-j`` and lets ``-j`` of them trace at once). Default: no limit.
    """

    workdir: Path
    toolchain: object | None
    code_object_version: Optional[int] = None
    keep_ir: bool = False
    rocm_root: Optional[Path] = None
    trace_slot: Callable[[], ContextManager[Any]] = contextlib.nullcontext


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
    """What a worker process knows before it imports the spec file (and with it the DSL).

    Attributes:
        target: the target ID this worker builds for.
        scratch_root: the build's scratch folder; a frontend puts its caches under it.
        rocm_root: ROCm-shaped toolkit root, when the build found an LLVM toolchain.
    """

    target: str
    scratch_root: Path
    rocm_root: Optional[Path]


@dataclasses.dataclass(frozen=True)
class KernelBuild:
    """What a frontend's :meth:`Frontend.compile` hands to the common tail (stays in the worker process).

    Attributes:
        target: the code object's own target ID (``sm_90a`` for an ``sm_90`` request with Triton).
        code_object: the code object bytes.
        format: ``hsaco`` or ``cubin``.
        symbol: kernel symbol.
        launch: grid expressions, block, dynamic LDS expression.
        proof: how the code object was shown equal to the frontend's own.
        toolchain: tool -> version for the manifest.
        example_grid: the grid the frontend itself computed for the example call.
        constraints: guard constraints the lowering relies on.
        alignment: tensor -> data pointer alignment the kernel needs, in bytes.
        tensor_abi: tensor -> ``static`` (bare pointer) or ``dynamic`` (pointer + shape/stride struct), as the
            frontend lowered it (FlyDSL); empty for frontends without layouts.
        isa: assembly text when ``keep_ir``.
        facts: the frontend's own facts for :meth:`Frontend.kernarg_layout` (never read by the tail).
        then: the kernels the call launches after this one, in order (a multi-launch op), each a build of its
            own; fields that name a workspace are bound to it by the tail.
        written: indices of the kernel's explicit parameters (code-object metadata order) whose pointers reach a
            store or an atomic in the kernel's IR (:mod:`flyship.compiler.frontends.writes`); None when the
            frontend could not read them (then nothing is checked).
        accumulated: the subset of ``written`` reached by an atomic read-modify-write (an atomic add, a CAS
            loop); an output written first that way must be declared ``Output(..., zero=True)``.
    """

    target: str
    code_object: bytes
    format: str
    symbol: str
    launch: Launch
    proof: Proof
    toolchain: dict[str, str]
    example_grid: tuple[int, int, int]
    constraints: tuple[str, ...] = ()
    alignment: dict[str, int] = dataclasses.field(default_factory=dict)
    tensor_abi: dict[str, str] = dataclasses.field(default_factory=dict)
    isa: Optional[str] = None
    facts: Any = None
    then: tuple["KernelBuild", ...] = ()
    written: Optional[frozenset[int]] = None
    accumulated: frozenset[int] = frozenset()
    unread: Optional[frozenset[int]] = None  # explicit parameters the IR never uses (writes.unread_stride)


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
        tensor_abi: tensor -> ``static`` / ``dynamic`` (see :class:`KernelBuild`).
        isa: assembly text when ``keep_ir``.
        seconds: wall time of the compile.
        then: the launches after this one (each a CompiledVariant without then or workspaces of its own).
        workspaces: the workspaces the launches share, their shapes over the inputs (constexprs written in).
        writes: the op's input tensors this launch stores through, as the write check found them.
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
    tensor_abi: dict[str, str] = dataclasses.field(default_factory=dict)
    isa: Optional[str] = None
    seconds: float = 0.0
    then: tuple["CompiledVariant", ...] = ()
    workspaces: tuple[Workspace, ...] = ()
    writes: tuple[str, ...] = ()  # the op's input tensors the kernel stores through (for op(..., mutable=True))


class Frontend(abc.ABC):
    """One DSL's way from a declaration to a code object.

    A frontend module is the only code that imports its DSL, and imports it lazily (inside the worker
    process of one target), so every frontend can be registered in a Python that lacks the others' DSLs.

    Attributes:
        name: the registry key and ``OpDecl.frontend`` (``"flydsl"``); also the manifest's
            ``build.frontends`` key and the ``toolchain`` key holding the DSL's version.
        title: how messages name one of its kernels (``"FlyDSL launcher"``).
        vendors: the vendors it builds for (``{"amd"}``, ``{"amd", "nvidia"}``).
        needs_llvm: whether its AMD builds need flyship's LLVM toolchain (assembler, linker, ROCm root).
        declares_grid: True when the op declares grid expressions (``op(grid=...)`` is required), False
            when the kernel computes its own grid (then ``grid=`` is refused).
        config_options: the ``Spec.options`` keys a tuning ``Config`` may set for this frontend's kernels
            (compile options, not constexprs); ``flyship.compiler.tuning.expand`` reads it from here, so the
            frontend that interprets the options is the one place that lists them. Default: none.
        packages: the DSL's top-level import packages, also its distribution names: the build cache keys them
            by their installed versions (:meth:`package_versions`) instead of walking their source, and a spec
            file that fails to import one of them gets :attr:`install_hint`. Default: none.
        env_prefixes: prefixes of the environment variables that steer the DSL's code generation (the build
            cache keys them; a Ray worker gets them); names containing ``CACHE`` or ``DUMP`` are left out.
        env_names: whole names of such variables (FlyDSL reads a bare ``ARCH``).
        install_hint: what to do when the build Python lacks the DSL (ends the import error's message).
        pipelined: True when :meth:`compile` holds ``ctx.trace_slot`` around its DSL trace only, so its
            post-trace steps (external assembler and linker, proof) overlap other kernels' traces; False (the
            default) makes the worker hold the slot around the whole compile.

    A new frontend is its own folder plus one line in ``flyship.compiler.frontends.FRONTEND_MODULES`` (or a
    :func:`flyship.compiler.frontends.register` call from any module: workers import that module too); nothing
    outside its folder names its DSL.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    vendors: ClassVar[frozenset[str]]
    needs_llvm: ClassVar[bool]
    declares_grid: ClassVar[bool]
    config_options: ClassVar[tuple[str, ...]] = ()
    packages: ClassVar[tuple[str, ...]] = ()
    env_prefixes: ClassVar[tuple[str, ...]] = ()
    env_names: ClassVar[tuple[str, ...]] = ()
    install_hint: ClassVar[str] = ""
    pipelined: ClassVar[bool] = False

    @abc.abstractmethod
    def accepts(self, kernel: Any) -> bool:
        """Whether ``kernel`` (the ``kernel=`` of an op declaration) is one of this DSL's kernels."""

    def prepare_planning(self, amd_target: Optional[str]) -> None:
        """Set what the DSL reads at import time in the build process, which imports the spec file to list its
        ops once per planning environment (``amd_target``: the AMD processor of that import, or None for the
        other vendors' targets; :mod:`flyship.compiler.declarations`), as the workers of those targets will see
        it. Default: nothing."""

    def prepare_worker(self, setup: WorkerSetup) -> None:
        """Set the worker process's environment before the spec file (and the DSL) is imported; runs once in
        each worker whose target's vendor this frontend builds for. Default: nothing."""

    def check_target(self, target: _targets.TargetID) -> None:
        """Refuse a requested target this frontend cannot build code objects for (checked for every op of the
        frontend before any worker starts). Default: accept every target of :attr:`vendors`.

        Raises:
            FrontendError: naming the target, why, and which target to ask for instead.
        """

    def target_environment(self, target: _targets.TargetID) -> dict[str, str]:
        """The environment variables a process that builds for ``target`` must start with, because the DSL reads
        them at import (a Ray worker's runtime environment). Default: none."""
        return {}

    def check_installed(self, targets: Sequence[_targets.TargetID]) -> None:
        """Refuse, before the spec file imports any DSL, an installed DSL this frontend cannot build with
        (called when a requested target is of one of :attr:`vendors`: ``targets`` are those). Default: accept.

        Raises:
            CompileError: naming the installed version, the supported ones and what to install.
        """

    def package_versions(self) -> dict[str, str]:
        """Each of :attr:`packages` -> its installed version, ``absent`` when not installed (read from the
        installed metadata: nothing is imported); part of every build cache key."""
        out = {}
        for name in self.packages:
            try:
                out[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                out[name] = "absent"
        return out

    def read_autotuner(self, kernel: Any) -> Optional[Autotuned]:
        """The bare kernel, configs, key and prune function of ``kernel`` when it is this DSL's autotuned kernel,
        else None (``op(kernel=<autotuned>)``: :func:`flyship.compiler.tuning.from_autotuner`). Default: None.

        Raises:
            SpecError: an autotuner whose configs flyship cannot build.
        """
        return None

    def compile_time_parameters(self, kernel: Any) -> dict[str, bool]:
        """The parameters of ``kernel`` (a bare launcher, as :meth:`read_autotuner` returns it) that the DSL bakes
        into the code, each with whether it has a default (an autotuned launcher's config may set one the op does
        not declare: :func:`flyship.compiler.spec._tuned_constexprs`). Default: none."""
        return {}

    def read_config(self, config: Any) -> Optional[Config]:
        """``config`` as a :class:`~flyship.compiler.configs.Config` when it is this DSL's own config object
        (``op(configs=[<DSL config>, ...])``), else None. Default: None.

        Raises:
            SpecError: a config flyship cannot launch.
        """
        return None

    def config_block(self, config: Config, target: _targets.TargetID) -> Optional[int]:
        """The threads per block a config launches with on ``target``, when known before compiling (a config space
        prunes a config over the target's maximum workgroup size); None when only the compile tells (the common
        tail checks the block then). Default: None."""
        return None

    def expand_specs(self, op: OpDecl) -> tuple[Spec, ...]:
        """The specializations ``op`` builds, in the order the loader tries them, from those it declares
        (Triton: the JIT's specialization for aligned inputs, then the generic one). Default: as declared."""
        return op.specs

    def twin_of(self, spec_name: str) -> Optional[str]:
        """The declared specialization that :meth:`expand_specs` made ``spec_name`` from (Triton: ``f32`` for
        ``f32__generic``), or None for a declared one. Default: None."""
        return None

    def build_note(self, op: OpDecl, spec: Spec, target: str) -> str:
        """A note for flyc-build's table on how this build differs from what the DSL's own JIT would run for the
        example call (empty: nothing to say). Default: empty."""
        return ""

    def check_declaration(self, op: OpDecl) -> None:
        """Refuse a declaration that cannot compile, before any worker starts. Default: accept.

        Raises:
            FrontendError: naming the op and what to change.
        """

    @abc.abstractmethod
    def version(self) -> str:
        """The installed DSL's version."""

    @abc.abstractmethod
    def compile(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext) -> KernelBuild:
        """Compile one specialization for one target (in that target's worker process).

        Raises:
            FrontendError: naming op, specialization and target, with the DSL's own message.
        """

    def read_metadata(self, build: KernelBuild, where: str) -> tuple[KernelMetadata, Optional[int]]:
        """The kernel's metadata from the code object itself, and its AMDHSA code object version (None for a
        cubin). Default: an hsaco's ``NT_AMDGPU_METADATA`` note.

        Raises:
            FrontendError: the code object cannot be read or has no such kernel.
        """
        try:
            co = CodeObjectFile(build.code_object, f"{where}: {build.symbol}.{build.format}")
            return co.kernel_metadata(build.symbol), co.code_object_version
        except BundleError as e:
            raise FrontendError(f"{where}: {e}") from None

    @abc.abstractmethod
    def kernarg_layout(self, build: KernelBuild, meta: KernelMetadata, where: str) -> KernargLayout:
        """Place each kernel argument's fields (what the loader writes there) at the metadata's offsets."""


def example_device(spec: Spec, target: str | None) -> dict[str, int] | None:
    """The device properties the example call sees: the spec's baked-in ``cu_count``, else the target's usual
    one (:func:`flyship.bundle.targets.example_cu_count`); None when neither is known."""
    if spec.cu_count is not None:
        return {"cu_count": spec.cu_count}
    n = _targets.example_cu_count(target) if target else None
    return None if n is None else {"cu_count": n}
