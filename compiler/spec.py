"""The spec API: how a spec file declares the ops ``flyc-build`` compiles.

A spec file is plain Python run under the build Python. It imports its kernels and declares ops::

    from flyship.compiler.spec import Tensor, Output, Scalar, Constexpr, Spec, namespace, references, op
    from elementwise import add                     # a FlyDSL @flyc.jit launcher

    namespace("flyship_examples")                   # torch.ops.flyship_examples.*
    references("references.py")                     # torch-only module copied into the bundle

    op("add", kernel=add,
       args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x")],  # kernel parameter order
       reference="add_ref",
       specs=[Spec("f32", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (1000, 1000), "y": (1000, 1000)})])

``args`` lists the kernel's parameters in order. ``Tensor`` and ``Scalar`` become the op's inputs
(in that order), ``Output`` its outputs; ``Constexpr`` takes a per-specialization value; ``Value``
passes an integer computed from the inputs (Triton kernels take ``n_elements`` this way). A FlyDSL
launcher's grid and kernarg layout are read from what FlyDSL lowered; a Triton kernel declares its
grid (``grid=("cdiv(x.numel, BLOCK)",)``), an expression over the inputs and constexprs.
See docs/spec-api.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from flyship.bundle import expr as _expr
from flyship.bundle import rules as _rules
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.bundle.manifest import DTYPES, SCALAR_TYPES, Backward
from flyship.compiler.configs import Config  # noqa: F401  (re-exported: a spec file declares configs=[Config(...)])
from flyship.compiler.configs import kernel_name as _kernel_name
from flyship.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Tensor:
    """An input tensor parameter.

    Args:
        name: argument name in the op's schema.
        rank: number of dimensions.
        alignment: required data-pointer alignment in bytes (default: the element size).
        pointee: for a FlyDSL launcher parameter annotated ``fx.Pointer``: the element type of the pointer
            flyship passes for this tensor (a dtype name; default: the tensor's dtype). Upstream builders often
            pass bytes: ``flyc.from_c_void_p(fx.Uint8, t.data_ptr())`` is ``pointee="uint8"``.
        mutable: the kernel writes this input in place (a KV cache, an accumulator, the residual of a fused
            add + RMSNorm). The torch schema says ``Tensor(a!) name``, no fresh output is made for it, and the
            op's reference must write it in place too. flyc-build refuses a kernel that stores through a tensor
            declared neither an ``Output`` nor ``mutable``.
        batch: accept leading batch dimensions: a call's ``(B, S, H)`` reaches the kernel, written for ``rank``
            dims ``(M, H)``, as the view ``(B*S, H)`` (no copy; a layout that does not flatten to a view falls
            back to the reference, or raises with the fallback off). Batched inputs of one call must share
            their leading dims. See docs/spec-api.md, "Leading batch dimensions".

    Example::

        op("fused_add_rmsnorm", kernel=..., args=[Tensor("x", rank=2), Tensor("residual", rank=2, mutable=True),
                                               Tensor("w", rank=1), Output("out", like="x"), Scalar("eps")], ...)
    """

    name: str
    rank: int
    alignment: Optional[int] = None
    pointee: Optional[str] = None
    mutable: bool = False
    batch: bool = False


@dataclasses.dataclass(frozen=True)
class Output:
    """An output tensor parameter, allocated by the loader.

    Args:
        name: output name.
        like: allocate with the shape and dtype of this input tensor.
        shape: one expression per dimension (``("a.shape[0]", "b.shape[1]")``), instead of ``like``.
        dtype: an input tensor's name or a torch dtype name (with ``shape``; default: the first input's).
        batch: return the output with the batched inputs' leading dims back (``(B*S, N)`` -> ``(B, S, N)``); its
            first dimension must be a batched input's first. Default: batched when ``like`` names a batched input.
        zero: the kernel accumulates into it (atomic adds from several programs): the loader allocates it filled
            with zeros (and zero-fills an ``out=`` tensor) before the launch. flyc-build refuses a kernel whose
            IR accumulates atomically into an output not declared ``zero=True``.
    """

    name: str
    like: Optional[str] = None
    shape: Optional[tuple[str, ...]] = None
    dtype: Optional[str] = None
    batch: Optional[bool] = None
    zero: bool = False


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A runtime scalar parameter (``int``, ``float`` or ``bool``), part of the op's schema."""

    name: str
    type: str = "float"
    default: Optional[float | int | bool] = None


@dataclasses.dataclass(frozen=True)
class Constexpr:
    """A compile-time parameter; each specialization gives its value in ``Spec.constexprs``."""

    name: str


@dataclasses.dataclass(frozen=True)
class Value:
    """An integer parameter computed from the inputs (``Value("n", "x.numel", type="i32")``); the expression
    may read ``device.cu_count``, and a literal (``Value("m", "64")``) is a constant an entry passes itself."""

    name: str
    expr: str
    type: str = "i32"


@dataclasses.dataclass(frozen=True)
class Workspace:
    """Device memory the op's launches share within one call (a split reduction's partial sums), allocated by
    the loader per call before the first launch, never part of the op's schema (docs/spec-api.md).

    Args:
        name: the name the launches' parameters use.
        shape: one expression per dimension over the inputs and the constexprs (``("x.shape[0]", "SPLIT")``).
        dtype: a torch dtype name.
        zero: fill it with zeros before the first launch (kernels that accumulate into it).
    """

    name: str
    shape: tuple[str, ...]
    dtype: str = "float32"
    zero: bool = False


