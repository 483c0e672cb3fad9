"""The Triton frontend: compile a ``@triton.jit`` kernel on the CPU and ship Triton's own binary unchanged.

The only module that imports ``triton`` (lazily, inside the worker process of one target). What it relies
on (Triton 3.6.0, read in ``triton/compiler/compiler.py`` and ``triton/backends/{nvidia,amd}/``, and
checked on the cubins / hsacos it makes; ``docs/triton.md`` has the long form):

* ``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget(...), options=...)``
  compiles without a GPU: ``GPUTarget("cuda", 90, 32)`` gives a cubin (ptxas is told ``sm_90a``, so the
  cubin is arch-specific), ``GPUTarget("hip", "gfx942", 64)`` an hsaco.
* The signature is explicit, so nothing is specialized behind our back: Triton's JIT would turn an int
  argument equal to 1 into a constant and mark ints and pointers divisible by 16 with ``tt.divisibility``;
  here an argument is specialized only when the spec asks (``Tensor(alignment=16)`` or
  ``options={"divisible_by_16": [...]}``), and then the guard gets the matching alignment / constraint.
* Every Triton 3.6 kernel takes two hidden trailing pointer parameters after its own: global scratch and
  profile scratch. The launchers pass a buffer of ``grid programs x num_ctas x global_scratch_size`` bytes
  (aligned to ``global_scratch_align``) for the first when ``global_scratch_size > 0`` (e.g. a kernel that
  builds TMA descriptors with ``tl.make_tensor_descriptor`` on sm_90), else null; the second is null unless
  proton instrumentation is on (refused here). The AMD launcher always passes null global scratch.
* The launch block is ``num_warps x warp size`` (32 on NVIDIA and RDNA, 64 on CDNA) and the dynamic shared
  memory is the metadata's ``shared`` bytes; ``num_ctas`` must be 1 (no clusters), and cooperative and PDL
  launches are not supported by the bundle format.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import re
from typing import Any, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import targets as _targets
from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.cubin import CubinFile
from flyship.bundle.errors import BundleError
from flyship.bundle.manifest import FIELD_TYPES, KernargField, KernargLayout, KernelMetadata, Launch, Proof
from flyship.compiler.configs import Autotuned, Config, is_native, native_pairs, refuse_pre_hook
from flyship.compiler.frontends.base import (BuildContext, DSLError, Frontend, FrontendError, KernelBuild,
                                            WorkerSetup, example_grid)
from flyship.compiler.spec import Constexpr, OpDecl, Output, Scalar, Spec, Tensor, Value, Workspace
from flyship.errors import SpecError

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
HIDDEN_PARAMS = ("global_scratch", "profile_scratch")
# Spec.options keys this frontend interprets itself; other keys must be fields of Triton's backend options.
OWN_OPTIONS = ("divisible_by_16",)
VENDOR_KEYS = {"nvidia": "cuda", "amd": "hip"}
# Triton backend options a tuning Config may set (triton.Config's fields and the AMD backend's knobs); a Spec's
# options= may hold any other field of Triton's backend options as well.
CONFIG_OPTIONS = ("num_warps", "num_stages", "waves_per_eu", "maxnreg", "matrix_instr_nonkdim", "kpack")
# Options the bundle format cannot honour (no cluster / cooperative / PDL launch attributes).
# triton.Config fields flyship can launch only at this value (read_config refuses others).
CONFIG_DEFAULTS_DROPPED = {"num_ctas": 1}
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
    """

    name: str
    signature: str
    kind: str
    field_type: str
    arg: Optional[str] = None
    dim: Optional[int] = None
    expr: Optional[str] = None

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

    @property
    def num_warps(self) -> int:
        return int(self.options["num_warps"])


def version() -> str:
    """The installed Triton version."""
    import triton

    return str(triton.__version__)


def _where(op: OpDecl, spec: Spec, target: str) -> str:
    return f"op {op.name} spec {spec.name} target {target}"


