"""The common tail every frontend's code object goes through (:func:`finish`), after :meth:`Frontend.compile`: read the
code object's metadata, lay out the kernarg segment against it, check the kernel's resources against the target, check
what it writes against the op's declaration, and check the declared example against the grid and the guard. The result
is a :class:`~flyship.compiler.frontends.base.CompiledVariant`, which crosses back to the build process. The protocol a
frontend implements is :mod:`flyship.compiler.frontends.base`."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.bundle import rules as _rules
from flyship.bundle.manifest import KernargLayout, KernelMetadata, Launch, Workspace
from flyship.bundle.rules import check_layout
from flyship.compiler.frontends import writes as _writes
from flyship.compiler.frontends.base import (NV_REGISTERS_PER_BLOCK, BuildContext, CompiledVariant, Frontend,
                                             FrontendError, KernelBuild, ResourceError, example_device)
from flyship.compiler.spec.params import Scalar, Tensor

if TYPE_CHECKING:  # annotations only: the spec package imports the frontends (see base.py)
    from flyship.compiler.spec import OpDecl, Spec


def compile_variant(fe: Frontend, op: OpDecl, spec: Spec, target: str, ctx: BuildContext) -> CompiledVariant:
    """Compile one (op, specialization, target) with ``fe`` and run the common tail on the result.

    Raises:
        FrontendError: from the frontend or the tail, naming op, specialization and target.
    """
    t0 = time.perf_counter()
    build = fe.compile(op, spec, target, ctx)
    v = finish(fe, op, spec, build, f"op {op.name} spec {spec.name} target {target}")
    return dataclasses.replace(v, seconds=time.perf_counter() - t0)


def finish(fe: Frontend, op: OpDecl, spec: Spec, build: KernelBuild, where: str) -> CompiledVariant:
    """The common tail: code-object metadata -> kernarg layout -> resources -> example check, for the kernel and
    each kernel the call launches after it (``build.then``); fields naming a workspace are bound to it.

    Raises:
        FrontendError: a layout that does not tile the metadata's explicit arguments, a kernel over the
            target's limits, or an example that contradicts the grid or the guard.
    """
    workspaces = tuple(Workspace(name=w.name, shape=op.workspace_shape(w, spec), dtype=w.dtype, zero=w.zero)
                       for w in op.workspaces)
    shapes = op.example_shapes(spec)
    scalars = {k: v for k, v in op.example_scalars(spec).items() if isinstance(v, int) and not isinstance(v, bool)}
    device = example_device(spec, build.target)  # a workspace may have one row per CU/SM (device.cu_count)
    for w in workspaces:
        try:
            sizes = [_expr.evaluate_with_shapes(e, shapes, scalars, device=device) for e in w.shape]
        except BundleError as e:
            raise FrontendError(f"{where}: workspace {w.name} shape {list(w.shape)} at the example: {e}") from None
        if any(n < 0 for n in sizes):
            raise FrontendError(f"{where}: workspace {w.name} shape {list(w.shape)} is {sizes} at the example; "
                                "expected sizes >= 0")
    first = _finish_one(fe, op, spec, build, where, workspaces)
    then = tuple(_finish_one(fe, op, spec, b, f"{where} launch {k + 2}", workspaces)
                 for k, b in enumerate(build.then))
    check_unread([(build, first, where), *((b, v, f"{where} launch {k + 2}")
                                           for k, (b, v) in enumerate(zip(build.then, then)))],
                 op.example_strides(spec))
    # A variant built as Triton's JIT would for the example call takes an int equal to 1 as a constant and may fold
    # away the branch that writes an output; the generic variant beside it is the one that shows what the kernel
    # can write, so only variants that pin no int by its value are judged for unwritten outputs.
    check_accumulation(op, workspaces, [(build, first, where), *((b, v, f"{where} launch {k + 2}")
                                                                for k, (b, v) in enumerate(zip(build.then, then)))],
                       judge_unwritten=spec.options.get("specialize") != "jit")
    if not then and not workspaces:
        return first
    constraints = tuple(dict.fromkeys(c for v in (first, *then) for c in v.constraints))
    alignment: dict[str, int] = {}
    for v in (first, *then):
        for k, a in v.alignment.items():
            alignment[k] = max(alignment.get(k, 1), a)
    return dataclasses.replace(first, then=then, workspaces=workspaces, constraints=constraints, alignment=alignment)


def bind_workspaces(layout: KernargLayout, workspaces: tuple[Workspace, ...]) -> KernargLayout:
    """A frontend binds a workspace parameter like a tensor; the loader knows it as a workspace: its pointer
    becomes a ``workspace`` field, its sizes and (contiguous) strides ``expr`` fields over the inputs."""
    shapes = {w.name: w.shape for w in workspaces}
    fields = []
    for f in layout.fields:
        if f.arg in shapes and f.kind == "pointer":
            f = dataclasses.replace(f, kind="workspace")
        elif f.arg in shapes and f.kind in ("shape", "stride"):
            dims = shapes[f.arg]
            d = f.dim % len(dims)
            text = dims[d] if f.kind == "shape" else (" * ".join(f"({e})" for e in dims[d + 1:]) or "1")
            f = dataclasses.replace(f, kind="expr", arg=None, dim=None, expr=_expr.canonical(text))
        elif f.kind == "expr" and f.expr:
            f = dataclasses.replace(f, expr=expand_workspaces(f.expr, workspaces))
        fields.append(f)
    return dataclasses.replace(layout, fields=tuple(fields))


def expand_workspaces(text: str, workspaces: tuple[Workspace, ...]) -> str:
    """An expression with each workspace's sizes and (contiguous) strides written in as its shape rule, so
    a grid a launcher computes from a workspace's layout reads only the inputs."""
    return _expr.substitute_tensors(text, {w.name: w.shape for w in workspaces}) if workspaces else text