Param = Tensor | Output | Scalar | Constexpr | Value | Workspace


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel of an op that launches several in order (``op(kernel=[Launch(...), Launch(...)])``, Triton).

    Args:
        kernel: the ``@triton.jit`` kernel.
        args: the kernel's parameters in order, each the name of a declaration in the op's ``args``
            (a :class:`Tensor`, :class:`Output`, :class:`Scalar`, :class:`Constexpr`, :class:`Value` or
            :class:`Workspace`).
        grid: up to three expressions over the inputs and constexprs.
    """

    kernel: Any
    args: tuple[str, ...]
    grid: tuple[str, ...]

    def __post_init__(self) -> None:
        for field in ("args", "grid"):
            value = getattr(self, field)
            if isinstance(value, str) or not all(isinstance(x, str) for x in value):
                raise SpecError(f"Launch({_kernel_name(self.kernel)!r}): {field} must be a "
                                f"list of strings, got {value!r}")
            object.__setattr__(self, field, tuple(value))


@dataclasses.dataclass(frozen=True)
class Entry:
    """A plain Python entry point around a DSL launcher (see :func:`entry`)."""

    fn: Callable[..., Any]
    frontend: str = "flydsl"

    @property
    def __name__(self) -> str:  # noqa: A003 - messages name the entry like a function
        return _kernel_name(self.fn)


def entry(fn: Callable[..., Any], frontend: str = "flydsl") -> Entry:
    """Name a plain Python function that the user calls, which calls a ``@flyc.jit`` launcher.

    FlyDSL builders often return such a wrapper: it sets compile hints (fast-math, LLVM options), substitutes
    placeholder arguments and marks layouts dynamic, then calls the inner launcher. flyc-build calls the
    entry as the user would, with the declared arguments positionally (``args`` are the entry's *leading*
    parameters, in order; every later parameter must have a default; a constant the entry passes a launcher
    itself is a ``Value("m", "64")``, not an entry parameter), records each launcher call it makes (several launchers in sequence: one code object per
    call), and proves each code object against FlyDSL's own from that same call. Naming the inner launcher
    instead would lose the wrapper's hints and build other code.
    """
    if not callable(fn):
        raise SpecError(f"entry: expected a callable, got {type(fn).__name__}")
    return Entry(fn, frontend)


@dataclasses.dataclass(frozen=True)
class Spec:
    """One specialization to build.

    Args:
        name: unique within the op (``"f32"``, ``"bf16_n4096"``).
        dtypes: input tensor -> torch dtype name.
        shapes: input tensor -> example shape, traced at build time (outputs follow their rules).
        scalars: scalar -> example value (default: the scalar's default).
        constexprs: constexpr -> value.
        constraints: boolean expressions the inputs must satisfy for this specialization (added to
            those the frontend derives from the lowering, such as static strides).
        options: frontend options (Triton: ``num_warps``, ``num_stages``; FlyDSL: its compile hints
            ``waves_per_eu``, ``fast_fp_math``, ``unsafe_fp_math``, ``llvm_options``).
        allow_scratch: accept kernels that spill to scratch (private segment) memory.
        cu_count: the device compute-unit count the kernel bakes in (a persistent grid or a split sized for
            the build machine, e.g. 304 for an MI300X). The specialization then runs only on devices with
            exactly that many (the guard ``device.cu_count == N`` is added, so a 304-CU kernel never runs
            silently on an 80-CU MI308X of the same target ID), and the example call evaluates
            ``device.cu_count`` at N. Without it the example uses the target's usual count
            (:func:`flyship.bundle.targets.example_cu_count`).
        targets: build this specialization only for these processors (``("gfx950",)``: a kernel that needs
            gfx950's 160 KiB of LDS); empty: for every ``--arch`` its frontend builds for.
        strides: input tensor -> example strides in elements (default: row-major contiguous). A FlyDSL
            kernel folds the unit-stride dim into its code, so a column-major example (``w.t()``: shape
            ``(N, K)``, strides ``(1, N)``) builds code, and a guard, for exactly that layout.
        per_target: target (a processor, ``"gfx942"``, or a full target ID) -> what differs there, as a dict
            of the fields above (``dtypes``, ``shapes``, ``scalars``, ``constexprs``, ``constraints``,
            ``options``, ``allow_scratch``, ``cu_count``, ``strides``): dict fields are merged key by key over
            the spec's own, ``constraints`` are added to the spec's, the others replace it. fp8 is
            ``float8_e4m3fnuz`` on gfx942 and ``float8_e4m3fn`` on gfx950::

                Spec("fp8", dtypes={"x": "float8_e4m3fnuz"}, shapes={"x": (256, 1024)},
                     per_target={"gfx950": dict(dtypes={"x": "float8_e4m3fn"})})

            Where the guards of the targets differ, the manifest holds one specialization per guard
            (``fp8__gfx942``, ``fp8__gfx950``), each with its own variants (docs/spec-api.md).
    """

    name: str
    dtypes: dict[str, str]
    shapes: dict[str, tuple[int, ...]]
    scalars: dict[str, Any] = dataclasses.field(default_factory=dict)
    constexprs: dict[str, Any] = dataclasses.field(default_factory=dict)
    constraints: tuple[str, ...] = ()
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    allow_scratch: bool = False
    cu_count: Optional[int] = None
    targets: tuple[str, ...] = ()
    strides: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    per_target: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # ("x.shape[1] <= 8192") without the trailing comma is a string, not a tuple: say so.
        if isinstance(self.constraints, str):
            raise SpecError(f"Spec {self.name!r}: constraints must be a tuple of expressions, got the string "
                            f"{self.constraints!r}; write constraints=({self.constraints!r},) (note the comma)")
        for field in ("dtypes", "shapes", "scalars", "constexprs", "options", "strides"):
            if not isinstance(getattr(self, field), dict):
                raise SpecError(f"Spec {self.name!r}: {field} must be a dict, got {type(getattr(self, field)).__name__}")
        if isinstance(self.targets, str):
            raise SpecError(f"Spec {self.name!r}: targets must be a tuple of processors, got the string "
                            f"{self.targets!r}; write targets=({self.targets!r},) (note the comma)")
        for t in self.targets:
            try:
                _targets.check_known(t)
            except Exception as e:
                raise SpecError(f"Spec {self.name!r}: targets: {e}") from None
        if self.cu_count is not None:
            if isinstance(self.cu_count, bool) or not isinstance(self.cu_count, int) or self.cu_count < 1:
                raise SpecError(f"Spec {self.name!r}: cu_count must be a positive int (the device's compute units "
                                f"the kernel bakes in), got {self.cu_count!r}")
            guard = f"device.cu_count == {self.cu_count}"
            if guard not in self.constraints:  # the baked-in value becomes a guard on the device
                object.__setattr__(self, "constraints", (*tuple(self.constraints), guard))
        self._check_per_target()

    def _check_per_target(self) -> None:
        if not isinstance(self.per_target, dict):
            raise SpecError(f"Spec {self.name!r}: per_target must be a dict of target -> dict(...), got "
                            f"{type(self.per_target).__name__}")
        for key, over in self.per_target.items():
            where = f"Spec {self.name!r}: per_target[{key!r}]"
            try:
                tid = _targets.check_known(key)
            except Exception as e:
                raise SpecError(f"{where}: {e}") from None
            if not isinstance(over, dict):
                raise SpecError(f"{where}: expected a dict of Spec fields (dict(dtypes=...)), got "
                                f"{type(over).__name__}")
            bad = sorted(set(over) - set(PER_TARGET_FIELDS))
            if bad:
                raise SpecError(f"{where}: {bad} cannot vary per target; it takes {', '.join(PER_TARGET_FIELDS)}")
            if "cu_count" in over and self.cu_count is not None:
                raise SpecError(f"{where}: cu_count is given for the whole spec ({self.cu_count}) and per target; "
                                "give it in one place")
            if self.targets and not admits(self.targets, tid):
                raise SpecError(f"{where}: the spec is limited to targets={self.targets}, which never includes "
                                f"{key}; add it to targets= or remove the entry (it would never be built)")

    def for_target(self, target: str) -> "Spec":
        """This spec as built for ``target``: its ``per_target`` entry for the full target ID, else for the
        processor, merged over the spec's own fields (dicts key by key, constraints added); the spec itself
        when no entry applies."""
        over = self.override_for(target)
        if over is None:
            return self
        fields: dict[str, Any] = {}
        for k, v in over.items():
            base = getattr(self, k)
            if isinstance(base, dict):
                fields[k] = {**base, **v}
            elif k == "constraints":
                if isinstance(v, str):
                    raise SpecError(f"Spec {self.name!r}: per_target constraints must be a tuple of expressions, got "
                                    f"the string {v!r}; write ({v!r},)")
                fields[k] = (*self.constraints, *tuple(v))
            else:
                fields[k] = v
        return dataclasses.replace(self, per_target={}, **fields)

    def override_for(self, target: str) -> Optional[dict[str, Any]]:
        """The ``per_target`` entry that applies to ``target`` (its full ID first, then its processor)."""
        if target in self.per_target:
            return self.per_target[target]
        return self.per_target.get(target.split(":")[0])

    def resolved(self) -> list[tuple[Optional[str], "Spec"]]:
        """``(None, the spec for targets no entry names)`` when such targets can exist, then
        ``(key, the spec for that per_target key)`` for each entry: every form the spec can be built in."""
        out: list[tuple[Optional[str], Spec]] = []
        keys = list(self.per_target)
        base_used = not self.targets or any(
            not any(admits((k,), _targets.parse_target(t)) for k in keys) for t in self.targets)
        if base_used:
            out.append((None, self))
        return out + [(k, self.for_target(k)) for k in keys]


# The Spec fields a per_target entry may give.
PER_TARGET_FIELDS = ("dtypes", "shapes", "scalars", "constexprs", "constraints", "options", "allow_scratch",
                     "cu_count", "strides")


def admits(limited_to: tuple[str, ...], t: _targets.TargetID) -> bool:
    """Whether a spec limited to ``limited_to`` (processors, or full target IDs; empty: all) builds for ``t``."""
    if not limited_to:
        return True
    wants = [_targets.parse_target(w) for w in limited_to]
    return any(w.processor == t.processor and (w.text == w.processor or w.text == t.text) for w in wants)


@dataclasses.dataclass(frozen=True)
class OpDecl:
    """An op as declared in a spec file (see :func:`op`)."""

    name: str
    kernel: Any
    args: tuple[Param, ...]
    specs: tuple[Spec, ...]
    reference: Optional[str]
    doc: str
    grid: Optional[tuple[str, ...]]
    frontend: str
    backward: Optional[Backward] = None
    tuning: Any = None  # flyship.compiler.tuning.ConfigSpace when declared with configs= (docs/tuning.md)

    @property
    def key(self) -> tuple[str, ...]:
        """The tuning key's expressions (empty without a config space)."""
        return self.tuning.key if self.tuning is not None else ()

    @property
    def inputs(self) -> list[Tensor | Scalar]:
        return [a for a in self.args if isinstance(a, (Tensor, Scalar))]

    @property
    def outputs(self) -> list[Output]:
        return [a for a in self.args if isinstance(a, Output)]

    @property
    def launches(self) -> tuple[Launch, ...]:
        """The kernels of a multi-launch op (``kernel=[Launch(...), ...]``), in order; empty otherwise."""
        return tuple(self.kernel) if isinstance(self.kernel, (list, tuple)) else ()

    @property
    def workspaces(self) -> list[Workspace]:
        return [a for a in self.args if isinstance(a, Workspace)]

    def workspace_shape(self, w: Workspace, spec: Spec) -> tuple[str, ...]:
        """A workspace's shape rule with the spec's int constexprs written in (the manifest's expressions
        read only the inputs)."""
        values = {c.name: spec.constexprs[c.name] for c in self.args
                  if isinstance(c, Constexpr) and isinstance(spec.constexprs.get(c.name), int)}
        return tuple(_expr.canonical(_expr.substitute(e, values) if values else e) for e in w.shape)

    def launch_view(self, launch: Launch) -> "OpDecl":
        """The declaration one :class:`Launch` of a multi-launch op compiles as: its kernel, its grid, and its
        parameters in the kernel's order (a workspace stays a :class:`Workspace`)."""
        by_name = {a.name: a for a in self.args}
        return dataclasses.replace(self, kernel=launch.kernel, args=tuple(by_name[n] for n in launch.args),
                                   grid=launch.grid)

    def call_view(self, args: Sequence[Param]) -> "OpDecl":
        """The declaration one launcher call of an entry compiles as: ``args`` (some of the op's parameters) in
        the launcher's order, each output's shape and dtype rule written out (the input it follows may be
        passed to another of the entry's launchers, not this one)."""
        def resolved(a: Param) -> Param:
            if not isinstance(a, Output):
                return a
            return Output(a.name, shape=self.output_shape(a), dtype=self.output_dtype(a), batch=self.output_batch(a))

        return dataclasses.replace(self, args=tuple(resolved(a) for a in args))

    def expression_slots(self) -> dict[str, _expr.Slot]:
        """What grid and :class:`Value` expressions may name: argument name -> expression slot, the inputs then
        the outputs, numbered like ``flyship.bundle.manifest.slots`` (int constexprs are written in first)."""
        out: dict[str, _expr.Slot] = {}
        inputs = self.inputs
        for i, a in enumerate(inputs):
            out[a.name] = _expr.Slot(i, "tensor", a.rank) if isinstance(a, Tensor) else _expr.Slot(i, a.type)
        for j, o in enumerate(self.outputs):
            out[o.name] = _expr.Slot(len(inputs) + j, "tensor", len(self.output_shape(o)))
        return out

    def tensor(self, name: str) -> Tensor:
        for a in self.args:
            if isinstance(a, Tensor) and a.name == name:
                return a
        raise SpecError(f"op {self.name}: no input tensor {name!r}")

    def output_shape(self, o: Output) -> tuple[str, ...]:
        if o.like:
            return tuple(f"{o.like}.shape[{i}]" for i in range(self.tensor(o.like).rank))
        return tuple(_expr.canonical(e) for e in (o.shape or ()))

    def output_batch(self, o: Output) -> bool:
        """Whether output ``o`` gets the leading batch dims back: as declared, else as its ``like`` input."""
        if o.batch is not None:
            return bool(o.batch)
        return bool(o.like) and self.tensor(o.like).batch

    def output_dtype(self, o: Output) -> str:
        if o.like:
            return o.like
        if o.dtype:
            return o.dtype
        return next(a.name for a in self.args if isinstance(a, Tensor))

    def output_dtype_for(self, o: Output, spec: Spec) -> str:
        d = self.output_dtype(o)
        return spec.dtypes[d] if d in spec.dtypes else d

    def example_shapes(self, spec: Spec) -> dict[str, tuple[int, ...]]:
        """Input shapes from the spec plus output shapes from their rules."""
        shapes = {k: tuple(v) for k, v in spec.shapes.items()}
        scal = self.example_scalars(spec)
        for o in self.outputs:
            shapes[o.name] = tuple(
                _expr.evaluate_with_shapes(e, shapes, {k: v for k, v in scal.items() if isinstance(v, int)})
                for e in self.output_shape(o)
            )
        return shapes

    def constraints(self, spec: Spec) -> tuple[str, ...]:
        """The spec's guard constraints with its constexpr values written in (a constraint may name a
        constexpr, ``"x.shape[1] <= MAX_N"``; the guard is checked where constexprs no longer exist)."""
        values = {c.name: spec.constexprs[c.name] for c in self.args
                  if isinstance(c, Constexpr) and isinstance(spec.constexprs.get(c.name), int)}
        return tuple(_expr.substitute(c, values) if values else c for c in spec.constraints)

    def example_strides(self, spec: Spec) -> dict[str, tuple[int, ...]]:
        """Strides of every example tensor: the spec's for inputs that give them, else row-major contiguous."""
        shapes = self.example_shapes(spec)
        return {k: tuple(spec.strides[k]) if k in spec.strides else _expr.contiguous_strides(v)
                for k, v in shapes.items()}

    def example_values(self, spec: Spec, device: Optional[dict[str, int]] = None) -> dict[str, int]:
        """Each :class:`Value` parameter evaluated at the example call.

        Args:
            device: the example call's device properties, for a Value that reads ``device.cu_count`` (a
                persistent launcher's CTA count); default: the spec's ``cu_count`` when it gives one. A frontend
                passes :func:`flyship.compiler.frontends.base.example_device` (the target's usual count when the
                spec gives none).
        """
        if device is None and spec.cu_count is not None:
            device = {"cu_count": spec.cu_count}
        shapes = self.example_shapes(spec)
        scal = {k: v for k, v in self.example_scalars(spec).items() if isinstance(v, int) and not isinstance(v, bool)}
        return {a.name: _expr.evaluate_with_shapes(a.expr, shapes, scal, self.example_strides(spec), device)
                for a in self.args if isinstance(a, Value)}

    def example_scalars(self, spec: Spec) -> dict[str, Any]:
        out = {}
        for a in self.args:
            if isinstance(a, Scalar):
                out[a.name] = spec.scalars.get(a.name, a.default)
        return out


@dataclasses.dataclass
class SpecFile:
    """What a spec file declared: the namespace, the references module and the ops."""

    path: str
    namespace: str = ""
    references: Optional[str] = None
    ops: list[OpDecl] = dataclasses.field(default_factory=list)


_CURRENT: Optional[SpecFile] = None


def _current() -> SpecFile:
    if _CURRENT is None:
        raise SpecError("spec API: namespace()/references()/op() must be called while flyc-build loads a spec file")
    return _CURRENT


def namespace(name: str) -> None:
    """Set the torch op namespace of the bundle (a Python identifier)."""
    try:  # the rule book's rule: an ASCII identifier, not one of torch's own namespaces
        _rules.check_namespace(name, "namespace")
    except BundleError as e:
        raise SpecError(str(e)) from None
    _current().namespace = name


def references(path: str) -> None:
    """Name the module (relative to the spec file) holding the PyTorch references; it must import only
    torch and the standard library, since it is copied into the bundle and run without FlyDSL."""
    _current().references = path


def _detect_frontend(kernel: Any) -> str:
    from flyship.compiler import frontends

    if isinstance(kernel, (list, tuple)):  # several launches: one frontend for all
        if not kernel or not all(isinstance(k, Launch) for k in kernel):
            raise SpecError(f"op kernel: a list of kernels must hold Launch(kernel, args=[...], grid=(...)) "
                            f"entries, got {[type(k).__name__ for k in kernel]}")
        names = {_detect_frontend(k.kernel) for k in kernel}
        if len(names) != 1:
            raise SpecError(f"op kernel: every Launch of one op must use one frontend, got {sorted(names)}")
        return names.pop()
    fe = frontends.detect(kernel)
    if fe is None:
        titles = " or a ".join(frontends.get(n).title for n in frontends.names())
        raise SpecError(f"op kernel: expected a {titles}, got {type(kernel).__module__}.{type(kernel).__name__}")
    return fe.name


def op(name: str, *, kernel: Any, args: Sequence[Param], specs: Sequence[Spec], reference: Optional[str] = None,
       doc: str = "", grid: Optional[Sequence[str]] = None, backward: Optional[Backward] = None,
       configs: Optional[Sequence[Any]] = None, key: Optional[Sequence[str]] = None,
       prune: Optional[Callable[..., Any]] = None) -> OpDecl:
    """Declare an op.

    Args:
        name: op name (identifier); ``torch.ops.<namespace>.<name>``.
        kernel: a FlyDSL ``@flyc.jit`` launcher or a ``@triton.jit`` kernel.
        args: the kernel's parameters in order (:class:`Tensor`, :class:`Output`, :class:`Scalar`,
            :class:`Constexpr`, :class:`Value`).
        specs: specializations to build, tried in this order at run time.
        reference: name of the reference function in the references module.
        doc: one-line description.
        grid: Triton only: up to three expressions for the launch grid.
        backward: the op's derivative as another op of the spec file, e.g.
            ``Backward("rmsnorm_bwd", inputs={"dy": "grad:out", "x": "x", "w": "w"}, grads={"x": "dx", "w": "dw"})``:
            each backward input comes from a forward input or output (saved for backward) or from
            ``"grad:<output>"``; ``grads`` maps forward inputs to the backward op's outputs. The loader
            registers it with torch autograd (checked against the bundle when the manifest is written).
        configs: a config space (:class:`flyship.compiler.tuning.Config` objects, or the DSL's own
            ``flydsl.Config`` / ``triton.Config``, converted): each spec x each config
            becomes a specialization ``<spec>__<config>``. Implied when ``kernel`` is ``flydsl.autotune`` /
            ``triton.autotune``'d (its configs, key and prune function are read). See docs/tuning.md.
        key: expressions over the inputs naming every tiled dimension (required with a config space unless
            the autotuned kernel names one); ``flyship tune`` keys its table by their values.
        prune: ``prune(configs, named_args) -> configs``, called per target before compiling
            (``named_args`` holds the example call and the target's limits).

    Raises:
        SpecError: naming the op and what is inconsistent.
    """
    from flyship.compiler import tuning as _tuning

    space = None
    tuned = _tuning.from_autotuner(kernel)
    if tuned is not None:
        kernel, pairs, names, auto_prune = tuned
        if configs is None and pairs is None:
            raise SpecError(f"op {name}: autotuned kernel {_tuning.kernel_name(kernel)}: expected a list of configs, "
                            "got a function of the call's arguments; flyship builds ahead of time, so give the "
                            "configs to build: op(..., configs=[Config(...), ...])")
        if configs is None:
            configs = pairs
        key = key if key is not None else (_tuning.key_from_names(names, args) if names else None)
        prune = prune or auto_prune
    if configs is not None:
        pairs = [c if isinstance(c, tuple) else (c, c) if isinstance(c, _tuning.Config)
                 else (_tuning.from_native_config(c), c) for c in configs]
        if not pairs or not all(isinstance(c, _tuning.Config) for c, _ in pairs):
            raise SpecError(f"op {name}: configs= expects a non-empty list of flyship.compiler.tuning.Config (or the "
                            f"DSL's own flydsl.Config / triton.Config, converted), got "
                            f"{[type(n).__name__ for _, n in pairs][:3]}; e.g. configs=[Config(BLOCK=256, "
                            "waves_per_eu=2)]")
        if not key:
            raise SpecError(f"op {name}: a config space needs key=(...): expressions naming every tiled dimension, "
                            "e.g. key=('a.shape[0]', 'b.shape[1]')")
        try:
            key = tuple(_expr.canonical(k) for k in key)
        except _expr.ExprError as e:
            raise SpecError(f"op {name}: key expression: {e}; a key is an integer expression over the inputs") \
                from None
        specs, table = _tuning.expand(name, _detect_frontend(kernel), args, specs, pairs)
        space = _tuning.ConfigSpace(key=key, configs=table, prune=prune)
    elif key or prune:
        raise SpecError(f"op {name}: key= and prune= go with configs= (a config space); add configs=[Config(...)]")
    frontend = _detect_frontend(kernel)
    first = kernel[0].kernel if isinstance(kernel, (list, tuple)) and kernel else kernel
    kernel = list(kernel) if isinstance(kernel, tuple) else kernel
    decl = OpDecl(name=name, kernel=kernel, args=tuple(args), specs=tuple(specs), reference=reference,
                  doc=doc or (getattr(getattr(first, "fn", first), "__doc__", "") or "").strip().split("\n")[0],
                  grid=tuple(grid) if grid else None, frontend=frontend, backward=_backward(name, backward),
                  tuning=space)
    validate(decl)
    sf = _current()
    if any(o.name == name for o in sf.ops):
        raise SpecError(f"op {name}: declared twice in spec file {sf.path}; expected one op(...) per name (each is "
                        f"torch.ops.{sf.namespace or '<namespace>'}.{name}); rename one, or give the one op several "
                        "specs=[...]")
    sf.ops.append(decl)
    return decl


def _backward(name: str, b: Optional[Backward]) -> Optional[Backward]:
    """The declared backward with plain dicts (checked against the other ops when the manifest is built)."""
    if b is None:
        return None
    if not isinstance(b, Backward) or not isinstance(b.inputs, dict) or not isinstance(b.grads, dict):
        raise SpecError(f"op {name}: backward must be Backward(op, inputs={{...}}, grads={{...}}), got {b!r}")
    return Backward(op=b.op, inputs=dict(sorted(b.inputs.items())), grads=dict(sorted(b.grads.items())))


def validate(d: OpDecl) -> None:
    """Check an op declaration; raises :class:`SpecError` naming the op and the problem."""
    w = f"op {d.name}"
    if not d.name.isidentifier():
        raise SpecError(f"{w}: name must be a Python identifier")
    names = [a.name for a in d.args]
    if len(set(names)) != len(names):
        raise SpecError(f"{w}: parameter names repeat: {names}")
    if not d.outputs and not any(isinstance(a, Tensor) and a.mutable for a in d.args):
        raise SpecError(f"{w}: declares no Output and no Tensor(..., mutable=True); an op must produce a tensor or "
                        "write one of its inputs in place")
    written = [a.name for a in d.args if isinstance(a, Tensor) and a.mutable]
    if written and d.backward is not None:
        raise SpecError(f"{w}: writes {', '.join(written)} in place and declares a backward; an op that writes an "
                        "input cannot declare a backward (declare the result as an Output to train through it)")
    for a in d.args:
        if isinstance(a, Tensor) and not isinstance(a.mutable, bool):
            raise SpecError(f"{w}: tensor {a.name}: mutable must be True or False, got {a.mutable!r}")
    tensors = {a.name for a in d.args if isinstance(a, Tensor)}
    for a in d.args:
        if isinstance(a, Tensor) and a.pointee is not None and a.pointee not in DTYPES:
            raise SpecError(f"{w}: tensor {a.name}: pointee {a.pointee!r} is not a dtype; known: {', '.join(DTYPES)}")
        if isinstance(a, Scalar) and a.type not in SCALAR_TYPES:
            raise SpecError(f"{w}: scalar {a.name} type {a.type!r}; expected one of {SCALAR_TYPES}")
        if isinstance(a, Scalar) and a.default is not None:
            _check_scalar_value(a, a.default, f"{w}: Scalar({a.name!r}, {a.type!r}, default={a.default!r})")
        if isinstance(a, Output):
            if bool(a.like) == bool(a.shape):
                raise SpecError(f"{w}: output {a.name}: give exactly one of like= or shape=")
            if a.like and a.like not in tensors:
                raise SpecError(f"{w}: output {a.name}: like={a.like!r} names no input tensor ({sorted(tensors)})")
            if a.dtype and a.dtype not in tensors and a.dtype not in DTYPES:
                raise SpecError(f"{w}: output {a.name}: dtype {a.dtype!r} is neither an input tensor nor a dtype")
    _validate_workspaces(d, w)
    _check_batch(d, w)
    from flyship.compiler import frontends

    fe = frontends.get(d.frontend)
    if d.launches:
        _validate_launches(d, w, fe)
    elif fe.declares_grid and not d.grid:
        raise SpecError(f"{w}: a {fe.title} needs grid=(...) expressions, e.g. grid=('cdiv(x.numel, BLOCK)',)")
    if not fe.declares_grid and d.grid:
        raise SpecError(f"{w}: a {fe.title} computes its own grid; remove grid=")
    if not d.specs:
        raise SpecError(f"{w}: no specializations (specs=[Spec(...)])")
    # Names constraints may use: every tensor (inputs and outputs, with their ranks) and the scalars; int
    # constexprs are written in first (the guard is checked where constexprs no longer exist).
    slots = d.expression_slots()
    seen = set()
    for spec in d.specs:
        if spec.name in seen or not spec.name.replace("_", "a").isalnum():
            raise SpecError(f"{w}: specialization name {spec.name!r} repeats or is not alphanumeric/underscore")
        seen.add(spec.name)
        for key, s in spec.resolved():
            try:
                _validate_spec(d, s, w if key is None else f"{w} (per_target {key})", slots, tensors)
            except SpecError as e:
                if key is None and spec.per_target and not spec.targets:
                    raise SpecError(f"{e} [the spec's own fields apply to every --arch its per_target does not name; "
                                    f"complete them, or write targets={tuple(spec.per_target)!r} to build it only "
                                    "there]") from None
                raise
    _validate_launch_expressions(d, w)
    inputs_only = {k: v for k, v in slots.items() if k in {a.name for a in d.inputs}}
    for k in d.key:
        try:
            _expr.compile_program(k, inputs_only)
        except _expr.ExprError as e:
            raise SpecError(f"{w}: key expression {k!r}: {e}; a key is an integer expression over the inputs") \
                from None


def _validate_spec(d: OpDecl, s: Spec, w: str, slots: dict, tensors: set[str]) -> None:
    """One form of a specialization (the spec itself, or as a per_target entry makes it) against the op."""
    for key in ("dtypes", "shapes"):
        unknown = sorted(set(getattr(s, key)) - tensors)
        if unknown:
            raise SpecError(f"{w} spec {s.name}: {key} key {unknown[0]!r} names no input tensor; the op's input "
                            f"tensors are {', '.join(sorted(tensors))} (outputs take their dtype and shape from "
                            "Output(like=/shape=/dtype=))")
    for t in tensors:
        if t not in s.dtypes or s.dtypes[t] not in DTYPES:
            raise SpecError(f"{w} spec {s.name}: dtype of {t!r} missing or unknown ({s.dtypes.get(t)!r}); "
                            f"known dtypes: {', '.join(DTYPES)}")
        if t not in s.shapes or len(s.shapes[t]) != d.tensor(t).rank:
            raise SpecError(f"{w} spec {s.name}: example shape of {t!r} missing or not of rank "
                            f"{d.tensor(t).rank} (got {s.shapes.get(t)!r})")
    for t, st in s.strides.items():
        if t not in tensors or len(st) != d.tensor(t).rank or not all(isinstance(x, int) and x >= 0 for x in st):
            rank = d.tensor(t).rank if t in tensors else "N"
            raise SpecError(f"{w} spec {s.name}: strides of {t!r}: expected {rank} non-negative element strides "
                            f"of an input tensor ({sorted(tensors)}), got {st!r}")
    scalars = {a.name: a for a in d.args if isinstance(a, Scalar)}
    for k, v in s.scalars.items():
        if k not in scalars:
            raise SpecError(f"{w} spec {s.name}: scalars key {k!r} names no Scalar of the op; its scalars are "
                            f"{', '.join(scalars) or 'none'}")
        _check_scalar_value(scalars[k], v, f"{w} spec {s.name}: scalars[{k!r}]")
    for c in d.args:
        if isinstance(c, Constexpr) and c.name not in s.constexprs:
            raise SpecError(f"{w} spec {s.name}: constexpr {c.name} has no value in constexprs=")
    for c, written in zip(s.constraints, _constraints_or_refuse(d, s, w)):
        try:
            _expr.compile_program(written, slots)
        except _expr.ExprError as e:
            consts = [a.name for a in d.args if isinstance(a, Constexpr)]
            values = [f"{a.name} is {a.expr!r}" for a in d.args if isinstance(a, Value) and a.name in str(e)]
            raise SpecError(f"{w} spec {s.name}: constraint {c!r}: {e}" + (
                f"; besides the op's inputs and outputs it may name the int constexprs ({', '.join(consts)})"
                if consts else "") + (f"; a guard cannot read a Value, write its expression ({'; '.join(values)})"
                                      if values else "")) from None
    _check_example_meets_constraints(d, s, w)
    _check_workspaces_not_empty(d, s, w)


def _check_workspaces_not_empty(d: OpDecl, s: Spec, w: str) -> None:
    """A workspace must have at least one element at the spec's example: the loader refuses to launch with an
    empty workspace, so a zero-size one would build and then send every call to the fallback."""
    if not d.workspaces:
        return
    shapes = d.example_shapes(s)
    scal = {k: v for k, v in d.example_scalars(s).items() if isinstance(v, int) and not isinstance(v, bool)}
    scal.update({c.name: s.constexprs[c.name] for c in d.args
                 if isinstance(c, Constexpr) and isinstance(s.constexprs.get(c.name), int)
                 and not isinstance(s.constexprs.get(c.name), bool)})
    for ws in d.workspaces:
        try:
            dims = [_expr.evaluate_with_shapes(e, shapes, scal, d.example_strides(s)) for e in ws.shape]
        except _expr.ExprError:
            continue  # names a value the example does not give: checked when the kernel is built
        if any(n <= 0 for n in dims):
            raise SpecError(f"{w} spec {s.name}: workspace {ws.name}: expected at least one element at the example, "
                            f"got shape {dims} from {tuple(ws.shape)!r}; the loader cannot launch with an empty "
                            "workspace (every call would fall back): for a dummy buffer declare shape=(\"1\",)")


def _check_scalar_value(a: Scalar, value: Any, where: str) -> None:
    """A scalar's default or example value fits its type (the rule book's rule, checked when the spec is read:
    a str default would otherwise reach the reference, or the kernel, at the first call)."""
    try:
        _rules.check_scalar_value(a.type, value, where)
    except BundleError as e:
        fits = {"int": "an int (a float is never truncated to one)", "float": "a number", "bool": "True or False"}[a.type]
        raise SpecError(f"{e} ({type(value).__name__}); give {fits}, or declare the scalar's type to match "
                        f"(Scalar({a.name!r}, 'int' | 'float' | 'bool'))") from None


def _constraints_or_refuse(d: OpDecl, s: Spec, w: str) -> tuple[str, ...]:
    try:
        return d.constraints(s)
    except _expr.ExprError as e:
        raise SpecError(f"{w} spec {s.name}: {e}") from None


def _validate_launch_expressions(d: OpDecl, w: str) -> None:
    """Grid and :class:`Value` expressions read the op's inputs and outputs, with each specialization's int
    constexprs written in: compiled here for every form of every spec, so a typo is reported when the spec file
    is read (naming the op and the expression), not when a worker traces the kernel."""
    io = d.expression_slots()
    grids = [(f"Launch {k + 1} grid expression", launch.grid) for k, launch in enumerate(d.launches)]
    grids = grids or [("grid expression", d.grid or ())]
    values = [(f"Value {a.name} expression", (a.expr,)) for a in d.args if isinstance(a, Value)]
    checked: set[tuple[str, str]] = set()
    for spec in d.specs:
        for _key, s in spec.resolved():
            ints = {k: v for k, v in s.constexprs.items() if isinstance(v, int) and not isinstance(v, bool)}
            for what, texts in (*grids, *values):
                for text in texts:
                    try:
                        written = _expr.substitute(text, ints) if ints else text
                        if (what, written) in checked:
                            continue
                        _expr.compile_program(written, io)
                    except _expr.ExprError as e:
                        consts = sorted(a.name for a in d.args if isinstance(a, Constexpr))
                        raise SpecError(f"{w}: {what} {text!r} (spec {s.name}): {e}" + (
                            f"; besides the op's inputs and outputs it may name the int constexprs ({', '.join(consts)})"
                            if consts else "")) from None
                    checked.add((what, written))


def _validate_workspaces(d: OpDecl, w: str) -> None:
    """Workspaces: a known dtype, a shape over the inputs and constexprs, used by some launch."""
    inputs = {a.name: _expr.Slot(i, "tensor", a.rank) if isinstance(a, Tensor) else _expr.Slot(i, "int")
              for i, a in enumerate(d.inputs)}
    consts = {a.name: _expr.Slot(len(inputs) + i, "int") for i, a in enumerate(d.args) if isinstance(a, Constexpr)}
    for ws in d.workspaces:
        if ws.dtype not in DTYPES:
            raise SpecError(f"{w}: workspace {ws.name}: dtype {ws.dtype!r}; expected one of {', '.join(DTYPES)}")
        if isinstance(ws.shape, str) or not ws.shape:
            raise SpecError(f"{w}: workspace {ws.name}: shape must be a tuple of expressions, got {ws.shape!r}")
        for e in ws.shape:
            try:
                _expr.compile_program(e, {**inputs, **consts})
            except _expr.ExprError as err:
                raise SpecError(f"{w}: workspace {ws.name}: shape {e!r}: {err}; a workspace's shape reads the "
                                "inputs and the constexprs") from None
    if d.workspaces and not d.launches and d.frontend != "flydsl":
        raise SpecError(f"{w}: Workspace parameters need a launcher that launches several kernels: a FlyDSL "
                        "launcher, or kernel=[Launch(...), ...]")


def _validate_launches(d: OpDecl, w: str, fe: Any) -> None:
    """kernel=[Launch(...), ...]: a frontend that takes declared grids, every parameter name declared, every
    declaration used by some launch."""
    if not fe.declares_grid:
        raise SpecError(f"{w}: kernel=[Launch(...)] lists kernels with declared grids (Triton); a {fe.title} "
                        "launches its kernels itself: name it as kernel=")
    if d.grid:
        raise SpecError(f"{w}: with kernel=[Launch(...)], each Launch declares its grid; remove the op's grid=")
    from flyship.bundle import limits as _limits

    if len(d.launches) > _limits.MAX_LAUNCHES:
        raise SpecError(f"{w}: {len(d.launches)} launches; at most {_limits.MAX_LAUNCHES}")
    declared = {a.name for a in d.args}
    used: set[str] = set()
    for k, launch in enumerate(d.launches):
        unknown = [n for n in launch.args if n not in declared]
        if unknown:
            raise SpecError(f"{w}: Launch {k + 1} ({_kernel_name(launch.kernel)}) names {unknown}, which "
                            f"the op's args do not declare ({sorted(declared)})")
        if not 1 <= len(launch.grid) <= 3:
            raise SpecError(f"{w}: Launch {k + 1}: grid must have 1 to 3 expressions, got {list(launch.grid)}")
        used |= set(launch.args)
    unused = [a.name for a in d.args if a.name not in used and not isinstance(a, Constexpr)]
    if unused:
        raise SpecError(f"{w}: {unused} are passed to no Launch; every declared tensor, output, scalar, Value and "
                        "Workspace must be some kernel's parameter")


def _check_batch(d: OpDecl, w: str) -> None:
    """The rule book's batch rules (:func:`flyship.bundle.rules.check_batch`), as a SpecError before compiling."""
    from flyship.bundle import manifest as _m

    args = [_m.Arg(name=a.name, kind="tensor" if isinstance(a, Tensor) else a.type, rank=getattr(a, "rank", 0),
                   batch=bool(getattr(a, "batch", False))) for a in d.inputs]
    try:
        outputs = [_m.Output(name=o.name, shape=d.output_shape(o), dtype="float32", batch=d.output_batch(o))
                   for o in d.outputs]
        _rules.check_batch(args, outputs, w)
    except BundleError as e:
        raise SpecError(str(e)) from None


def _check_example_meets_constraints(d: OpDecl, s: Spec, w: str) -> None:
    """The spec's own example must pass the spec's own constraints, or the specialization is built for a call it
    would never take (checked here, before compiling; the build checks the derived guard again afterwards)."""
    try:
        shapes = d.example_shapes(s)
        constraints = d.constraints(s)
    except _expr.ExprError as e:
        raise SpecError(f"{w} spec {s.name}: {e}") from None
    scal = {k: v for k, v in d.example_scalars(s).items() if isinstance(v, int) and not isinstance(v, bool)}
    strides = d.example_strides(s)
    for c in constraints:
        try:
            ok = _expr.evaluate_with_shapes(c, shapes, scal, strides)
        except _expr.ExprError:
            continue  # names a scalar with no example value: the build's own check reports it
        if not ok:
            raise SpecError(f"{w} spec {s.name}: expected the example shapes {dict(s.shapes)} to satisfy the spec's "
                            f"constraint {c!r}, got a violation; fix the example shapes or the constraint (the "
                            "specialization would never run its own example)")


def run_spec_file(path: str, run: Callable[[], None]) -> SpecFile:
    """Run ``run`` (which executes the spec file) collecting its declarations."""
    global _CURRENT
    prev, _CURRENT = _CURRENT, SpecFile(path=path)
    try:
        run()
        sf = _CURRENT
    finally:
        _CURRENT = prev
    if not sf.namespace:
        raise SpecError(f"spec file {path}: call namespace('<name>') to name the torch op namespace")
    if not sf.ops:
        raise SpecError(f"spec file {path}: declares no ops; call op(...)")
    return sf