def jit_function(kernel: Any, where: str) -> Any:
    """The ``JITFunction`` behind a spec's ``kernel=`` (unwrapping ``@triton.heuristics``).

    Raises:
        FrontendError: an ``@triton.autotune`` kernel not declared through ``op()`` (docs/tuning.md) or
            anything that is not a ``@triton.jit`` function.
    """
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, Autotuner):
        raise FrontendError(f"{where}: kernel {kernel.fn.__name__} is @triton.autotune'd; declare it with op() (which "
                            "reads its configs as a config space, docs/tuning.md) or declare each config as a "
                            "Spec(constexprs=..., options={'num_warps': ...}) with the bare @triton.jit function")
    fn = kernel
    while not isinstance(fn, JITFunction) and hasattr(fn, "fn"):
        fn = fn.fn
    if not isinstance(fn, JITFunction):
        raise FrontendError(f"{where}: expected a @triton.jit function, got {type(kernel).__module__}."
                            f"{type(kernel).__name__}")
    return fn


def triton_target(target: _targets.TargetID) -> Any:
    """The ``triton.backends.compiler.GPUTarget`` for a target ID (warp size from the target's limits)."""
    from triton.backends.compiler import GPUTarget

    warp = _targets.limits(target)["wavefront_size"]
    if target.vendor == "nvidia":
        return GPUTarget("cuda", target.sm, warp)
    return GPUTarget("hip", target.processor, warp)


def _range_constraints(text: str, type_: str, where: str = "") -> list[str]:
    """Guard constraints keeping an integer expression inside a 32-bit kernel parameter type (expressions are
    64-bit; 64-bit parameters need none but a non-negative bound for ``u64``)."""
    lo, hi = INT_RANGES[type_]
    if _expr.is_constant(text):  # Value("x", "0"): nothing per call to guard; out of range it can never fit
        v = _expr.evaluate_with_shapes(text, {})
        if not lo <= v <= hi:
            raise FrontendError(f"{where + ': ' if where else ''}Value expression {text!r} is {v}; expected a value in {lo}..{hi} for its type "
                                f"{type_}; give the Value a wider type (i64) or another expression")
        return []
    out = []
    if not _expr.nonnegative(text) and lo >= -(2**31):
        out.append(_expr.canonical(f"({text}) >= {lo}"))
    if hi < 2**32:
        out.append(_expr.canonical(f"({text}) <= {hi}"))
    return out


