"""An op as a spec file declares it, and what the compile stage derives from it (slots, shapes, examples)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from flyship.bundle import expr as _expr
from flyship.bundle.model import Backward
from flyship.compiler.spec.params import Constexpr, Launch, Output, Param, Scalar, Tensor, Value, Workspace
from flyship.compiler.spec.specialization import Spec
from flyship.errors import SpecError


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
    launch_options: Any = None  # in a launch_view: that Launch's own options, over the spec's (Launch.options)
    mutable_written: bool = False  # op(..., mutable=True): every input tensor the kernel writes is mutable

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
                                   grid=launch.grid, launch_options=dict(launch.options) or None)

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
        # An explicit dtype wins over like= (Output("y", like="x", dtype="float32"): x's shape, float32); before
        # round 4 like= silently took x's dtype too.
        if o.dtype:
            return o.dtype
        if o.like:
            return o.like
        return next(a.name for a in self.args if isinstance(a, Tensor))

    def for_target(self, target: str) -> "OpDecl":
        """The declaration as built for ``target``: each output's ``per_target`` dtype, where one applies, as its
        ``dtype`` (the kernel is traced, checked and lowered with it)."""
        if not any(o.per_target for o in self.outputs):
            return self
        return dataclasses.replace(self, args=tuple(a.for_target(target) if isinstance(a, Output) else a
                                                    for a in self.args))

    def output_target_dtypes(self, o: Output, targets: Optional[Sequence[str]] = None) -> dict[str, str]:
        """The manifest's ``target_dtypes`` of output ``o``: its ``per_target`` entries, only those some of
        ``targets`` (the built variants' targets; None: all entries) takes, as :meth:`Output.for_target` picks."""
        pt = dict(o.per_target)
        if targets is None:
            return pt
        used = {t if t in pt else t.split(":")[0] for t in targets}
        return {k: v for k, v in pt.items() if k in used}

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
        return {a.name: a.float_literal() if a.float_literal() is not None else
                _expr.evaluate_with_shapes(a.expr, shapes, scal, self.example_strides(spec), device)
                for a in self.args if isinstance(a, Value)}

    def example_scalars(self, spec: Spec) -> dict[str, Any]:
        out = {}
        for a in self.args:
            if isinstance(a, Scalar):
                out[a.name] = spec.scalars.get(a.name, a.default)
        return out