def _finish_one(fe: Frontend, op: OpDecl, spec: Spec, build: KernelBuild, where: str,
                workspaces: tuple[Workspace, ...]) -> CompiledVariant:
    if workspaces:  # grids, LDS and guard constraints read the inputs only (a launcher may size from a workspace)
        launch = build.launch
        build = dataclasses.replace(build, launch=Launch(
            grid=tuple(expand_workspaces(g, workspaces) for g in launch.grid), block=launch.block,
            dynamic_lds=expand_workspaces(launch.dynamic_lds, workspaces)),
            constraints=tuple(dict.fromkeys(expand_workspaces(c, workspaces) for c in build.constraints)))
    meta, co_version = fe.read_metadata(build, where)
    layout = bind_workspaces(fe.kernarg_layout(build, meta, where), workspaces)
    try:
        check_layout(layout, meta, where)
    except BundleError as e:
        raise FrontendError(str(e)) from None
    if build.written is not None:
        check_writes(op, build.written, meta, layout, where)
    elif op.mutable_written:
        raise FrontendError(f"{where}: op(..., mutable=True): expected the frontend to tell which tensors the kernel "
                            "stores through, got nothing it could read; name them: op(..., mutable=[...])")
    tensors = {a.name for a in op.args if isinstance(a, Tensor)}
    writes = tuple(n for n in _bound_params(build.written or frozenset(), meta, layout) if n in tensors)
    constraints = (*build.constraints, *op.constraints(spec))
    grid, shapes, scalars = example_grid(op, spec, build.launch.grid, constraints, where,
                                         target=build.target)
    if grid != tuple(build.example_grid):
        raise FrontendError(f"{where}: the grid expressions {list(build.launch.grid)} give {list(grid)} at the "
                            f"example shapes but the frontend computed {list(build.example_grid)}")
    try:
        dynamic_lds = _expr.evaluate_with_shapes(build.launch.dynamic_lds, shapes, scalars,
                                                 device=example_device(spec, build.target))
    except BundleError as e:
        raise FrontendError(f"{where}: dynamic LDS {build.launch.dynamic_lds!r} at the example shapes: {e}") from None
    check_resources(meta, build.launch.block, dynamic_lds, build.target, spec, build.symbol, where)
    return CompiledVariant(
        target=build.target, code_object=build.code_object, format=build.format, symbol=build.symbol,
        code_object_version=co_version, metadata=meta, kernargs=layout, launch=build.launch, proof=build.proof,
        toolchain=build.toolchain, example_grid=build.example_grid, constraints=build.constraints,
        alignment=dict(build.alignment), tensor_abi=dict(build.tensor_abi), isa=build.isa, writes=writes)