def resolve_options(spec: Spec, target: _targets.TargetID, where: str) -> tuple[dict[str, Any], list[str]]:
    """Split ``Spec.options`` into Triton options for this target and this frontend's own keys.

    ``options`` may hold per-target overrides as nested dicts keyed by vendor (``"cuda"``, ``"hip"``) or by
    target ID (``"sm_90"``, ``"gfx942"``); the target ID wins. ``divisible_by_16`` may not be overridden per
    target: the guard of a specialization is shared by all its targets.

    Returns:
        (Triton options with ``num_warps`` set, names listed in ``divisible_by_16``).

    Raises:
        FrontendError: a per-target ``divisible_by_16``, a non-list ``divisible_by_16``, or an option the
            bundle format cannot honour (``num_ctas`` != 1, cooperative or PDL launch).
    """
    base = {k: v for k, v in spec.options.items() if not isinstance(v, dict)}
    for key in (k for k, v in spec.options.items() if isinstance(v, dict) and k not in VENDOR_KEYS.values()):
        try:
            _targets.check_known(key)
        except BundleError as e:
            raise FrontendError(f"{where}: options[{key!r}] is a per-target override, but {key!r} is neither "
                                f"{' nor '.join(repr(v) for v in VENDOR_KEYS.values())} nor a known target ID "
                                f"such as 'sm_90' or 'gfx942' ({e})") from None
    per_target: dict[str, Any] = {}
    for key in (VENDOR_KEYS[target.vendor], target.processor, target.text):
        over = spec.options.get(key)
        if isinstance(over, dict):
            if "divisible_by_16" in over:
                raise FrontendError(f"{where}: options[{key!r}] sets divisible_by_16; it must be the same for "
                                    "every target (the guard is per specialization), so set it at the top level")
            per_target.update(over)
    opts = {**base, **per_target}
    div = opts.pop("divisible_by_16", [])
    if isinstance(div, str) or not all(isinstance(x, str) for x in div):
        raise FrontendError(f"{where}: options['divisible_by_16'] must be a list of argument names, got {div!r}")
    opts.setdefault("num_warps", 4)
    for k, ok in REFUSED_OPTIONS.items():
        if k in opts and opts[k] != ok:
            raise FrontendError(f"{where}: option {k}={opts[k]!r} is not supported (the bundle format launches "
                                f"plain grids, without clusters, cooperative groups or PDL); use {k}={ok!r}")
    if not isinstance(opts["num_warps"], int) or opts["num_warps"] < 1 or opts["num_warps"] & (opts["num_warps"] - 1):
        raise FrontendError(f"{where}: num_warps must be a power of two >= 1, got {opts['num_warps']!r}")
    return opts, list(div)


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
    limits = _targets.limits(tid)
    fn = jit_function(op.kernel, where)
    names = [a.name for a in op.args]
    if list(fn.arg_names) != names:
        raise FrontendError(f"{where}: the spec's args {names} must be the kernel {fn.__name__}'s parameters "
                            f"{list(fn.arg_names)}, same names in the same order")
    options, divisible = resolve_options(spec, tid, where)
    block = options["num_warps"] * limits["wavefront_size"]
    if block > limits["max_workgroup_size"]:
        raise FrontendError(f"{where}: num_warps={options['num_warps']} gives a block of {block} threads "
                            f"({options['num_warps']} x warp size {limits['wavefront_size']}), over the target's "
                            f"limit of {limits['max_workgroup_size']}; use num_warps <= "
                            f"{limits['max_workgroup_size'] // limits['wavefront_size']}")
    slots = (scope or op).expression_slots()
    known = set(slots) | {a.name for a in op.args if isinstance(a, (Value, Workspace))}
    own = {a.name for a in op.args if isinstance(a, Constexpr)}
    constexprs = {k: v for k, v in spec.constexprs.items() if k in own} if scope else dict(spec.constexprs)
    extra = set(spec.constexprs) - own
    if extra and scope is None:
        raise FrontendError(f"{where}: constexprs {sorted(extra)} are not Constexpr parameters of the kernel")
    for d in divisible:
        if d not in known:
            raise FrontendError(f"{where}: options['divisible_by_16'] names {d!r}, which is no tensor, output, "
                                f"scalar or Value of the op ({sorted(known)})")
    int_constexprs = {k: v for k, v in spec.constexprs.items() if isinstance(v, int) and not isinstance(v, bool)}

    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    params: list[RuntimeParam] = []
    constraints: list[str] = []
    alignment: dict[str, int] = {}
    div16 = [["tt.divisibility", 16]]
    for i, a in enumerate(op.args):
        if isinstance(a, Constexpr):
            signature[a.name] = "constexpr"
            continue
        if isinstance(a, (Tensor, Output, Workspace)):
            dtype = (spec.dtypes[a.name] if isinstance(a, Tensor) else a.dtype if isinstance(a, Workspace)
                     else op.output_dtype_for(a, spec))
            if dtype not in TRITON_DTYPES:
                raise FrontendError(f"{where}: {a.name} has dtype {dtype!r}, which Triton has no type for; "
                                    f"expected one of {', '.join(TRITON_DTYPES)}")
            signature[a.name] = "*" + TRITON_DTYPES[dtype]
            params.append(RuntimeParam(a.name, signature[a.name], "pointer", "ptr", arg=a.name))
            declared = a.alignment if isinstance(a, Tensor) and a.alignment else 0
            if declared:  # the spec's own requirement goes into the guard whatever the compile assumes
                alignment[a.name] = declared
            if (declared and declared % 16 == 0) or a.name in divisible:
                attrs[(i,)] = div16
                alignment[a.name] = max(16, declared)
        elif isinstance(a, Scalar):
            sig = SCALAR_SIGNATURE[a.type]
            signature[a.name] = sig
            params.append(RuntimeParam(a.name, sig, "scalar", FIELD_OF_SIGNATURE[sig], arg=a.name))
            if a.type == "int":
                constraints += _range_constraints(a.name, sig, where)
                if a.name in divisible:
                    attrs[(i,)] = div16
                    constraints.append(_expr.canonical(f"{a.name} % 16 == 0"))
            elif a.name in divisible:
                raise FrontendError(f"{where}: divisible_by_16 names {a.type} scalar {a.name!r}; only int scalars, "
                                    "Values, tensors and outputs can be specialized")
        elif isinstance(a, Value):
            if a.type not in VALUE_TYPES:
                raise FrontendError(f"{where}: Value {a.name} has type {a.type!r}; expected one of {VALUE_TYPES}")
            text = _expr.substitute(a.expr, int_constexprs)  # compiles: spec.validate checked it
            signature[a.name] = a.type
            params.append(_value_param(a.name, a.type, text, slots))
            constraints += _range_constraints(text, a.type, where)
            if a.name in divisible:
                attrs[(i,)] = div16
                constraints.append(_expr.canonical(f"({text}) % 16 == 0"))
        else:  # pragma: no cover - spec.validate admits only the kinds above
            raise FrontendError(f"{where}: parameter {a!r} is of no known kind")
    grid_in = list(op.grid or ())
    if not 1 <= len(grid_in) <= 3:
        raise FrontendError(f"{where}: grid must have 1 to 3 expressions, got {grid_in}")
    # Each expression compiles against the op's inputs and outputs: spec.validate checked it when the spec was read.
    grid3 = [_expr.substitute(g, int_constexprs) for g in grid_in] + ["1"] * (3 - len(grid_in))
    return TritonPlan(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs, params=tuple(params),
                      options=options, grid=(grid3[0], grid3[1], grid3[2]),
                      constraints=tuple(dict.fromkeys(constraints)), alignment=alignment)


