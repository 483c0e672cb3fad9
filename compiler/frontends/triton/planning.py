"""Planning one Triton compile without compiling: the explicit signature, constexprs, specialization
attributes and options ``triton.compile`` gets, and the guard facts (constraints, alignment) the compile
relies on (:class:`TritonPlan`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.bundle.manifest import FIELD_TYPES
from flyship.compiler.frontends.base import FrontendError
from flyship.compiler.frontends.triton import jitspec as _jitspec
from flyship.compiler.frontends.triton.jitspec import jit_function
from flyship.compiler.spec import Constexpr, OpDecl, Output, Scalar, Spec, Tensor, Value, Workspace


# torch dtype name -> Triton signature element type (triton/language/core.py dtype names).
TRITON_DTYPES: dict[str, str] = {
    "float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "float8_e4m3fnuz": "fp8e4b8", "float8_e5m2fnuz": "fp8e5b16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1",
}


# Scalar(type=...) -> Triton signature type (Python floats are fp32 and ints i32 in Triton's own JIT).
SCALAR_SIGNATURE: dict[str, str] = {"float": "fp32", "int": "i32", "bool": "i1"}


# Triton signature type of a by-value parameter -> kernarg field type (bool travels as one byte).
FIELD_OF_SIGNATURE: dict[str, str] = {
    "fp64": "f64", "fp32": "f32", "fp16": "f16", "bf16": "bf16",
    "i64": "i64", "u64": "u64", "i32": "i32", "u32": "u32", "i16": "i16", "i8": "i8", "i1": "i8",
}


VALUE_TYPES = ("i32", "i64", "u32", "u64")


INT_RANGES: dict[str, tuple[int, int]] = {
    "i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-(2**63), 2**63 - 1), "u64": (0, 2**64 - 1),
}


# Spec.options keys this frontend interprets itself; other keys must be fields of Triton's backend options.
OWN_OPTIONS = ("divisible_by_16", "specialize")


VENDOR_KEYS = {"nvidia": "cuda", "amd": "hip"}


# Options the bundle format cannot honour (no cluster / cooperative / PDL launch attributes).
REFUSED_OPTIONS = {"num_ctas": 1, "launch_cooperative_grid": False, "launch_pdl": False}


@dataclasses.dataclass(frozen=True)
class RuntimeParam:
    """One non-constexpr kernel parameter and how the loader fills it.

    Attributes:
        name: the kernel's parameter name.
        signature: Triton signature type (``*fp32``, ``i32``, ``fp32``...).
        kind: kernarg field kind: ``pointer``, ``scalar``, ``shape`` / ``stride`` (a Value that is exactly
            one size or stride, so the loader sees which strides the kernel takes) or ``expr``.
        field_type: kernarg field type (``ptr``, ``i32``, ``f32``...).
        arg: the op argument (tensor, output or scalar) for ``pointer`` / ``scalar`` / ``shape`` / ``stride``.
        dim: the dimension (>= 0) for ``shape`` / ``stride``.
        expr: the integer expression (constexprs substituted) for ``expr``.
        value: the number a ``constant`` field holds (a float ``Value``, ``Value("eps", "1e-6", type="f32")``).
    """

    name: str
    signature: str
    kind: str
    field_type: str
    arg: Optional[str] = None
    dim: Optional[int] = None
    expr: Optional[str] = None
    value: Optional[float] = None

    @property
    def size(self) -> int:
        return FIELD_TYPES[self.field_type]


@dataclasses.dataclass(frozen=True)
class TritonPlan:
    """Everything ``triton.compile`` needs and everything the guard must say, before compiling.

    Attributes:
        fn: the ``triton.runtime.jit.JITFunction``.
        signature: parameter name -> Triton type (``"constexpr"`` for constexprs).
        constexprs: constexpr name -> value.
        attrs: ``{(index,): [["tt.divisibility", 16]]}`` for the specialized parameters.
        params: the runtime parameters, in kernel order.
        options: Triton options (``num_warps``, ``num_stages``, ...).
        grid: three grid expressions, constexprs substituted.
        constraints: guard constraints this compile relies on.
        alignment: tensor or output -> data pointer alignment (bytes) this compile relies on.
        jit_difference: how this compile's specialization differs from what Triton's JIT builds for the example
            call with aligned pointers (empty: the same).
    """

    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    attrs: dict[tuple[int, ...], list[list[Any]]]
    params: tuple[RuntimeParam, ...]
    options: dict[str, Any]
    grid: tuple[str, str, str]
    constraints: tuple[str, ...]
    alignment: dict[str, int]
    jit_difference: str = ""

    @property
    def num_warps(self) -> int:
        return int(self.options["num_warps"])


def _where(op: OpDecl, spec: Spec, target: str) -> str:
    return f"op {op.name} spec {spec.name} target {target}"


def _range_constraints(text: str, type_: str, where: str = "") -> list[str]:
    """Guard constraints keeping an integer expression inside a 32-bit kernel parameter type (expressions are
    64-bit; 64-bit parameters need none but a non-negative bound for ``u64``)."""
    lo, hi = INT_RANGES[type_]
    if _expr.is_constant(text):  # Value("x", "0"): nothing per call to guard; out of range it can never fit
        v = _expr.evaluate_with_shapes(text, {})
        if not lo <= v <= hi:
            raise FrontendError(f"{where + ': ' if where else ''}Value expression {text!r} is {v}; expected a value "
                                f"in {lo}..{hi} for its type {type_}; give the Value a wider type (i64) or another expression")
        return []
    out = []
    if not _expr.nonnegative(text) and lo >= -(2**31):
        out.append(_expr.canonical(f"({text}) >= {lo}"))
    if hi < 2**32:
        out.append(_expr.canonical(f"({text}) <= {hi}"))
    return out


def resolve_options(spec: Spec, target: _targets.TargetID, where: str,
                    launch: Optional[dict[str, Any]] = None) -> tuple[dict[str, Any], list[str], str]:
    """Split ``Spec.options`` into Triton options for this target and this frontend's own keys.

    ``options`` may hold per-target overrides as nested dicts keyed by vendor (``"cuda"``, ``"hip"``) or by
    target ID (``"sm_90"``, ``"gfx942"``); the target ID wins. ``divisible_by_16`` and ``specialize`` may not be
    overridden per target: the guard of a specialization is shared by all its targets. ``launch`` (one
    :class:`~flyship.compiler.spec.Launch`'s own options, same grammar) is laid over the spec's for that kernel.

    Returns:
        (Triton options with ``num_warps`` set, names listed in ``divisible_by_16``, the ``specialize`` mode:
        ``"jit"`` or ``"declared"``, the default).

    Raises:
        FrontendError: a per-target ``divisible_by_16``, a non-list ``divisible_by_16``, or an option the
            bundle format cannot honour (``num_ctas`` != 1, cooperative or PDL launch).
    """
    opts = {**_for_target(spec.options, target, where, "options"),
            **_for_target(launch or {}, target, where, "Launch options")}
    div = opts.pop("divisible_by_16", [])
    mode = opts.pop("specialize", "declared")
    if mode not in _jitspec.SPECIALIZE_MODES:
        raise FrontendError(f"{where}: options['specialize'] must be one of {_jitspec.SPECIALIZE_MODES} ('jit': as "
                            f"Triton's JIT would for the example call with aligned pointers; 'declared': only what "
                            f"the spec declares), got {mode!r}")
    if isinstance(div, str) or not all(isinstance(x, str) for x in div):
        raise FrontendError(f"{where}: options['divisible_by_16'] must be a list of argument names, got {div!r}")
    opts.setdefault("num_warps", 4)
    for k, ok in REFUSED_OPTIONS.items():
        if k in opts and opts[k] != ok:
            raise FrontendError(f"{where}: option {k}={opts[k]!r} is not supported (the bundle format launches "
                                f"plain grids, without clusters, cooperative groups or PDL); use {k}={ok!r}")
    if not isinstance(opts["num_warps"], int) or opts["num_warps"] < 1 or opts["num_warps"] & (opts["num_warps"] - 1):
        raise FrontendError(f"{where}: num_warps must be a power of two >= 1, got {opts['num_warps']!r}")
    return opts, list(div), mode


def _for_target(options: dict[str, Any], target: _targets.TargetID, where: str, what: str) -> dict[str, Any]:
    """``options`` as they apply to ``target``: the top-level keys, then the vendor's, the processor's and the
    full target ID's nested dicts over them."""
    base = {k: v for k, v in options.items() if not isinstance(v, dict)}
    for key in (k for k, v in options.items() if isinstance(v, dict) and k not in VENDOR_KEYS.values()):
        try:
            _targets.check_known(key)
        except BundleError as e:
            raise FrontendError(f"{where}: {what}[{key!r}] is a per-target override, but {key!r} is neither "
                                f"{' nor '.join(repr(v) for v in VENDOR_KEYS.values())} nor a known target ID "
                                f"such as 'sm_90' or 'gfx942' ({e})") from None
    per_target: dict[str, Any] = {}
    for key in (VENDOR_KEYS[target.vendor], target.processor, target.text):
        over = options.get(key)
        if isinstance(over, dict):
            for own in (k for k in OWN_OPTIONS if k in over):
                raise FrontendError(f"{where}: {what}[{key!r}] sets {own}; it must be the same for every target "
                                    "(the guard is per specialization), so set it at the top level")
            per_target.update(over)
    return {**base, **per_target}


def plan(op: OpDecl, spec: Spec, target: str, scope: Optional[OpDecl] = None) -> TritonPlan:
    """Work out the Triton signature, constexprs, attributes, options and the guard facts, without compiling.

    Args:
        op: the op as declared (``kernel`` is a ``@triton.jit`` function whose parameters are ``op.args``,
            same names, same order).
        spec: the specialization.
        target: target ID (``sm_90``, ``gfx942``...).
        scope: for one launch of a multi-launch op (``op`` is then :meth:`OpDecl.launch_view`), the whole op:
            expressions may name any of its inputs and constexprs, and the kernel gets only its own constexprs.

    Returns:
        A :class:`TritonPlan`.

    Raises:
        FrontendError: parameters that do not match the kernel, an unknown dtype or Value type, a
            ``divisible_by_16`` name that is not a tensor, output, int scalar or Value, or a block
            (``num_warps`` x warp size) over the target's limit. (Grid and Value expressions are checked when the
            spec is read: :func:`flyship.compiler.spec.validate`.)
    """
    where = _where(op, spec, target)
    tid = _targets.parse_target(target)
    fn = jit_function(op.kernel, where)
    check_params(op, fn, scope, where)
    options, divisible, mode = resolve_options(spec, tid, where, op.launch_options)
    _check_block(options["num_warps"], tid, where)
    slots = (scope or op).expression_slots()
    constexprs = _kernel_constexprs(op, spec, scope, where)
    _check_divisible(op, scope, divisible, slots, where)
    divisible = [d for d in divisible if d in {a.name for a in op.args}]  # a launch takes only some of them
    jit = _jitspec.jit_hints(op, spec, target, fn, scope, where)
    hints = _jitspec.declared_hints(op, divisible)
    if mode == "jit":
        hints = {**hints, **jit}
    int_constexprs = {k: v for k, v in spec.constexprs.items() if isinstance(v, int) and not isinstance(v, bool)}
    sig = _Signature(op, spec, hints, int_constexprs, slots, where, list(fn.arg_names))
    for i, a in enumerate(op.args):
        sig.add(i, a)
    return TritonPlan(fn=fn, signature=sig.signature, constexprs={**constexprs, **sig.constants}, attrs=sig.attrs,
                      params=tuple(sig.params), options=options, grid=_grid(op, int_constexprs, where),
                      constraints=tuple(dict.fromkeys(sig.constraints)), alignment=sig.alignment,
                      jit_difference="; ".join(d for d in (_jitspec.difference(hints, jit), _jitspec.type_difference(
                          op, spec, target, scope, hints, sig.signature, where)) if d))


def _check_divisible(op: OpDecl, scope: Optional[OpDecl], divisible: list[str], slots: dict[str, _expr.Slot],
                     where: str) -> None:
    """Refuse a ``divisible_by_16`` name that is no parameter of the op (of any of its launches)."""
    whole = scope or op
    known = set(slots) | {a.name for a in whole.args if isinstance(a, (Value, Workspace))}
    constexprs = {a.name for a in whole.args if isinstance(a, Constexpr)}
    for d in divisible:
        if d in constexprs:
            raise FrontendError(f"{where}: options['divisible_by_16'] names constexpr {d!r}; a constexpr is "
                                "compiled in with its value, so there is nothing to specialize")
        if d not in known:
            raise FrontendError(f"{where}: options['divisible_by_16'] names {d!r}, which is no tensor, output, "
                                f"scalar, Value or workspace of the op ({sorted(known)})")


def _check_block(num_warps: int, tid: _targets.TargetID, where: str) -> None:
    """Refuse a block (``num_warps`` x warp size) over the target's maximum workgroup size."""
    limits = _targets.limits(tid)
    block = num_warps * limits["wavefront_size"]
    if block > limits["max_workgroup_size"]:
        raise FrontendError(f"{where}: num_warps={num_warps} gives a block of {block} threads "
                            f"({num_warps} x warp size {limits['wavefront_size']}), over the target's "
                            f"limit of {limits['max_workgroup_size']}; use num_warps <= "
                            f"{limits['max_workgroup_size'] // limits['wavefront_size']}")


def check_params(op: OpDecl, fn: Any, scope: Optional[OpDecl], where: str) -> None:
    """An op's args are the kernel's parameters, same names, same order. A ``Launch`` binds by position (the same
    kernel may be launched twice on other buffers): same count, and a ``tl.constexpr`` parameter takes a
    ``Constexpr``. A ``Constexpr`` given to a runtime parameter is compiled in as a constant, for a ``Launch`` as
    for a single-launch op (Triton's ``ASTSource`` takes a runtime parameter as a constant the same way; before
    round 4 a ``Launch`` refused it, after compiling: CHANGELOG.md, "spec API").

    Raises:
        FrontendError: parameters that do not match, or a runtime declaration for a ``tl.constexpr`` parameter.
    """
    names = [a.name for a in op.args]
    if scope is None:
        if list(fn.arg_names) != names:
            raise FrontendError(f"{where}: the spec's args {names} must be the kernel {fn.__name__}'s parameters "
                                f"{list(fn.arg_names)}, same names in the same order")
        return
    if len(names) != len(fn.arg_names):
        raise FrontendError(f"{where}: the Launch passes {len(names)} arguments {names}; the kernel {fn.__name__} "
                            f"takes {len(fn.arg_names)} {list(fn.arg_names)}: pass one declaration per parameter, "
                            "in the kernel's order")
    for a, kp in zip(op.args, fn.params):
        if kp.is_constexpr and not isinstance(a, Constexpr):
            raise FrontendError(f"{where}: the Launch passes runtime {a.name!r} to the kernel's parameter "
                                f"{kp.name!r}, which is a tl.constexpr; expected a Constexpr there (declare "
                                f"Constexpr({kp.name!r}) in the op's args and give its value in each Spec's "
                                "constexprs)")


def _kernel_constexprs(op: OpDecl, spec: Spec, scope: Optional[OpDecl], where: str) -> dict[str, Any]:
    """The constexprs the kernel gets: the spec's (one launch of a multi-launch op: only its own, under the
    kernel's own parameter names: a Launch binds by position)."""
    own = {a.name for a in op.args if isinstance(a, Constexpr)}
    extra = set(spec.constexprs) - own
    if extra and scope is None:
        raise FrontendError(f"{where}: constexprs {sorted(extra)} are not Constexpr parameters of the kernel")
    if scope is None:
        return dict(spec.constexprs)
    fn = jit_function(op.kernel, where)
    return {k: spec.constexprs[a.name] for a, k in zip(op.args, fn.arg_names)
            if isinstance(a, Constexpr) and a.name in spec.constexprs}


def _grid(op: OpDecl, int_constexprs: dict[str, int], where: str) -> tuple[str, str, str]:
    """The op's grid as three expressions, constexprs written in."""
    grid_in = list(op.grid or ())
    if not 1 <= len(grid_in) <= 3:
        raise FrontendError(f"{where}: grid must have 1 to 3 expressions, got {grid_in}")
    # Each expression compiles against the op's inputs and outputs: spec.validate checked it when the spec was read.
    grid3 = [_expr.substitute(g, int_constexprs) for g in grid_in] + ["1"] * (3 - len(grid_in))
    return grid3[0], grid3[1], grid3[2]


class _Signature:
    """The signature, specialization attributes, runtime parameters and guard facts, one parameter at a time."""

    def __init__(self, op: OpDecl, spec: Spec, hints: dict[str, str], int_constexprs: dict[str, int],
                 slots: dict[str, _expr.Slot], where: str, knames: list[str]) -> None:
        self.op, self.spec, self.where = op, spec, where
        self.knames = knames  # the kernel's parameter names, by position (a Launch may bind others to them)
        self.divisible = [k for k, v in hints.items() if v == "D"]
        self.ones = {k for k, v in hints.items() if v == "1"}  # int parameters compiled as the constant 1
        self.constants: dict[str, int] = {}
        self.int_constexprs, self.slots = int_constexprs, slots
        self.signature: dict[str, str] = {}
        self.attrs: dict[tuple[int, ...], list[list[Any]]] = {}
        self.params: list[RuntimeParam] = []
        self.constraints: list[str] = []
        self.alignment: dict[str, int] = {}
        self.div16 = [["tt.divisibility", 16]]  # one list per plan, as Triton is handed it

    def add(self, i: int, a: Any) -> None:
        """Parameter ``i`` of the kernel, ``a`` its declaration."""
        if isinstance(a, Constexpr):
            self.signature[self.knames[i]] = "constexpr"
        elif isinstance(a, (Tensor, Output, Workspace)):
            self._buffer(i, a)
        elif isinstance(a, Scalar):
            self._scalar(i, a)
        elif isinstance(a, Value):
            self._value(i, a)
        else:  # pragma: no cover - spec.validate admits only the kinds above
            raise FrontendError(f"{self.where}: parameter {a!r} is of no known kind")

    def _buffer(self, i: int, a: Tensor | Output | Workspace) -> None:
        dtype = (self.spec.dtypes[a.name] if isinstance(a, Tensor) else a.dtype if isinstance(a, Workspace)
                 else self.op.output_dtype_for(a, self.spec))
        if dtype not in TRITON_DTYPES:
            raise FrontendError(f"{self.where}: {a.name} has dtype {dtype!r}, which Triton has no type for; "
                                f"expected one of {', '.join(TRITON_DTYPES)}")
        k = self.knames[i]
        self.signature[k] = "*" + TRITON_DTYPES[dtype]
        self.params.append(RuntimeParam(k, self.signature[k], "pointer", "ptr", arg=a.name))
        declared = a.alignment if isinstance(a, Tensor) and a.alignment else 0
        if declared:  # the spec's own requirement goes into the guard whatever the compile assumes
            self.alignment[a.name] = declared
        if (declared and declared % 16 == 0) or a.name in self.divisible:
            self.attrs[(i,)] = self.div16
            if not isinstance(a, Workspace):  # the loader allocates workspaces itself, aligned (docs/triton.md)
                self.alignment[a.name] = max(16, declared)

    def _scalar(self, i: int, a: Scalar) -> None:
        sig = SCALAR_SIGNATURE[a.type]
        if a.name in self.ones:
            self._one(i, a.name)
            return
        self.signature[self.knames[i]] = sig
        self.params.append(RuntimeParam(self.knames[i], sig, "scalar", FIELD_OF_SIGNATURE[sig], arg=a.name))
        if a.type == "int":
            self.constraints += _range_constraints(a.name, sig, self.where)
            if a.name in self.divisible:
                self.attrs[(i,)] = self.div16
                self.constraints.append(_expr.canonical(f"{a.name} % 16 == 0"))
        elif a.name in self.divisible:
            raise FrontendError(f"{self.where}: divisible_by_16 names {a.type} scalar {a.name!r}; only int scalars, "
                                "Values, tensors and outputs can be specialized")

    def _value(self, i: int, a: Value) -> None:
        if a.float_literal() is not None:  # Value("eps", "1e-6", type="f32"): an fp32 parameter, packed as a constant
            if a.name in self.divisible:
                raise FrontendError(f"{self.where}: divisible_by_16 names float Value {a.name!r}; only int scalars, "
                                    "Values, tensors and outputs can be specialized")
            # Triton's JIT passes a Python float as fp32 (specialize_impl), so the binary is the JIT's for the value.
            k = self.knames[i]
            self.signature[k] = "fp32"
            self.params.append(RuntimeParam(k, "fp32", "constant", "f32", value=a.float_literal()))
            return
        if a.type not in VALUE_TYPES:
            raise FrontendError(f"{self.where}: Value {a.name} has type {a.type!r}; expected one of {VALUE_TYPES} "
                                f"(or type='f32' with a float literal)")
        text = _expr.substitute(a.expr, self.int_constexprs)  # compiles: spec.validate checked it
        if a.name in self.ones:
            self._one(i, text)
            return
        self.signature[self.knames[i]] = a.type
        self.params.append(_value_param(self.knames[i], a.type, text, self.slots))
        self.constraints += _range_constraints(text, a.type, self.where)
        if a.name in self.divisible:
            self.attrs[(i,)] = self.div16
            self.constraints.append(_expr.canonical(f"({text}) % 16 == 0"))

    def _one(self, i: int, text: str) -> None:
        """An int parameter compiled as the constant 1, as Triton's JIT does for an argument equal to 1: no kernel
        parameter, and the guard ``text == 1``."""
        self.signature[self.knames[i]] = "constexpr"
        self.constants[self.knames[i]] = 1
        self.constraints.append(_expr.canonical(f"({text}) == 1"))


def _value_param(name: str, type_: str, text: str, slots: dict[str, _expr.Slot]) -> RuntimeParam:
    """A Value parameter: a ``shape`` / ``stride`` field when its expression is exactly ``t.shape[d]`` /
    ``t.stride[d]`` (the loader then knows the kernel takes that stride), else an ``expr`` field."""
    dim = _expr.dimension(text)
    if dim is not None:
        tensor, what, idx = dim
        rank = slots[tensor].rank
        return RuntimeParam(name, type_, what, type_, arg=tensor, dim=idx % rank)
    return RuntimeParam(name, type_, "expr", type_, expr=text)
