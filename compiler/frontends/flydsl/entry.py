"""The example call's values, and an ``Entry``'s launcher calls bound to the op's arguments: which op tensor,
scalar or constant each ``@flyc.jit`` parameter of each call receives, found by tracing the entry on
placeholders and matching the values each call was given.
"""

from __future__ import annotations

from typing import Any

from flyship.bundle import expr as _expr
from flyship.bundle.manifest import DTYPES
from flyship.compiler.frontends.base import FrontendError, example_device
from flyship.compiler.frontends.flydsl.signature import (_is_compile_time, _is_stream, entry_arguments,
                                                         launcher_constant, launcher_name)
from flyship.compiler.spec import Entry, OpDecl, Output, Scalar, Spec, Tensor, Value, Workspace


def _torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise FrontendError(f"dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def workspace_example_shape(op: OpDecl, w: Workspace, spec: Spec) -> tuple[int, ...]:
    """A workspace's shape at the spec's example call."""
    shapes = op.example_shapes(spec)
    scal = {k: v for k, v in op.example_scalars(spec).items() if isinstance(v, int) and not isinstance(v, bool)}
    return tuple(_expr.evaluate_with_shapes(e, shapes, scal) for e in op.workspace_shape(w, spec))


def _entry_bindings(op: OpDecl, spec: Spec, calls: list[tuple[Any, tuple, dict]], pos: list,
                    where: str, target: str | None = None) -> list[OpDecl]:
    """The op's declaration in each launcher call's parameter order (:func:`_entry_binding`), in call order. A
    buffer the entry allocated is one declared Workspace in every call that receives it (by identity: the
    recorded arguments keep each buffer alive, so no two share an ``id``); every declared workspace must be
    passed to some launcher."""
    _check_constants_pinned(op, spec, pos, where)
    allocated: dict[int, Workspace] = {}
    bound = [_entry_binding(op, spec, jit, args, kwargs, pos, allocated,
                            where if len(calls) == 1 else f"{where} launcher {k + 1} ({launcher_name(jit)})", target)
             for k, (jit, args, kwargs) in enumerate(calls)]
    spare = [w.name for w in op.workspaces if w not in allocated.values()]
    if spare:
        launchers = "its launchers" if len(calls) > 1 else "the launcher"
        raise FrontendError(f"{where}: entry {op.kernel.__name__!r} passes {launchers} no tensor for {spare}; declare "
                            "only the workspaces the entry allocates")
    return bound


def _example_sizes(op: OpDecl, pos: list) -> list[tuple[str, int]]:
    """(expression, example value) of every dimension and element count of the op's example input tensors, in
    declaration order: ``("x.shape[0]", 128)``, ..., ``("x.numel", 524288)``."""
    import torch

    sizes: list[tuple[str, int]] = []
    for a, v in zip(entry_arguments(op), pos):
        if isinstance(a, Tensor) and isinstance(v, torch.Tensor):
            sizes += [(f"{a.name}.shape[{i}]", int(d)) for i, d in enumerate(v.shape)]
            sizes.append((f"{a.name}.numel", int(v.numel())))
    return sizes


def _check_constants_pinned(op: OpDecl, spec: Spec, pos: list, where: str) -> None:
    """A constant ``Value("m", "64")`` equal to an example input's dimension (or element count) is baked into
    the kernel: the spec must pin that size with a constraint (``"x.shape[0] == 64"``), else a call of another
    size would dispatch to a kernel fixed to the example's."""
    constraints = (*spec.constraints, *op.constraints(spec))
    equal = [cmp[1:] for cmp in map(_expr.comparison, constraints) if cmp and cmp[0] == "eq"]
    pins = set(equal) | {(b, a) for a, b in equal}
    sizes = _example_sizes(op, pos)
    for a in op.args:
        if not launcher_constant(a) or a.float_literal() is not None:
            continue
        value = int(a.expr.strip())
        same = [e for e, v in sizes if v == value]
        if same and not any((e, str(value)) in pins for e in same):
            raise FrontendError(
                f"{where}: constant Value({a.name!r}, {a.expr!r}) equals the example's {' / '.join(same)}, expected a "
                f"constraint pinning that size (e.g. constraints=({same[0] + ' == ' + str(value)!r},)), got none; "
                "without it the kernel is fixed to this size and a call of another size would run it: if the entry "
                f"computes the value from the tensor, make it an entry parameter declared Value({a.name!r}, "
                f"{same[0]!r}) instead; if it is that fixed size, add the constraint; if it is unrelated, give the "
                "example another size")


def _shape_hint(op: OpDecl, pos: list, name: str, value: Any) -> str:
    """For an int the entry passes that equals an example input's size: how to declare it (the entry takes
    it as a parameter, declared ``Value(name, "x.shape[0]")``), else ""."""
    if type(value) is not int:
        return ""
    same = [e for e, v in _example_sizes(op, pos) if v == value]
    if not same:
        return ""
    return (f"; {value} is the example's {' / '.join(same)}: if the entry computes it from the tensor, take it as "
            f"an entry parameter instead and declare Value({name!r}, {same[0]!r}) in args= (the entry passes it on "
            f"to the launcher), so each call gets its own size")


def _entry_binding(op: OpDecl, spec: Spec, jit: Any, args: tuple, kwargs: dict, pos: list,
                   allocated: dict[int, Workspace], where: str, target: str | None = None) -> OpDecl:
    """The op's declaration in one inner launcher's parameter order: each runtime argument the entry passed
    is one of the op's own (a tensor passed through, by identity, bare or wrapped by ``flyc.from_torch_tensor``
    / ``flyc.from_dlpack``; a scalar equal to exactly one declared scalar's example, or to a declared constant
    ``Value("n", "128")``), or a buffer the entry allocated: the Workspace ``allocated`` maps it to (an earlier
    launcher received it), else the next unused declared Workspace of its shape and dtype (recorded in
    ``allocated``). An argument the entry computed itself cannot be bound, and is refused."""
    import inspect

    import torch

    sig = inspect.signature(jit.func)
    bound = sig.bind(*args, **kwargs)
    declared = entry_arguments(op)
    values = op.example_values(spec, example_device(spec, target))
    constants = [(a, values[a.name]) for a in op.args if launcher_constant(a, op)]
    mapped: list = []
    unbound: list[tuple[str, Any, str]] = []
    for name, value in bound.arguments.items():
        ann = sig.parameters[name].annotation
        if _is_stream(ann) or (ann is not inspect.Parameter.empty and _is_compile_time(ann)):
            continue
        wrapped = _wrapped_tensor(value)
        if wrapped is not None and wrapped is not value:
            value = wrapped  # flyc.from_torch_tensor(t).mark_layout_dynamic(...): the launcher reads t's storage
        if isinstance(value, torch.Tensor):
            hit = [a for a, v in zip(declared, pos) if v is value]
            if not hit and id(value) in allocated:
                hit = [allocated[id(value)]]
            if not hit:  # a buffer the entry allocated: the next unused Workspace of its shape and dtype
                used = list(allocated.values())
                hit = [w for w in op.workspaces if w not in used
                       and tuple(value.shape) == workspace_example_shape(op, w, spec)
                       and value.dtype == _torch_dtype(w.dtype) and value.is_contiguous()][:1]
                if hit:
                    allocated[id(value)] = hit[0]
            if not hit:
                raise FrontendError(f"{where}: entry {op.kernel.__name__!r} passes launcher parameter {name!r} a "
                                    f"tensor that is none of the op's arguments (shape {tuple(value.shape)}, "
                                    f"{value.dtype}: a view, a fresh tensor, or one buffer more than the declared "
                                    "workspaces); flyship binds tensors the entry passes through unchanged (or "
                                    "wrapped by flyc.from_torch_tensor / from_dlpack), and buffers it allocates as "
                                    "declared Workspace(...)s of the same shape rule and dtype (contiguous), one per "
                                    "buffer; for a view (t.view(-1), t.view(torch.int8), t.reshape(...)), pass the "
                                    "tensor itself and let the launcher index it, or declare the op's tensor as the "
                                    "launcher sees it (a flat 1-D Tensor with rules on its numel, or the dtype the "
                                    "launcher reads) so the entry passes it unchanged")
        elif isinstance(value, (bool, int, float)):
            try:
                hit = [_bind_scalar(op, declared, pos, constants, name, value, where)]
            except FrontendError as e:  # every unbound scalar in one refusal: each fix would cost a rebuild
                unbound.append((name, value, str(e)))
                hit = [None]
        else:
            raise FrontendError(f"{where}: entry {op.kernel.__name__!r} passes launcher parameter {name!r} a "
                                f"{type(value).__module__}.{type(value).__qualname__}, expected a torch tensor (or "
                                "one wrapped by flyc.from_torch_tensor / flyc.from_dlpack) or a Python scalar; "
                                "flyship binds only the op's tensors and scalars the entry passes through: pass the "
                                "tensor itself, or name the launcher in op(kernel=...)")
        mapped.append(hit[0])
    if len(unbound) == 1:
        raise FrontendError(unbound[0][2])
    if unbound:
        first = unbound[0][2].split(": ", 1)[1]
        raise FrontendError(f"{where}: entry {op.kernel.__name__!r} passes {len(unbound)} launcher parameters a value "
                            f"flyship cannot bind to a declared argument: "
                            f"{', '.join(f'{n}={v!r}' for n, v, _ in unbound)}; each needs its own declaration, as "
                            f"for the first: {first}")
    consts = tuple(a for a in op.args if not isinstance(a, (Tensor, Output, Scalar, Value, Workspace)))
    return op.call_view(tuple(mapped) + consts)


def _bind_scalar(op: OpDecl, declared: list, pos: list, constants: list, name: str, value: Any, where: str) -> Any:
    """The declared Scalar or Value an entry's scalar argument ``value`` (for launcher parameter ``name``) is.

    Raises:
        FrontendError: it is none of them, or more than one that neither identity nor the name tells apart.
    """
    hit = [a for a, v in zip(declared, pos) if isinstance(a, (Scalar, Value)) and type(v) is type(value)
           and v == value]
    hit += [a for a, v in constants if type(value) in (int, float) and type(v) is type(value) and v == value]
    if len(hit) > 1:  # equal example values (Q's and O's strides): the one passed through, by identity,
        # else the one named as the launcher's parameter; never a guess by value
        hit = ([a for a, v in zip(declared, pos) if v is value and a in hit]
               or [a for a in hit if a.name == name] or hit)
    if not hit and (default := _entry_default(op, name, value)) is not None:
        return default
    if len(hit) != 1:
        shape = _shape_hint(op, pos, name, value) if not hit else ""
        constant = (f"; {'else ' if shape else ''}a constant the entry passes itself (a fixed size, pinned "
                    f"by a constraint if it equals an input's) is declared Value({name!r}, {str(value)!r}) "
                    "in args=" if type(value) is int and not hit else
                    f"; a float constant the entry passes itself is declared Value({name!r}, {str(value)!r}, "
                    "type='f32') in args=" if type(value) is float and not hit else "")
        constant = shape + constant
        several = (f" ({', '.join(a.name for a in hit)}, equal at the example); flyship binds a scalar "
                   "the entry passes through unchanged by identity (ints above 256), else by the launcher's "
                   f"parameter name: name a declared argument {name!r}, or give the example scalars "
                   "distinct values" if hit else
                   "; flyship binds scalars the entry passes through (give the example scalars distinct "
                   "values)")
        raise FrontendError(f"{where}: entry {op.kernel.__name__!r} passes launcher parameter {name!r} the "
                            f"value {value!r}, which is {'none' if not hit else 'more than one'} of the op's "
                            f"scalar arguments{several}{constant}")
    return hit[0]


def _entry_default(op: OpDecl, name: str, value: Any) -> Value | None:
    """The constant ``Value(name, "<value>")`` when the int ``value`` the entry passes launcher parameter ``name``
    is the default of a keyword of that name the caller did not pass (upstream's flash attention:
    ``_launch(..., *, block_table_stride=0)`` passes ``block_table_stride`` on to its launcher): a default is fixed
    when the entry is defined, so the kernel may take it as a constant. Looked up in the entry and the functions
    it closes over (a wrapper around the function that has the default), a few levels deep; None when no such
    default, or several that disagree."""
    import inspect

    if type(value) is not int or not isinstance(op.kernel, Entry):
        return None
    seen: set[int] = set()
    found: list[Any] = []
    level = [op.kernel.fn]
    for _ in range(4):  # the entry, what it wraps, and two levels below: upstream's builders nest two
        nxt = []
        for fn in level:
            if id(fn) in seen or len(seen) >= 32:
                continue
            seen.add(id(fn))
            try:
                p = inspect.signature(fn).parameters.get(name)
            except (TypeError, ValueError):
                p = None
            if p is not None and p.default is not inspect.Parameter.empty:
                found.append(p.default)
            cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
            nxt += [f for f in (*cells, getattr(fn, "__wrapped__", None)) if inspect.isfunction(f)]
        level = nxt
    if found and all(type(d) is int and d == value for d in found):
        return Value(name, str(value))
    return None


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a closure variable not yet assigned)
        return False
    return True


def _wrapped_tensor(value: Any) -> Any:
    """The torch tensor a FlyDSL tensor argument wraps (FlyDSL 0.5.0: ``flyc.from_torch_tensor(t)`` keeps ``t`` as
    ``torch_tensor``, ``flyc.from_dlpack(t)`` as ``dltensor``; ``mark_layout_dynamic`` returns the same wrapper),
    else None."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    for attr in ("torch_tensor", "dltensor"):
        inner = getattr(value, attr, None)
        if isinstance(inner, torch.Tensor):
            return inner
    return None
