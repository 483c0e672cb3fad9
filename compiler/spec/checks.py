"""The checks of an op declaration, run when the spec file is read (before anything compiles): the rules of the
manifest through the rule book (:mod:`flyship.bundle.rules`), and what only a declaration has (constexprs, Values,
example shapes, launches)."""

from __future__ import annotations

import dataclasses

from typing import Any, Callable

from flyship.bundle import expr as _expr
from flyship.bundle import model as _m
from flyship.bundle import rules as _rules
from flyship.bundle.errors import BundleError
from flyship.bundle.model import DTYPES, SCALAR_TYPES
from flyship.compiler.spec.opdecl import OpDecl
from flyship.compiler.spec.params import Constexpr, Output, Scalar, Tensor, Value
from flyship.compiler.spec.specialization import Spec
from flyship.compiler.configs import kernel_name as _kernel_name
from flyship.errors import SpecError


def validate(d: OpDecl) -> None:
    """Check an op declaration; raises :class:`SpecError` naming the op and the problem.

    What the manifest will hold is judged by the rule book (:func:`flyship.bundle.rules.check_op_head` on
    :func:`manifest_head`), so a declaration is refused here exactly when its manifest would be; the checks of
    what only a declaration has (constexprs, Values, example shapes, launches) are this module's.
    """
    w = f"op {d.name}"
    _by_rule_book(lambda: _rules.check_name(d.name, w))
    tensors = {a.name for a in d.args if isinstance(a, Tensor)}
    for a in d.args:
        if isinstance(a, Tensor) and not isinstance(a.mutable, bool):
            raise SpecError(f"{w}: tensor {a.name}: mutable must be True or False, got {a.mutable!r}")
        if isinstance(a, (Tensor, Output)) and a.pointee is not None and a.pointee not in DTYPES:
            kind = "tensor" if isinstance(a, Tensor) else "output"
            raise SpecError(f"{w}: {kind} {a.name}: pointee {a.pointee!r} is not a dtype; known: {', '.join(DTYPES)}")
        if isinstance(a, Scalar) and a.default is not None and a.type in SCALAR_TYPES:  # (an unknown type: below)
            _check_scalar_value(a, a.default, f"{w}: Scalar({a.name!r}, {a.type!r}, default={a.default!r})")
        if isinstance(a, Output):
            if bool(a.like) == bool(a.shape):
                raise SpecError(f"{w}: output {a.name}: give exactly one of like= or shape=")
            if a.like and a.like not in tensors:
                raise SpecError(f"{w}: output {a.name}: like={a.like!r} names no input tensor ({sorted(tensors)})")
    inputs_only = {k: v for k, v in d.expression_slots().items() if k in {a.name for a in d.inputs}}
    for k in d.key:
        try:
            _rules.check_expression(k, inputs_only, f"{w}: key expression {k!r}")
        except BundleError as e:
            raise SpecError(f"{e}; a key is an integer expression over the inputs") from None
    head = manifest_head(d)
    if d.mutable_written:  # which inputs the kernel writes is known after compiling: judge the head as if it may
        if d.backward is not None:  # write any of them (the manifest's rules judge what it does write)
            raise SpecError(f"{w}: mutable=True with a backward: an op that writes an input cannot be the forward of "
                            "an autograd pair; declare the op's writes as Outputs, or drop backward=")
        head = dataclasses.replace(head, args=tuple(dataclasses.replace(a, mutable=a.kind == "tensor")
                                                    for a in head.args))
    _by_rule_book(lambda: _rules.check_op_head(head, w))
    _validate_workspaces(d, w)
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
        _by_rule_book(lambda: _rules.check_name(spec.name, f"{w}: specialization name"))
        if spec.name in seen:
            raise SpecError(f"{w}: specialization name {spec.name!r} repeats; give each spec its own name")
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