def check_unread(launches: list[tuple[KernelBuild, CompiledVariant, str]],
                 example_strides: Optional[dict[str, tuple[int, ...]]] = None) -> None:
    """Refuse a declared stride no launch of the call reads (:func:`flyship.compiler.frontends.writes.unread_stride`),
    judged per op: a launch that never reads a stride it is passed is excused when another launch of the call
    reads that stride of the same tensor (a kernel launched twice with a constexpr that skips the tensor in one
    launch), or when it never reads that tensor's pointer either. Before round 4 each launch was judged alone.

    Raises:
        FrontendError: naming the launch, the parameter, the stride and the two fixes.
    """
    read: set[tuple[str, int]] = set()
    for build, v, _where in launches:
        unread = build.unread or frozenset()
        explicit = [a for a in v.metadata.args if not a.hidden]
        at = {(a.offset, a.size): i for i, a in enumerate(explicit)}
        for f in v.kernargs.fields:
            if f.kind == "stride" and at.get((f.offset, f.size)) not in unread | {None}:
                read.add((f.arg, f.dim))
    for build, v, where in launches:
        if not build.unread:
            continue
        explicit = [a for a in v.metadata.args if not a.hidden]
        at = {(a.offset, a.size): i for i, a in enumerate(explicit)}
        untouched = {f.arg for f in v.kernargs.fields
                     if f.kind == "pointer" and at.get((f.offset, f.size)) in build.unread}
        excused = frozenset(at[(f.offset, f.size)] for f in v.kernargs.fields
                            if f.kind == "stride" and (f.offset, f.size) in at
                            and ((f.arg, f.dim) in read or f.arg in untouched))
        if why := _writes.unread_stride(build.unread - excused, v.metadata, v.kernargs, example_strides):
            raise FrontendError(f"{where}: {why}")


def check_writes(op: OpDecl, written: frozenset[int], meta: KernelMetadata, layout: KernargLayout,
                 where: str) -> None:
    """Refuse a kernel that stores through a tensor the spec declared neither an ``Output`` nor ``mutable``.

    Args:
        written: explicit kernel parameters (metadata order) whose pointers reach a store or an atomic.
        meta, layout: the code object's metadata and the kernarg layout bound to the op's arguments.

    Raises:
        FrontendError: naming the parameter, the tensor it is bound to and what to declare.
    """
    explicit = [a for a in meta.args if not a.hidden]
    by_offset = {f.offset: f for f in layout.fields if f.kind == "pointer"}
    if op.mutable_written:
        return  # op(..., mutable=True): every input it stores through is mutable (the variant's writes)
    read_only = {a.name for a in op.args if isinstance(a, Tensor) and not a.mutable}
    bad: dict[str, str] = {}  # every undeclared tensor at once: each fix would otherwise cost a rebuild
    for i in sorted(written):
        if i >= len(explicit) or explicit[i].offset not in by_offset:
            continue  # a by-value parameter (a layout struct, a size) or one no tensor is bound to
        f = by_offset[explicit[i].offset]
        if f.arg in read_only and f.arg not in bad:
            bad[f.arg] = f"parameter {i} ({f.kernel_arg or explicit[i].name or f'#{i}'}, offset {f.offset})"
    if len(bad) == 1:
        (arg, param), = bad.items()
        raise FrontendError(
            f"{where}: the kernel stores through {param}, bound to input tensor {arg!r}, which the spec declares "
            f"neither an Output nor mutable; declare Tensor({arg!r}, ..., mutable=True) (or op(..., "
            f"mutable=[{arg!r}])) if the kernel writes it in place (the schema then says Tensor(a!) {arg} and "
            "torch.compile sees the write), or make the kernel not write it")
    if bad:
        raise FrontendError(
            f"{where}: the kernel stores through {len(bad)} input tensors the spec declares neither an Output nor "
            f"mutable: {'; '.join(f'{arg!r} ({param})' for arg, param in bad.items())}; if the kernel writes them "
            f"in place, declare them all at once: op(..., mutable=[{', '.join(map(repr, bad))}]) (the same as "
            "Tensor(..., mutable=True) on each; the schema then says Tensor(a!) and torch.compile sees the write), "
            "or make the kernel not write them")


