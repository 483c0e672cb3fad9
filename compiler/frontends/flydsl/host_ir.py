"""Read a FlyDSL launcher's host function from its IR dump: launch geometry and kernarg bindings.

FlyDSL (>= 0.2) lowers a ``@flyc.jit`` launcher to a host ``func.func`` that takes each tensor as a
pointer plus a packed by-value struct of its dynamic shape (i32/i64 each) and dynamic strides, computes
the grid with plain ``arith`` ops over ``llvm.extractvalue`` of those structs, and ends in
``gpu.launch_func ... blocks in (gx, gy, gz) threads in (bx, by, bz) args(...)``. Before 0.2 a torch tensor
is a static layout: the pointer alone, its shape compiled in (constant grid, ``shape == N`` constraints);
:attr:`HostAnalysis.tensor_abi` says which each tensor was. This module walks that
function with FlyDSL's own MLIR Python bindings and turns it into:

* the grid as expressions over the op's arguments (``cdiv``-style arithmetic), evaluated here too by
  interpreting the ops at the example shapes (the two must agree);
* the block size (must be constant);
* for each kernel argument, what the loader writes: a tensor's data pointer, a shape or stride entry
  at its integer width, a runtime scalar, or an integer expression;
* constraints implied by the tensor layouts: static shape / stride entries.

The printed types (memref layouts, packed structs) are read by :mod:`.host_types`, the SSA values by
:mod:`.host_values`. Only ``flyship.compiler.frontends.flydsl.frontend`` calls this; it imports ``flydsl`` lazily.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from flyship.bundle import expr as _expr
from flyship.compiler.spec import OpDecl, Output, Scalar, Spec, Tensor, Value, Workspace
from flyship.compiler.frontends.base import FrontendError
from flyship.compiler.frontends.flydsl.host_types import FieldPlan, TensorLayout, parse_layout
from flyship.compiler.frontends.flydsl.host_values import HostValues


@dataclasses.dataclass(frozen=True)
class HostAnalysis:
    """What the launcher's host function says, in terms of the op's arguments."""

    kernel_name: str
    grid: tuple[str, str, str]
    grid_at_example: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: str
    kernel_args: tuple[tuple[FieldPlan, ...], ...]  # one tuple of fields per kernel argument
    kernel_arg_sizes: tuple[int, ...]
    constraints: tuple[str, ...]
    tensor_abi: dict[str, str] = dataclasses.field(default_factory=dict)  # tensor -> "static" / "dynamic"


def _host_func(module: Any, launcher_name: str | None) -> Any:
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    for f in funcs:
        name = str(f.operation.attributes["sym_name"]).strip('"')
        if launcher_name is None or name == launcher_name:
            return f
    raise FrontendError(f"FlyDSL IR: no host function {launcher_name!r}; found "
                        f"{[str(f.operation.attributes['sym_name']) for f in funcs]}")


def find_stages(kernel_dir: Path) -> tuple[Path, Path]:
    """The origin stage (tensor types) and the first stage whose host function has only LLVM types."""
    stages = sorted(kernel_dir.glob("*.mlir"), key=lambda p: int(p.name.split("_", 1)[0]))
    if not stages:
        raise FrontendError(f"FlyDSL IR: no *.mlir stage dumps in {kernel_dir}; is FLYDSL_DUMP_IR=1 set?")
    lowered = None
    for p in stages:
        text = p.read_text()
        m = re.search(r"^  func\.func @[^(]+\((.*?)\) attributes", text, re.M)
        if m and "gpu.launch_func" in text and "!fly." not in m.group(1):
            lowered = p
            break
    if lowered is None:
        raise FrontendError(f"FlyDSL IR: no stage in {kernel_dir} has a lowered host function with "
                            "gpu.launch_func; this FlyDSL version lowers differently than flyship knows")
    return stages[0], lowered


def analyze(kernel_dir: Path, op: OpDecl, spec: Spec, launcher_name: str, context: Any, ir: Any) -> HostAnalysis:
    """Analyse the dumped stages of a launcher that launches one kernel (see :func:`analyze_launches`).

    Raises:
        FrontendError: as :func:`analyze_launches`, or a launcher that launches several kernels.
    """
    found = analyze_launches(kernel_dir, op, spec, launcher_name, context, ir)
    if len(found) != 1:
        raise FrontendError(f"op {op.name} spec {spec.name}: the launcher launches {len(found)} kernels; flyship "
                            "binds launchers with exactly one gpu.launch_func here")
    return found[0]


def analyze_launches(kernel_dir: Path, op: OpDecl, spec: Spec, launcher_name: str, context: Any,
                     ir: Any) -> list[HostAnalysis]:
    """Analyse the dumped stages of one launcher (``FLYDSL_DUMP_IR=1``; flyc-build itself reads the host
    function in memory, :func:`analyze_functions`).

    Args:
        kernel_dir: the dump folder of the kernel (holds ``NN_<stage>.mlir``).
        op, spec: the declaration, for argument names and example shapes.
        launcher_name: the host function's symbol (the launcher's Python name).
        context: an MLIR context with FlyDSL's dialects loaded.
        ir: the ``flydsl._mlir.ir`` module.

    Raises:
        FrontendError: the IR has a shape flyship does not bind (naming the op it met).
    """
    origin_path, lowered_path = find_stages(kernel_dir)
    with context:
        # Keep the modules referenced: an op outlives its parsed module only as a dangling pointer.
        origin_mod = ir.Module.parse(origin_path.read_text())
        lowered_mod = ir.Module.parse(lowered_path.read_text())
        origin = _host_func(origin_mod, launcher_name)
        lowered = _host_func(lowered_mod, launcher_name)
        o_types = [str(a.type) for a in origin.regions[0].blocks[0].arguments if "async.token" not in str(a.type)]
        return analyze_functions(o_types, lowered, op, spec, ir, lowered_path.name)


def analyze_functions(o_types: list[str], lowered: Any, op: OpDecl, spec: Spec, ir: Any,
                      stage: str = "the lowered host function",
                      device: dict[str, int] | None = None) -> list[HostAnalysis]:
    """Analyse one launcher's host function: one :class:`HostAnalysis` per ``gpu.launch_func`` it makes, in
    program order (a multi-phase launcher launches several kernels; a :class:`Workspace` parameter binds like a
    tensor, and the common tail turns its fields into workspace fields).

    Args:
        o_types: the host function's runtime argument types before lowering (``!fly.memref<...>``).
        lowered: the host function (``func.func``) after the first stage that lowered every argument.
        op, spec: the declaration, for argument names and example shapes.
        ir: the ``flydsl._mlir.ir`` module.
        stage: where ``lowered`` comes from, for messages.
        device: the device properties of the example call (``{"cu_count": 304}``), which a :class:`Value`'s
            expression may read (``device.cu_count``); default: the spec's ``cu_count``.

    Raises:
        FrontendError: the IR has a shape flyship does not bind (naming the op it met).
    """
    where = f"op {op.name} spec {spec.name}"
    params = [a for a in op.args if isinstance(a, (Tensor, Output, Scalar, Value, Workspace))]
    with lowered.context:  # the evaluator may build attributes in the function's own context
        layouts, pointers = _argument_layouts(params, o_types, op, spec, where)
        binding = _bind_arguments(list(lowered.regions[0].blocks[0].arguments), params, layouts, pointers, where,
                                  stage)
        launches = [o for o in lowered.regions[0].blocks[0].operations if o.operation.name == "gpu.launch_func"]
        if not launches:
            raise FrontendError(f"{where}: the launcher launches no kernel (no gpu.launch_func in its host function)")
        shapes = op.example_shapes(spec)
        for w in op.workspaces:  # a workspace's example is its shape rule at the example call
            shapes[w.name] = tuple(_expr.evaluate_with_shapes(e, shapes) for e in op.workspace_shape(w, spec))
        strides = {**{k: _expr.contiguous_strides(v) for k, v in shapes.items()}, **op.example_strides(spec)}
        found = [_launch(ir, o.operation, op, spec, binding, layouts, shapes, strides, where, device)
                 for o in launches]

    constraints = _layout_constraints(layouts, op)
    # A static layout reaches the kernel as a bare pointer (shape compiled in; FlyDSL before 0.2.0 makes
    # every torch tensor one); a dynamic layout as a pointer + a struct of its dynamic shape/stride values.
    abi = {name: "dynamic" if lay.dynamic else "static" for name, lay in layouts.items()}
    abi.update({name: "pointer" for name in pointers})
    out = []
    for a, ev in found:
        extra = [c for c in ev.width_constraints if c not in constraints]
        out.append(dataclasses.replace(a, constraints=tuple(constraints + extra), tensor_abi=abi))
    return out


def _argument_layouts(params: list, o_types: list[str], op: OpDecl, spec: Spec,
                      where: str) -> tuple[dict[str, TensorLayout], set[str]]:
    """Each tensor parameter's layout from the host function's argument types before lowering, and the
    ``fx.Pointer`` parameters bound to a tensor's data pointer.

    Raises:
        FrontendError: the argument count or a kind disagrees with the declaration.
    """
    if len(o_types) != len(params):
        raise FrontendError(f"{where}: the launcher's host function takes {len(o_types)} runtime arguments "
                            f"({o_types}) but the spec declares {len(params)} (Tensor/Output/Scalar: "
                            f"{[p.name for p in params]}); make args= list every launcher parameter in order")
    layouts: dict[str, TensorLayout] = {}
    pointers: set[str] = set()
    for p, t in zip(params, o_types):
        if isinstance(p, (Tensor, Output)) and t.startswith("!fly.ptr"):
            check_pointee(t, p, op, spec, where)
            pointers.add(p.name)
        elif isinstance(p, (Tensor, Output, Workspace)):
            if not t.startswith("!fly.memref"):
                raise FrontendError(f"{where}: parameter {p.name} is declared a tensor but FlyDSL lowered it "
                                    f"as {t}")
            layouts[p.name] = parse_layout(t)
        elif t.startswith("!fly."):
            raise FrontendError(f"{where}: parameter {p.name} is declared a scalar but FlyDSL lowered it as {t}")
    return layouts, pointers


def _bind_arguments(l_args: list, params: list, layouts: dict[str, TensorLayout], pointers: set[str], where: str,
                    stage: str) -> dict[int, tuple[str, str]]:
    """Map the lowered host block arguments to (param, component): ``pointer``, ``layout`` (a dynamic layout's
    struct), ``value`` or ``scalar``.

    Raises:
        FrontendError: the lowered function has another number of arguments than the layouts give.
    """
    # The stream lowers to a !gpu.async.token argument where the launcher declares it, possibly between
    # runtime parameters (``(x, stream, TILE_N, out, alpha)``): bind the other arguments by their position.
    real = [k for k, a in enumerate(l_args) if "async.token" not in str(a.type)]
    binding: dict[int, tuple[str, str]] = {}
    i = 0
    for p in params:
        parts = [(p.name, "pointer" if p.name in layouts or p.name in pointers else
                  "value" if isinstance(p, Value) else "scalar")]
        if p.name in layouts and layouts[p.name].dynamic:
            parts.append((p.name, "layout"))
        for part in parts:
            if i < len(real):
                binding[real[i]] = part
            i += 1
    n_real = len(real)
    if i != n_real:
        raise FrontendError(f"{where}: expected {i} lowered host arguments from the tensor layouts, got {n_real} "
                            f"in {stage}")
    return binding


def _layout_constraints(layouts: dict[str, TensorLayout], op: OpDecl) -> list[str]:
    """Guard constraints an input tensor's lowered layout relies on: its static sizes and strides, and i32 bounds
    on the dynamic ones FlyDSL packs as i32."""
    constraints = []
    for name, lay in layouts.items():
        if name not in {t.name for t in op.args if isinstance(t, Tensor)}:
            continue
        for d, e in enumerate(lay.shape):
            if e.static is not None:
                constraints.append(f"{name}.shape[{d}] == {e.static}")
            elif e.width == "i32":
                constraints.append(f"{name}.shape[{d}] <= 2147483647")
        for d, e in enumerate(lay.stride):
            if e.static is not None:
                constraints.append(f"{name}.stride[{d}] == {e.static}")
            elif e.width == "i32":
                constraints.append(f"{name}.stride[{d}] <= 2147483647")
    return constraints


def _launch(ir: Any, launch: Any, op: OpDecl, spec: Spec, binding: dict, layouts: dict, shapes: dict, strides: dict,
            where: str, device: dict[str, int] | None = None) -> tuple[HostAnalysis, HostValues]:
    """One ``gpu.launch_func`` of the host function: its kernel, grid, block, LDS and kernel arguments."""
    seg = list(ir.DenseI32ArrayAttr(launch.attributes["operandSegmentSizes"]))
    operands = list(launch.operands)
    # ODS order: asyncDependencies, gridSize x/y/z, blockSize x/y/z, clusterSize x/y/z (optional),
    # dynamicSharedMemorySize (optional), kernelOperands, asyncObject (optional).
    starts = [sum(seg[:k]) for k in range(len(seg))]
    grid_vals = [operands[starts[k]] for k in (1, 2, 3)]
    block_vals = [operands[starts[k]] for k in (4, 5, 6)]
    has_cluster = seg[7] + seg[8] + seg[9] > 0 if len(seg) >= 12 else False
    if has_cluster:
        raise FrontendError(f"{where}: launches with a cluster size are not supported")
    lds_idx = 10 if len(seg) >= 12 else 7
    lds_vals = operands[starts[lds_idx]:starts[lds_idx] + seg[lds_idx]]
    kop_idx = lds_idx + 1
    kernel_operands = operands[starts[kop_idx]:starts[kop_idx] + seg[kop_idx]]
    kernel_name = str(launch.attributes["kernel"]).split("::")[-1].lstrip("@")

    scalars = {**op.example_scalars(spec), **op.example_values(spec, device)}
    ev = HostValues(binding, layouts, shapes, scalars, where, ir)
    ev.strides = strides
    ev.values = {a.name: a.expr for a in op.args if isinstance(a, Value)}
    ev.float_values = {a.name: a.float_literal() for a in op.args
                       if isinstance(a, Value) and a.float_literal() is not None}
    grid = tuple(ev.expr(v) for v in grid_vals)
    grid_num = tuple(ev.value(v) for v in grid_vals)
    block = []
    for v in block_vals:
        e = ev.expr(v)
        if not e.lstrip("-").isdigit():
            raise FrontendError(f"{where}: block size {e!r} is not a constant; flyship needs a fixed workgroup size")
        block.append(int(e))
    dyn_lds = ev.expr(lds_vals[0]) if lds_vals else "0"

    kernel_args = []
    sizes = []
    for v in kernel_operands:
        fields, size = ev.kernel_arg(v)
        kernel_args.append(tuple(fields))
        sizes.append(size)
    return HostAnalysis(kernel_name, grid, grid_num, tuple(block), dyn_lds, tuple(kernel_args), tuple(sizes),
                        ()), ev


# torch dtype names -> the element type an ``!fly.ptr<...>`` prints (MLIR builtin type names).
_POINTEE = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16", "int64": "i64", "int32": "i32",
            "int16": "i16", "int8": "i8", "uint8": "i8", "bool": "i1", "float8_e4m3fn": "f8E4M3FN",
            "float8_e4m3fnuz": "f8E4M3FNUZ", "float8_e5m2": "f8E5M2", "float8_e5m2fnuz": "f8E5M2FNUZ"}


def check_pointee(ptr_type: str, p: Tensor | Output, op: OpDecl, spec: Spec, where: str) -> None:
    """An ``fx.Pointer`` parameter bound to a tensor must point to the tensor's elements in global memory, or to
    bytes (``Tensor(pointee="uint8")``, as upstream builders pass ``from_c_void_p(fx.Uint8, t.data_ptr())``).

    Raises:
        FrontendError: naming the parameter, the pointer type and the tensor's dtype.
    """
    m = re.match(r"^!fly\.ptr<([^,>]+),\s*([a-z_]+)", ptr_type)
    dtype = spec.dtypes.get(p.name) if isinstance(p, Tensor) else op.output_dtype_for(p, spec)
    want = _POINTEE.get(getattr(p, "pointee", None) or dtype or "")
    if m is None or m.group(2) != "global" or (want is not None and m.group(1) != want):
        raise FrontendError(f"{where}: parameter {p.name} is an fx.Pointer of type {ptr_type}; expected a global "
                            f"pointer to {want or dtype} (the tensor's dtype {dtype}, or Tensor/Output(pointee=...))")
