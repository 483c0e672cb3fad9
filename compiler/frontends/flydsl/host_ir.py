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

Only ``flyship.compiler.frontends.flydsl.frontend`` calls this; it imports ``flydsl`` lazily.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from flyship.bundle import expr as _expr
from flyship.bundle.manifest import FIELD_TYPES
from flyship.compiler.spec import OpDecl, Output, Scalar, Spec, Tensor, Value, Workspace
from flyship.compiler.frontends.base import FrontendError

_MEMREF_RE = re.compile(r"^!fly\.memref<([^,]+),\s*([a-z_]+),\s*(.*)>$")
_INT_W = {"i8": 1, "i16": 2, "i32": 4, "i64": 8}
_SCALAR_FIELD = {"f32": "f32", "f64": "f64", "f16": "f16", "bf16": "bf16", "i32": "i32", "i64": "i64", "i1": "i8",
                 "i8": "i8", "i16": "i16"}


@dataclasses.dataclass(frozen=True)
class LayoutEntry:
    """One shape or stride entry of a tensor layout: static value or dynamic with an integer width."""

    static: int | None
    width: str  # "i32" / "i64" for dynamic entries


@dataclasses.dataclass(frozen=True)
class TensorLayout:
    dtype: str
    shape: tuple[LayoutEntry, ...]
    stride: tuple[LayoutEntry, ...]

    @property
    def dynamic(self) -> bool:
        return any(e.static is None for e in (*self.shape, *self.stride))


@dataclasses.dataclass(frozen=True)
class FieldPlan:
    """A kernarg value: offset relative to its kernel argument, and what goes there."""

    rel_offset: int
    kind: str  # pointer / shape / stride / scalar / expr
    type: str
    arg: str | None = None
    dim: int | None = None
    expr: str | None = None
    value: float | None = None  # a float Value's constant (kind "constant")


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


def parse_layout(type_text: str) -> TensorLayout:
    """Parse ``!fly.memref<f32, global, (?,?):(?{i64},1)>``.

    Raises:
        FrontendError: nested (hierarchical) layouts, which flyship does not bind yet.
    """
    m = _MEMREF_RE.match(type_text.strip())
    if not m:
        raise FrontendError(f"FlyDSL IR: expected a !fly.memref tensor type, got {type_text!r}")
    dtype, _space, layout = m.groups()
    if layout.count(":") != 1:
        raise FrontendError(f"FlyDSL IR: cannot read the layout of {type_text!r}")
    shape, stride = (p.strip() for p in layout.split(":"))
    # A rank-1 layout prints without parentheses (``?:1``); rank >= 2 as ``(?,?):(?{i64},1)``.
    shape = shape[1:-1] if shape.startswith("(") and shape.endswith(")") else shape
    stride = stride[1:-1] if stride.startswith("(") and stride.endswith(")") else stride
    if "(" in shape or "(" in stride:
        raise FrontendError(f"FlyDSL IR: hierarchical layout {type_text!r} is not supported; pass flat tensors")

    def entries(text: str) -> tuple[LayoutEntry, ...]:
        out = []
        for tok in filter(None, (t.strip() for t in text.split(","))):
            if tok.startswith("?"):
                w = re.search(r"\{(i\d+)\}", tok)
                out.append(LayoutEntry(None, w.group(1) if w else "i32"))
            else:
                out.append(LayoutEntry(int(tok), "i32"))
        return tuple(out)

    return TensorLayout(dtype, entries(shape), entries(stride))


def _struct_members(type_text: str) -> list[Any]:
    """Parse ``!llvm.struct<packed (struct<packed (i32, i32)>, struct<packed (i64)>)>`` into nested lists."""
    s = type_text.strip()
    s = s[len("!llvm."):] if s.startswith("!llvm.") else s
    pos = 0

    def parse() -> Any:
        nonlocal pos
        if s.startswith("struct<", pos):
            pos += len("struct<")
            if s.startswith("packed ", pos):
                pos += len("packed ")
            elif not s.startswith("(", pos):
                raise FrontendError(f"FlyDSL IR: unexpected struct syntax in {type_text!r}")
            assert s[pos] == "("
            pos += 1
            items = []
            while s[pos] != ")":
                items.append(parse())
                while s[pos] in ", ":
                    pos += 1
            pos += 1  # ')'
            assert s[pos] == ">"
            pos += 1
            return items
        m = re.compile(r"[a-z0-9]+").match(s, pos)
        if not m:
            raise FrontendError(f"FlyDSL IR: cannot read struct member at {s[pos:pos + 20]!r} in {type_text!r}")
        pos = m.end()
        return m.group(0)

    return parse()


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
            where: str, device: dict[str, int] | None = None) -> tuple[HostAnalysis, "_Evaluator"]:
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
    ev = _Evaluator(binding, layouts, shapes, scalars, where, ir)
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