def _bound_params(params: frozenset[int], meta: KernelMetadata, layout: KernargLayout) -> dict[str, tuple[int, str]]:
    """The tensors, outputs and workspaces whose pointer fields sit at explicit parameters ``params`` (metadata
    order): name -> (parameter index, the kernel's name for it)."""
    explicit = [a for a in meta.args if not a.hidden]
    by_offset = {f.offset: f for f in layout.fields if f.kind in ("pointer", "workspace")}
    out: dict[str, tuple[int, str]] = {}
    for i in sorted(params):
        if i < len(explicit) and explicit[i].offset in by_offset:
            f = by_offset[explicit[i].offset]
            out.setdefault(f.arg, (i, f.kernel_arg or explicit[i].name or f"#{i}"))
    return out


def check_accumulation(op: OpDecl, workspaces: tuple[Workspace, ...],
                       launches: list[tuple[KernelBuild, CompiledVariant, str]], judge_unwritten: bool = True) -> None:
    """Refuse a call whose first write to an ``Output`` (or a workspace) is an atomic read-modify-write, unless it
    is declared zero-filled: the loader allocates both uninitialised (``at::empty``), so an atomic add into one
    adds to garbage. A launch that stores into it first (a multi-launch op's init pass) settles it.

    Args:
        launches: the call's launches in order: (the frontend's build, the finished variant, where).
        judge_unwritten: also refuse an ``Output`` no launch stores through (off for a variant whose ints are
            pinned by value, where a store the generic variant keeps may have been folded away).

    Raises:
        FrontendError: naming the parameter, the output or workspace and what to declare.
    """
    kinds = {**{o.name: ("Output", o.zero) for o in op.outputs}, **{w.name: ("Workspace", w.zero) for w in workspaces}}
    settled: set[str] = set()
    for build, v, where in launches:
        if build.written is None:
            return  # the frontend could not read this launch's writes: nothing after it can be judged
        for name, (i, kname) in _bound_params(build.accumulated, v.metadata, v.kernargs).items():
            kind, zero = kinds.get(name, ("", True))
            if zero or name in settled:
                continue
            how = (f"Output({name!r}, ..., zero=True) so the loader allocates it filled with zeros, or declare it "
                   f"an input Tensor({name!r}, ..., mutable=True) that the caller provides and the kernel "
                   f"accumulates into in place" if kind == "Output" else
                   f"Workspace({name!r}, ..., zero=True) so the loader fills it with zeros before the first launch")
            raise FrontendError(
                f"{where}: the kernel accumulates atomically (an atomic add, max or compare-and-swap) through "
                f"parameter {i} ({kname}), bound to {kind.lower()} {name!r}, which the loader allocates "
                f"uninitialised, so the result would start from garbage; expected a zero-filled {kind.lower()}: "
                f"declare {how}")
        settled |= set(_bound_params(build.written, v.metadata, v.kernargs))
    if judge_unwritten:
        _check_outputs_written(op, settled, [(v, where) for _b, v, where in launches])


def _check_outputs_written(op: OpDecl, written: set[str], launches: list[tuple[CompiledVariant, str]]) -> None:
    """Refuse an ``Output`` that the loader allocates uninitialised and no launch of the call stores through: the
    op would return whatever the allocator's block held. Only outputs bound to a pointer parameter are judged (one
    reached through a descriptor made on the host is not visible to the IR readers)."""
    for o in op.outputs:
        if o.zero or o.name in written:
            continue
        bound = [(where, f) for v, where in launches for f in v.kernargs.fields
                 if f.kind == "pointer" and f.arg == o.name]
        if bound:
            where, f = bound[-1]
            raise FrontendError(
                f"{where}: expected the kernel to store through output {o.name!r} (parameter "
                f"{f.kernel_arg or f.offset}), found no store, atomic or copy through it in any launch of the call; "
                f"the loader allocates outputs uninitialised, so the op would return garbage. Make the kernel write "
                f"{o.name}, or declare Output({o.name!r}, ..., zero=True) if zeros are the values it means")