def _value_param(name: str, type_: str, text: str, slots: dict[str, _expr.Slot]) -> RuntimeParam:
    """A Value parameter: a ``shape`` / ``stride`` field when its expression is exactly ``t.shape[d]`` /
    ``t.stride[d]`` (the loader then knows the kernel takes that stride), else an ``expr`` field."""
    node = _expr.parse(text)
    if isinstance(node, ast.Subscript):
        tensor, what, idx = node.value.value.id, node.value.attr, int(ast.literal_eval(node.slice))
        rank = slots[tensor].rank
        return RuntimeParam(name, type_, what, type_, arg=tensor, dim=idx % rank)
    return RuntimeParam(name, type_, "expr", type_, expr=text)


@contextlib.contextmanager
def _triton_cache(ctx: BuildContext):
    """Point Triton's compile cache at this variant's work folder, so every build really compiles."""
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = str(ctx.workdir / "triton-cache")
        yield


def run_triton(p: TritonPlan, tid: _targets.TargetID, ctx: BuildContext, where: str) -> Any:
    """``triton.compile`` the plan for one target; returns Triton's ``CompiledKernel``.

    Raises:
        FrontendError: carrying Triton's own message, or an option Triton's backend does not know.
    """
    import triton
    from triton.compiler import ASTSource, make_backend

    gpu_target = triton_target(tid)
    backend = make_backend(gpu_target)
    known = {f.name for f in dataclasses.fields(backend.parse_options({}))}
    unknown = set(p.options) - known
    if unknown:
        raise FrontendError(f"{where}: options {sorted(unknown)} are not Triton {gpu_target.backend} options; "
                            f"known: {', '.join(sorted(known))} (plus flyship's {', '.join(OWN_OPTIONS)})")
    try:
        with _triton_cache(ctx):
            return triton.compile(ASTSource(p.fn, p.signature, p.constexprs, p.attrs), target=gpu_target,
                                  options=dict(p.options))
    except Exception as e:
        raise DSLError(f"{where}: Triton failed to compile {p.fn.__name__}: {type(e).__name__}: {e}") from None