def _validate_spec(d: OpDecl, s: Spec, w: str, slots: dict, tensors: set[str]) -> None:
    """One form of a specialization (the spec itself, or as a per_target entry makes it) against the op."""
    outputs = {o.name for o in d.outputs}
    for key in ("dtypes", "shapes"):
        unknown = sorted(set(getattr(s, key)) - tensors)
        if key == "dtypes" and set(unknown) & outputs:
            o = sorted(set(unknown) & outputs)[0]
            raise SpecError(
                f"{w} spec {s.name}: dtypes names output {o!r}; an output's dtype is the op's, declared on its "
                f"Output (one per target at most), not per spec: for a dtype that differs per target write "
                f"Output({o!r}, ..., dtype='float8_e4m3fn', per_target={{'gfx942': 'float8_e4m3fnuz'}}), or let "
                f"{o!r} take the dtype of an input (dtype='<input>') whose dtype the spec's per_target sets")
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
        fits = {"int": "an int (a float is never truncated to one)", "float": "a number",
                "bool": "True or False"}[a.type]
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
    values = [(f"Value {a.name} expression", (a.expr,)) for a in d.args
              if isinstance(a, Value) and a.float_literal() is None]
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
                            "; besides the op's inputs and outputs it may name the int constexprs "
                            f"({', '.join(consts)})" if consts else "")) from None
                    checked.add((what, written))


def _validate_workspaces(d: OpDecl, w: str) -> None:
    """Workspaces: a known dtype, a shape over the inputs and constexprs, used by some launch."""
    inputs = {a.name: _expr.Slot(i, "tensor", a.rank) if isinstance(a, Tensor) else _expr.Slot(i, "int")
              for i, a in enumerate(d.inputs)}
    consts = {a.name: _expr.Slot(len(inputs) + i, "int") for i, a in enumerate(d.args) if isinstance(a, Constexpr)}
    for ws in d.workspaces:
        _by_rule_book(lambda: _rules.check_workspace_dtype(ws.dtype, f"{w}: workspace {ws.name}: dtype"))
        if isinstance(ws.shape, str) or not ws.shape:
            raise SpecError(f"{w}: workspace {ws.name}: shape must be a tuple of expressions, got {ws.shape!r}")
        for e in ws.shape:
            try:
                _expr.compile_program(e, {**inputs, **consts})
            except _expr.ExprError as err:
                raise SpecError(f"{w}: workspace {ws.name}: shape {e!r}: {err}; a workspace's shape reads the "
                                "inputs, the constexprs and device.cu_count") from None
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
    _by_rule_book(lambda: _rules.check_launch_count(d.launches, f"{w}: kernel=[Launch(...), ...]"))
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


def manifest_head(d: OpDecl) -> _m.Op:
    """The op the manifest will hold, as far as the declaration gives it: its arguments, outputs (shape, dtype and
    batch rules), reference, backward and tuning key; no specializations, no dtypes yet."""
    args = tuple(_m.Arg(name=a.name, kind="tensor", rank=a.rank, mutable=a.mutable, batch=bool(a.batch))
                 if isinstance(a, Tensor) else _m.Arg(name=a.name, kind=a.type, default=a.default) for a in d.inputs)
    has_tensor = any(isinstance(a, Tensor) for a in d.args)
    outputs = tuple(_m.Output(name=o.name, shape=d.output_shape(o),
                              dtype=d.output_dtype(o) if o.like or o.dtype or has_tensor else "",
                              batch=d.output_batch(o), zero=bool(o.zero), target_dtypes=d.output_target_dtypes(o))
                    for o in d.outputs)
    return _m.Op(name=d.name, frontend=d.frontend, doc=d.doc, args=args, outputs=outputs, reference=d.reference,
                 specializations=(), backward=d.backward, tuning_key=d.key)


def _by_rule_book(check: Callable[[], None]) -> None:
    """Run a rule of the rule book on the declaration; its refusal becomes a :class:`SpecError` with its words."""
    try:
        check()
    except BundleError as e:
        raise SpecError(str(e)) from None