def example_grid(op: OpDecl, spec: Spec, grid: tuple[str, ...], constraints: tuple[str, ...],
                 where: str, target: str | None = None) -> tuple[tuple[int, int, int], dict[str, tuple[int, ...]],
                                                                 dict[str, int]]:
    """The grid at the example call, after checking that the example satisfies every guard constraint.
    ``device.cu_count`` takes its value from :func:`example_device`.

    Returns:
        (the example grid, the example's shapes, the example's int scalars).

    Raises:
        FrontendError: an int scalar without an example value, an expression that cannot be evaluated at the
            example, or a constraint the example violates (the specialization would never run its own example).
    """
    shapes = op.example_shapes(spec)
    example = op.example_scalars(spec)
    missing = [a.name for a in op.args if isinstance(a, Scalar) and a.type == "int" and example.get(a.name) is None]
    if missing:
        raise FrontendError(f"{where}: int scalars {missing} need example values (Spec(scalars=...) or "
                            "Scalar(default=...)) to check the guard and the grid")
    scalars = {k: v for k, v in example.items() if isinstance(v, int) and not isinstance(v, bool)}
    strides = op.example_strides(spec)
    try:
        device = example_device(spec, target)
        values = tuple(_expr.evaluate_with_shapes(g, shapes, scalars, strides, device=device) for g in grid)
        for c in constraints:
            if not _expr.evaluate_with_shapes(c, shapes, scalars, strides, device=device):
                raise FrontendError(f"{where}: the example call (shapes {shapes}, scalars {scalars}) violates the "
                                    f"guard constraint {c!r}; the specialization would never run its own example")
    except BundleError as e:
        raise FrontendError(f"{where}: at the example shapes {shapes}: {e}") from None
    return (values[0], values[1], values[2]), shapes, scalars


def check_resources(meta: KernelMetadata, block: tuple[int, int, int], dynamic_lds: int, target: str, spec: Spec,
                    symbol: str, where: str) -> None:
    """Refuse what would fail or misbehave at launch: too much LDS / shared memory, a required block size
    other than the launch's, too many registers for the block, spills without ``allow_scratch``.

    Raises:
        FrontendError: naming the quantity, the limit and what to change.
    """
    tid = _targets.parse_target(target)
    lim = _targets.limits(tid)
    static = meta.group_segment_fixed_size
    total = static + dynamic_lds
    if total > lim["lds_bytes"]:
        raise ResourceError(f"{where}: kernel {symbol} uses {total} bytes of LDS / shared memory ({dynamic_lds} "
                            f"dynamic + {static} static), over the target's {lim['lds_bytes']}-byte per-workgroup "
                            "limit; use smaller tiles or fewer stages")
    threads = block[0] * block[1] * block[2]
    try:  # required and maximum workgroup size, static LDS: the rule book's rules, as the loader applies them
        _rules.check_resources(meta, block, target, f"{where}: kernel {symbol}")
    except BundleError as e:
        raise ResourceError(str(e)) from None
    if tid.vendor == "nvidia" and meta.vgpr_count * threads > NV_REGISTERS_PER_BLOCK:
        raise ResourceError(f"{where}: kernel {symbol} uses {meta.vgpr_count} registers x {threads} threads = "
                            f"{meta.vgpr_count * threads}, over the {NV_REGISTERS_PER_BLOCK} a block may hold; the "
                            "launch would fail with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES; lower num_warps or set maxnreg")
    try:
        _rules.check_scratch(meta, spec.allow_scratch, f"{where}: kernel {symbol}")
    except BundleError as e:
        raise ResourceError(str(e)) from None