def read_metadata(binary: bytes, fmt: str, symbol: str, p: TritonPlan, tid: _targets.TargetID,
                  where: str) -> tuple[KernelMetadata, str, Optional[int]]:
    """The kernel's metadata from the code object itself, with the parameter names of the signature.

    Returns:
        (metadata, the code object's own target ID, AMDHSA code object version or None).

    Raises:
        FrontendError: the code object's target is not the one asked for, or its parameters are not the
            signature's plus Triton's two hidden pointers (count, sizes, pointer kinds).
    """
    names = [x.name for x in p.params] + list(HIDDEN_PARAMS)
    pointers = [i for i, x in enumerate(p.params) if x.kind == "pointer"] + [len(p.params), len(p.params) + 1]
    limit = _targets.limits(tid)["max_workgroup_size"]
    try:
        if fmt == "cubin":
            cubin = CubinFile(binary, f"{symbol}.cubin")
            n = len(cubin.kernel_params(symbol))
            if n != len(names):
                raise FrontendError(f"{where}: the cubin's kernel {symbol} has {n} parameters; expected the "
                                    f"{len(p.params)} of the signature plus Triton's 2 hidden pointers ({names})")
            meta = cubin.kernel_metadata(symbol, pointer_ordinals=pointers, names=names, max_threads=limit)
            co_target, co_version = cubin.target, None
            co = _targets.parse_target(co_target)
            if co.sm != tid.sm:
                raise FrontendError(f"{where}: Triton built a cubin for {co_target}, expected sm_{tid.sm}")
        else:
            hsaco = CodeObjectFile(binary, f"{symbol}.hsaco")
            meta = hsaco.kernel_metadata(symbol)
            co_target, co_version = hsaco.target, hsaco.code_object_version
            co = _targets.parse_target(co_target)
            asked = dict(tid.features)
            if co.processor != tid.processor or any(asked.get(k, v) != v for k, v in co.features):
                raise FrontendError(f"{where}: Triton built an hsaco for {co_target}, which does not run on "
                                    f"{tid.text}")
            explicit = [a for a in meta.args if not a.hidden]
            if len(explicit) != len(names):
                raise FrontendError(f"{where}: the hsaco's kernel {symbol} has {len(explicit)} explicit arguments; "
                                    f"expected the {len(p.params)} of the signature plus Triton's 2 hidden pointers "
                                    f"({names})")
            kinds = {i: a.value_kind for i, a in enumerate(explicit)}
            bad = [names[i] for i in pointers if kinds[i] != "global_buffer"]
            if bad:
                raise FrontendError(f"{where}: hsaco arguments {bad} should be global_buffer pointers")
            renamed = iter(names)
            meta = dataclasses.replace(meta, args=tuple(
                a if a.hidden else dataclasses.replace(a, name=next(renamed)) for a in meta.args))
    except BundleError as e:
        raise FrontendError(f"{where}: {e}") from None
    explicit = sorted((a for a in meta.args if not a.hidden), key=lambda a: a.offset)
    for a, x in zip(explicit, p.params):
        if a.size != x.size:
            raise FrontendError(f"{where}: kernel parameter {x.name} ({x.signature}) is {a.size} bytes in the code "
                                f"object, expected {x.size}")
    return meta, co_target, co_version


