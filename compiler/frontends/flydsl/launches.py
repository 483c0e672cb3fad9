"""From one traced launcher call to the :class:`KernelBuild` of each kernel it launches: FlyDSL's artefacts,
our code object proved equal to FlyDSL's own, the host IR's grid and bindings, the parameters the kernel
writes.
"""

from __future__ import annotations

from typing import Any

from flyship.bundle.manifest import DTYPES, FIELD_TYPES, KernargField, KernargLayout, Launch
from flyship.compiler.frontends import writes
from flyship.compiler.frontends.base import BuildContext, FrontendError, KernelBuild, example_device
from flyship.compiler.frontends.flydsl import capture as _capture
from flyship.compiler.frontends.flydsl import host_ir
from flyship.compiler.frontends.flydsl import proof as _proof
from flyship.compiler.frontends.flydsl.capture import Compile
from flyship.compiler.frontends.flydsl.trace import LauncherCall
from flyship.compiler.spec import OpDecl, Spec, Tensor


def _artefacts(captured: Compile, name: str, where: str) -> tuple[str, list[bytes], list[str], Any]:
    """From one compile's capture: the ISA to assemble, FlyDSL's own code object(s), the host function's
    argument types before lowering and the lowered host function.

    Raises:
        FrontendError: an artefact is missing, naming what FlyDSL did instead.
    """
    if not captured.objects:
        raise FrontendError(f"{where}: FlyDSL's pipeline made no gpu.binary; FlyDSL writes it only when the compile "
                            "reaches the binary step (is ROCM_PATH a toolkit with ld.lld and the AMDGPU bitcode?)")
    if not captured.isa:
        raise FrontendError(f"{where}: FlyDSL's ROCDL serializer printed no ISA under the LLVM debug type "
                            f"{_capture.ISA_DEBUG_TYPE!r}; external codegen (FLYDSL_COMPILE_LLVM_DIR) does not "
                            "serialize in-process: unset it for flyc-build")
    origin = captured.origin_types.get(name)
    lowered = captured.lowered.get(name)
    if origin is None or lowered is None:
        found = sorted(captured.origin_types)
        raise FrontendError(f"{where}: expected host function {name!r} with gpu.launch_func and lowered arguments in "
                            f"FlyDSL's pipeline, got {'host functions ' + str(found) if found else 'no host function'}"
                            f"{'' if origin is None else ' (never lowered)'}; this FlyDSL lowers differently than "
                            "flyship knows")
    return captured.isa[0], [data for _, data in captured.objects], origin, lowered


def _unread(captured: Compile, symbol: str) -> frozenset[int] | None:
    """The kernel parameters its LLVM IR never uses (:func:`flyship.compiler.frontends.writes.llvm_unread_params`);
    None when this FlyDSL printed no IR of ``symbol`` (then nothing is judged)."""
    modules = [text for text in captured.llvm_ir if f"@{symbol}(" in text or f'@"{symbol}"(' in text]
    try:
        return frozenset(writes.llvm_unread_params(modules[-1], symbol)) if modules else None
    except ValueError:
        return None  # _written has already raised for IR it cannot read


def _written(captured: Compile, symbol: str, where: str) -> tuple[frozenset[int] | None, frozenset[int]]:
    """The kernel parameters whose pointers reach a store or an atomic in the LLVM IR the capture kept, and those
    that reach an atomic read-modify-write (:func:`flyship.compiler.frontends.writes.llvm_written_params`,
    :func:`~flyship.compiler.frontends.writes.llvm_accumulated_params`); (None, empty) when this FlyDSL printed
    none."""
    modules = [text for text in captured.llvm_ir if f"@{symbol}(" in text or f'@"{symbol}"(' in text]
    if not modules:
        return None, frozenset()
    try:
        return (frozenset(writes.llvm_written_params(modules[-1], symbol)),
                frozenset(writes.llvm_accumulated_params(modules[-1], symbol)))
    except ValueError as e:
        raise FrontendError(f"{where}: cannot read which parameters kernel {symbol} writes from its LLVM IR: {e}"
                            ) from None


def _layout(analysis: host_ir.HostAnalysis, meta, where: str) -> KernargLayout:
    """Place each kernel argument's fields at the metadata offset of that argument."""
    explicit = [a for a in meta.args if not a.hidden]
    if len(explicit) != len(analysis.kernel_args):
        raise FrontendError(f"{where}: the code object has {len(explicit)} explicit kernel arguments but the launcher "
                            f"passes {len(analysis.kernel_args)}")
    fields = []
    for i, (marg, plans, size) in enumerate(zip(explicit, analysis.kernel_args, analysis.kernel_arg_sizes)):
        if marg.size != size:
            raise FrontendError(f"{where}: kernel argument {i} is {marg.size} bytes in the code object metadata but "
                                f"{size} bytes as FlyDSL lowered it")
        for p in plans:
            fields.append(KernargField(
                offset=marg.offset + p.rel_offset, size=FIELD_TYPES[p.type], kind=p.kind, type=p.type, arg=p.arg,
                dim=p.dim, expr=p.expr, value=p.value, kernel_arg=marg.name or f"arg{i}"))
    extent = max((a.offset + a.size for a in explicit), default=0)
    return KernargLayout(size=extent, alignment=max(8, meta.kernarg_segment_align), fields=tuple(fields))


def _launch_builds(call: LauncherCall, isa: str, ours: bytes, theirs_all: list[bytes], origin_types: list[str],
                   lowered: Any, op: OpDecl, spec: Spec, target: str, ctx: BuildContext, flydsl_version: str,
                   ir: Any) -> list[KernelBuild]:
    """One build per ``gpu.launch_func`` of one launcher call, in launch order: a multi-phase launcher
    launches several kernels, all in the one code object FlyDSL built for that call."""
    analyses = host_ir.analyze_functions(origin_types, lowered, call.op, spec, ir,
                                         device=example_device(spec, target))
    alignment = {a.name: a.alignment or DTYPES[spec.dtypes[a.name]] for a in op.args if isinstance(a, Tensor)}
    builds = []
    for analysis in analyses:
        symbol = analysis.kernel_name
        written, accumulated = _written(call.compile, symbol, call.where)
        # A kernel with fast-math hints can carry several code objects in one gpu.binary (same code, other
        # target flags): ours must equal each of them, for every kernel it launches.
        proofs = [_proof.prove(ours, theirs, symbol, target) for theirs in theirs_all]
        builds.append(KernelBuild(
            target=target, code_object=ours, format="hsaco", symbol=symbol,
            launch=Launch(grid=analysis.grid, block=analysis.block, dynamic_lds=analysis.dynamic_lds),
            proof=proofs[0], toolchain={**ctx.toolchain.describe(), "flydsl": flydsl_version},
            example_grid=analysis.grid_at_example, constraints=analysis.constraints, alignment=alignment,
            tensor_abi=analysis.tensor_abi,
            isa=isa if ctx.keep_ir and not builds else None, facts=analysis,
            written=written, accumulated=accumulated, unread=_unread(call.compile, symbol)))
    return builds