class _Evaluator:
    """Turns SSA values of the host function into expressions (and example values)."""

    _BIN = {"arith.addi": ("+", lambda a, b: a + b), "arith.subi": ("-", lambda a, b: a - b),
            "arith.muli": ("*", lambda a, b: a * b)}

    def __init__(self, binding, layouts, shapes, scalars, where, ir):
        self.binding, self.layouts, self.shapes, self.scalars, self.where, self.ir = (
            binding, layouts, shapes, scalars, where, ir)
        self.width_constraints: list[str] = []
        self.float_values: dict[str, float] = {}

    # -- helpers -----------------------------------------------------------------------------
    def _block_arg(self, v) -> tuple[str, str] | None:
        # FlyDSL registers value casters (e.g. f32 values come back as its ArithValue), so test the owner.
        if isinstance(v.owner, self.ir.Block):
            return self.binding.get(self.ir.BlockArgument(v).arg_number)
        return None

    def _layout_entry(self, tensor: str, pos: list[int]) -> tuple[str, int, str]:
        """(``shape``/``stride``, dim, width) of struct position ``pos`` in ``tensor``'s layout struct."""
        lay = self.layouts[tensor]
        groups = []
        if any(e.static is None for e in lay.shape):
            groups.append(("shape", lay.shape))
        if any(e.static is None for e in lay.stride):
            groups.append(("stride", lay.stride))
        if len(pos) != 2 or pos[0] >= len(groups):
            raise FrontendError(f"{self.where}: unexpected layout struct position {pos} for {tensor}")
        what, entries = groups[pos[0]]
        dyn = [d for d, e in enumerate(entries) if e.static is None]
        d = dyn[pos[1]]
        return what, d, entries[d].width

    def _owner(self, v):
        if isinstance(v.owner, self.ir.Block):
            return None
        return v.owner

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, v) -> str:
        return _expr.canonical(self._expr(v))

    def _expr(self, v) -> str:
        b = self._block_arg(v)
        if b is not None:
            name, comp = b
            if comp == "scalar":
                return name
            if comp == "value":
                return f"({self.values[name]})"
            raise FrontendError(f"{self.where}: a {comp} argument of {name} is used as an integer in the grid")
        o = self._owner(v)
        if o is None:
            raise FrontendError(f"{self.where}: grid uses an unbound block argument")
        n = o.name
        if n == "arith.constant":
            return str(self.ir.IntegerAttr(o.attributes["value"]).value)
        if n in ("arith.index_cast", "arith.extsi", "arith.extui", "arith.trunci", "arith.index_castui"):
            return self._expr(o.operands[0])
        if n == "llvm.extractvalue":
            src = self._block_arg(o.operands[0])
            if src is None or src[1] != "layout":
                raise FrontendError(f"{self.where}: extractvalue from something other than a tensor layout struct")
            what, d, _w = self._layout_entry(src[0], list(self.ir.DenseI64ArrayAttr(o.attributes["position"])))
            return f"{src[0]}.{what}[{d}]"
        a = lambda k: self._expr(o.operands[k])  # noqa: E731
        if n in self._BIN:
            e = f"({a(0)} {self._BIN[n][0]} {a(1)})"
            self._note_width(o, e)
            return e
        if n == "arith.floordivsi":
            return f"({a(0)} // {a(1)})"
        if n in ("arith.divsi", "arith.remsi"):
            # Truncating division: equal to the expressions' floor only for a non-negative dividend, so write it
            # exactly (``(n - 1) // 8`` at n = 0 is 0 truncated, -1 floored): bundle.expr.trunc_div.
            q, guard = _expr.trunc_div(a(0), a(1))
            self._note_guard(guard)
            return f"({q})" if n == "arith.divsi" else f"({a(0)} - ({a(1)}) * ({q}))"
        if n in ("arith.divui", "arith.remui", "arith.ceildivui"):
            # Unsigned: a negative dividend reads as a huge number the expressions cannot follow; guard it out.
            if not _expr.nonnegative(a(0)):
                self._note_guard((_expr.canonical(f"{a(0)} >= 0"),))
            self._note_guard(_expr.trunc_div(a(0), a(1))[1])
            return {"arith.divui": f"({a(0)} // {a(1)})", "arith.remui": f"({a(0)} % {a(1)})",
                    "arith.ceildivui": f"cdiv({a(0)}, {a(1)})"}[n]
        if n == "arith.ceildivsi":
            return f"cdiv({a(0)}, {a(1)})"
        if n in ("arith.minsi", "arith.minui"):
            return f"min({a(0)}, {a(1)})"
        if n in ("arith.maxsi", "arith.maxui"):
            return f"max({a(0)}, {a(1)})"
        raise FrontendError(f"{self.where}: host launcher computes a launch value with {n}, which flyship cannot "
                            "express; keep grid arithmetic to + - * // % min max over tensor sizes")

    def _note_guard(self, constraints: tuple[str, ...]) -> None:
        """Add guard constraints a launch value's arithmetic needs (kept with the width constraints)."""
        for c in constraints:
            if c not in self.width_constraints:
                self.width_constraints.append(c)

    def _note_width(self, o, e: str) -> None:
        """A sum or product the launcher computes in a fixed-width integer wraps past its maximum; the guard
        keeps the inputs where it does not (FlyDSL computes ``(M + 7) // 8`` in i32: it wraps within a few
        hundred of 2**31)."""
        t = str(o.results[0].type)
        bits = {"i32": 32, "i64": 64, "i16": 16}.get(t)
        if bits is not None:
            c = _expr.canonical(f"{e} <= {2 ** (bits - 1) - 1}")
            if c not in self.width_constraints:
                self.width_constraints.append(c)

    def value(self, v) -> int:
        """Interpret the ops at the example shapes (independent of :meth:`expr`)."""
        b = self._block_arg(v)
        if b is not None:
            return int(self.scalars[b[0]])
        o = self._owner(v)
        n = o.name
        if n == "arith.constant":
            return int(self.ir.IntegerAttr(o.attributes["value"]).value)
        if n in ("arith.index_cast", "arith.extsi", "arith.extui", "arith.trunci", "arith.index_castui"):
            return self.value(o.operands[0])
        if n == "llvm.extractvalue":
            src = self._block_arg(o.operands[0])
            what, d, _w = self._layout_entry(src[0], list(self.ir.DenseI64ArrayAttr(o.attributes["position"])))
            if what == "shape":
                return int(self.shapes[src[0]][d])
            return int(self.strides[src[0]][d])
        x, y = self.value(o.operands[0]), self.value(o.operands[1])
        if n in self._BIN:
            return self._BIN[n][1](x, y)
        if n == "arith.floordivsi":
            return x // y
        if n in ("arith.divsi", "arith.divui"):
            return abs(x) // abs(y) * (1 if (x >= 0) == (y > 0) else -1)  # toward zero, exact for big ints
        if n in ("arith.ceildivsi", "arith.ceildivui"):
            return -(-x // y)
        if n in ("arith.remsi", "arith.remui"):
            return x - y * (abs(x) // abs(y) * (1 if (x >= 0) == (y > 0) else -1))
        if n in ("arith.minsi", "arith.minui"):
            return min(x, y)
        if n in ("arith.maxsi", "arith.maxui"):
            return max(x, y)
        raise FrontendError(f"{self.where}: cannot interpret {n}")

    # -- kernel arguments -----------------------------------------------------------------------
    def kernel_arg(self, v) -> tuple[list[FieldPlan], int]:
        """Fields of one kernel operand and its size in bytes."""
        b = self._block_arg(v)
        t = str(v.type)
        if b is not None:
            name, comp = b
            if comp == "pointer":
                return [FieldPlan(0, "pointer", "ptr", arg=name)], 8
            if comp == "value":
                const = self.float_values.get(name)
                if const is not None and t == "f32":  # Value("eps", "1e-6", type="f32"): an f32 constant
                    return [FieldPlan(0, "constant", "f32", value=const)], 4
                if t not in _INT_W:
                    raise FrontendError(f"{self.where}: Value {name} lowered to {t}; a Value is an integer parameter")
                e = _expr.canonical(self.values[name])
                bits = 8 * _INT_W[t]
                c = _expr.canonical(f"{e} <= {2 ** (bits - 1) - 1}")  # packed at that width: it must fit
                if c not in self.width_constraints:
                    self.width_constraints.append(c)
                return [FieldPlan(0, "expr", t, expr=e)], _INT_W[t]
            if comp == "layout":
                members = _struct_members(t)
                fields, off = [], 0
                for gi, group in enumerate(members):
                    for ei, width in enumerate(group):
                        if width not in _INT_W:
                            raise FrontendError(f"{self.where}: layout struct member {width} of {name} is not an "
                                                "integer")
                        what, d, _ = self._layout_entry(name, [gi, ei])
                        fields.append(FieldPlan(off, what, width, arg=name, dim=d))
                        off += _INT_W[width]
                return fields, off
            if t not in _SCALAR_FIELD:
                raise FrontendError(f"{self.where}: scalar {name} lowered to {t}, which flyship cannot pack")
            ft = _SCALAR_FIELD[t]
            return [FieldPlan(0, "scalar", ft, arg=name)], FIELD_TYPES[ft]
        o = self._owner(v)  # fx.Int64(fx.ptrtoint(p)), upstream's MXFP4 GEMM: the kernel gets p's data pointer
        src = self._block_arg(o.operands[0]) if o is not None and o.name == "llvm.ptrtoint" and t == "i64" else None
        if src is not None and src[1] == "pointer":
            return [FieldPlan(0, "pointer", "ptr", arg=src[0])], 8
        if t in _INT_W:
            return [FieldPlan(0, "expr", t, expr=self.expr(v))], _INT_W[t]
        raise FrontendError(f"{self.where}: kernel argument of type {t} is computed in the launcher; flyship binds "
                            "only launcher arguments and integer arithmetic on tensor sizes")