def kernarg_layout(meta: KernelMetadata, p: TritonPlan, global_scratch: tuple[int, int], where: str) -> KernargLayout:
    """One kernarg field per explicit parameter at the code object's own offsets.

    Args:
        meta: the kernel's metadata (explicit args in parameter order, hidden pointers last).
        p: the plan (what each parameter is bound to).
        global_scratch: ``(bytes per program, alignment)``; ``(0, _)`` when the kernel needs none.
        where: for messages.

    Returns:
        The layout (the common tail checks it against the metadata).
    """
    explicit = sorted((a for a in meta.args if not a.hidden), key=lambda a: a.offset)
    fields = []
    for a, x in zip(explicit, p.params):
        fields.append(KernargField(offset=a.offset, size=x.size, kind=x.kind, type=x.field_type, arg=x.arg,
                                   dim=x.dim, expr=x.expr, kernel_arg=x.name))
    g, prof = explicit[len(p.params)], explicit[len(p.params) + 1]
    size, align = global_scratch
    if size > 0:
        fields.append(KernargField(offset=g.offset, size=8, kind="scratch", type="ptr", bytes_per_program=size,
                                   align=align, kernel_arg=HIDDEN_PARAMS[0]))
    else:
        fields.append(KernargField(offset=g.offset, size=8, kind="null", type="ptr", kernel_arg=HIDDEN_PARAMS[0]))
    fields.append(KernargField(offset=prof.offset, size=8, kind="null", type="ptr", kernel_arg=HIDDEN_PARAMS[1]))
    extent = max(a.offset + a.size for a in explicit)
    return KernargLayout(size=extent, alignment=max(8, meta.kernarg_segment_align), fields=tuple(fields))


def ptxas_version(arch: int) -> Optional[str]:
    """ptxas's version (``12.8.93``) as Triton runs it for ``sm_<arch>``, or None if it cannot be asked."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version

        m = re.search(r"V(\d+\.\d+\.\d+)", get_ptxas_version(arch))
        return m.group(1) if m else None
    except Exception:
        return None


class TritonFrontend(Frontend):
    """``@triton.jit`` kernels, for NVIDIA (cubin) and AMD (hsaco) targets: Triton's own binary, unchanged."""

    name = "triton"
    title = "Triton kernel"
    vendors = frozenset({"amd", "nvidia"})
    needs_llvm = False
    declares_grid = True
    config_options = CONFIG_OPTIONS
    packages = ("triton",)
    # Triton's switches: TRITON_*, and MLIR_* / AMDGCN_* for its MLIR passes and AMD backend (MLIR_ENABLE_DUMP,
    # AMDGCN_USE_BUFFER_OPS); LLVM_* is every build's (flyship.compiler.cache).
    env_prefixes = ("TRITON_", "MLIR_", "AMDGCN_")
    install_hint = ("run flyc-build from the build environment (make install creates .venv-flydsl: "
                    ".venv-flydsl/bin/flyc-build), or pip install triton==3.6.0 there")

    def accepts(self, kernel: Any) -> bool:
        return (type(kernel).__module__ or "").startswith("triton")

    def check_target(self, target: _targets.TargetID) -> None:
        # Triton's AMD target is a bare processor name (GPUTarget("hip", "gfx942", 64); its passes compare it with
        # "gfx942" and LLVM takes it as the CPU name), so it cannot be told sramecc/xnack. Its hsaco leaves both
        # unspecified, which runs on every device of the processor whatever their setting.
        if target.features:
            raise FrontendError(f"--arch {target.text}: Triton compiles for a processor, not for target features "
                                f"({', '.join(k + v for k, v in target.features)}); its hsaco for {target.processor} "
                                f"leaves sramecc and xnack unspecified and runs on every {target.processor} device "
                                f"whatever their setting: use --arch {target.processor}")

    def read_autotuner(self, kernel: Any) -> Optional[Autotuned]:
        # triton.runtime.autotuner.Autotuner: .fn, .configs, .keys, .early_config_prune.
        if not is_native(kernel, "Autotuner", self.packages):
            return None
        return Autotuned(kernel.fn, native_pairs(kernel, self.read_config, "triton"), list(kernel.keys),
                         getattr(kernel, "early_config_prune", None))

    def read_config(self, config: Any) -> Optional[Config]:
        # triton.Config: kwargs (constexprs), num_warps, num_stages, maxnreg; num_ctas != 1 is refused.
        if not is_native(config, "Config", self.packages):
            return None
        refuse_pre_hook(config)
        values = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
        if getattr(config, "maxnreg", None) is not None:
            values["maxnreg"] = config.maxnreg
        for k, ok in CONFIG_DEFAULTS_DROPPED.items():
            if getattr(config, k, ok) != ok:
                raise SpecError(f"config {config}: sets {k}={getattr(config, k)}; flyship launches only {k}={ok}")
        return Config(**values)

    def config_block(self, config: Config, target: _targets.TargetID) -> Optional[int]:
        return int(config.values.get("num_warps", 4)) * _targets.limits(target)["wavefront_size"]

    def prepare_worker(self, setup: WorkerSetup) -> None:
        import os
        import tempfile

        os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cache-", dir=setup.scratch_root))

    def version(self) -> str:
        return version()

    def compile(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext) -> KernelBuild:
        """Compile one specialization of a Triton op for one target.

        Args:
            op: the op (its ``kernel`` a ``@triton.jit`` function, ``grid`` its grid expressions).
            spec: the specialization (dtypes, constexprs, options such as ``num_warps``, ``num_stages``,
                ``divisible_by_16`` and per-target overrides).
            target: ``sm_90`` (any ``sm_XX`` flyship has limits for) or ``gfx942`` / ``gfx950`` / ...
            ctx: build context; ``ctx.workdir`` holds Triton's cache for this compile.

        Returns:
            A :class:`KernelBuild` holding Triton's binary unchanged (``proof.method`` ``frontend-binary``),
            block ``num_warps x warp size``, the metadata's ``shared`` bytes as dynamic shared memory, and the
            guard constraints / alignment the compile relies on; ``facts`` is ``(plan, global scratch)``.
            ``target`` is the code object's own target ID (``sm_90a`` for an ``sm_90`` request: Triton always
            asks ptxas for the arch-specific variant).

        Raises:
            FrontendError: naming op, specialization and target, for every refusal of :func:`plan`, for
                Triton's own compile errors, and for a kernel that needs profile scratch (proton
                instrumentation) or whose example violates its guard (checked before compiling).
        """
        if op.launches:  # kernel=[Launch(...), ...]: each kernel compiled alone, the tail binds the workspaces
            builds = [self._compile_one(op.launch_view(launch), spec, target, ctx, op,
                                        f"{_where(op, spec, target)} launch {k + 1} ({launch.kernel.__name__})")
                      for k, launch in enumerate(op.launches)]
            return dataclasses.replace(builds[0], then=tuple(builds[1:]))
        return self._compile_one(op, spec, target, ctx, None, _where(op, spec, target))

    def _compile_one(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext, scope: Optional[OpDecl],
                     where: str) -> KernelBuild:
        """One kernel: ``op`` is the op, or (``scope`` the op) the view of one of its launches."""
        tid = _targets.parse_target(target)
        p = plan(op, spec, target, scope)
        whole = scope or op
        grid_at_example, _, _ = example_grid(whole, spec, p.grid, (*p.constraints, *whole.constraints(spec)), where,
                                             target=target)
        kernel = run_triton(p, tid, ctx, where)
        md = kernel.metadata
        fmt = "cubin" if tid.vendor == "nvidia" else "hsaco"
        binary = bytes(kernel.asm[fmt])
        symbol = str(md.name)
        if int(getattr(md, "profile_scratch_size", 0) or 0) > 0:
            raise FrontendError(f"{where}: kernel {symbol} needs profile scratch memory (proton instrumentation is "
                                "on); unset TRITON_INSTRUMENTATION_MODE for a shippable build")
        scratch_size = int(getattr(md, "global_scratch_size", 0) or 0) * int(getattr(md, "num_ctas", 1) or 1)
        scratch_align = int(getattr(md, "global_scratch_align", 1) or 1)
        wave = _targets.limits(tid)["wavefront_size"]
        if int(md.warp_size) != wave:
            raise FrontendError(f"{where}: Triton compiled for warp size {md.warp_size}, expected the target's {wave}")
        block = int(md.num_warps) * wave
        launch = Launch(grid=p.grid, block=(block, 1, 1), dynamic_lds=str(int(md.shared or 0)))
        toolchain = {"triton": version()}
        if tid.vendor == "nvidia":
            ptxas = ptxas_version(tid.sm)
            if ptxas:
                toolchain["ptxas"] = ptxas
        isa = None
        if ctx.keep_ir:
            isa = str(kernel.asm.get("ptx" if fmt == "cubin" else "amdgcn", "")) or None
        written, accumulated = written_params(kernel, p, where)
        co_target = target
        if tid.vendor == "nvidia":  # the cubin's own arch (sm_90a); read_metadata checks it is the one asked for
            co_target = _cubin_target(binary, symbol, where)
        return KernelBuild(
            target=co_target, code_object=binary, format=fmt, symbol=symbol, launch=launch,
            proof=Proof(method="frontend-binary", reference_sha256=hashlib.sha256(binary).hexdigest(),
                        identical_sections=(), kernel_descriptor="n/a", metadata="n/a"),
            toolchain=toolchain, example_grid=grid_at_example, constraints=p.constraints, alignment=dict(p.alignment),
            isa=isa, facts=(p, tid, (scratch_size, scratch_align)), written=written, accumulated=accumulated)

    def read_metadata(self, build: KernelBuild, where: str) -> tuple[KernelMetadata, Optional[int]]:
        p, tid, _ = build.facts
        meta, _, co_version = read_metadata(build.code_object, build.format, build.symbol, p, tid, where)
        wave = _targets.limits(tid)["wavefront_size"]
        if meta.wavefront_size != wave:
            raise FrontendError(f"{where}: the code object says warp size {meta.wavefront_size}, expected the "
                                f"target's {wave}")
        return meta, co_version

    def kernarg_layout(self, build: KernelBuild, meta: KernelMetadata, where: str) -> KernargLayout:
        p, _, scratch = build.facts
        return kernarg_layout(meta, p, scratch, where)


def written_params(kernel: Any, p: TritonPlan, where: str) -> tuple[frozenset[int], frozenset[int]]:
    """The runtime parameters (code-object order: the signature's non-constexpr ones) that the kernel's TTIR
    stores or atomically updates through (:func:`flyship.compiler.frontends.writes.ttir_written_params`), and
    those it updates with an atomic read-modify-write (:func:`~flyship.compiler.frontends.writes.
    ttir_accumulated_params`).

    Raises:
        FrontendError: the TTIR's parameters are not the plan's, position by position (count, pointer or not):
            the binding would be wrong.
    """
    from flyship.compiler.frontends import writes

    try:
        ttir = str(kernel.asm["ttir"])
        declared = writes.ttir_params(ttir)
        _names, written = writes.ttir_written_params(ttir)
        accumulated = writes.ttir_accumulated_params(ttir)
    except (KeyError, ValueError) as e:
        raise FrontendError(f"{where}: cannot read which parameters the kernel writes from its TTIR: {e}") from None
    # By position: the TTIR's argument names are the printer's, taken from the last local a kernel binds each
    # argument to (``src = out; if flag: src = x`` prints both as %src, %src_0), not the parameter names.
    got = [("pointer" if t.startswith("!tt.ptr") else "value") for _n, t in declared]
    want = [("pointer" if q.kind == "pointer" else "value") for q in p.params]
    if got != want:
        raise FrontendError(f"{where}: expected the TTIR to declare the kernel's runtime parameters "
                            f"{[q.name for q in p.params]} ({', '.join(want)}), got {len(got)}: "
                            f"{', '.join(f'{n}: {t}' for n, t in declared)}; report this with the kernel (Triton "
                            f"{version()})")
    return frozenset(written), frozenset(accumulated)


def _cubin_target(binary: bytes, symbol: str, where: str) -> str:
    try:
        return CubinFile(binary, f"{symbol}.cubin").target
    except BundleError as e:
        raise FrontendError(f"{where}: {e}") from None
