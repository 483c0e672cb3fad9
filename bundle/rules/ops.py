"""Rules on one op: its arguments, outputs, names, batch dimensions, specializations and their variants."""

from __future__ import annotations

from flyship.bundle import expr as _expr
from flyship.bundle import limits as L
from flyship.bundle import model as _m
from flyship.bundle.rules.common import count as _count
from flyship.bundle.rules.common import fail as _fail
from flyship.bundle.rules.common import is_pow2 as _is_pow2
from flyship.bundle.rules.expressions import check_expression
from flyship.bundle.rules.inplace import check_alias_letters, check_effects, check_mutable_arg
from flyship.bundle.rules.names import check_name, check_names, check_out_names
from flyship.bundle.rules.values import check_scalar_value
from flyship.bundle.rules.variants import check_launch_count, check_variant, check_workspaces


def check_batch(args: tuple[_m.Arg, ...] | list[_m.Arg], outputs: tuple[_m.Output, ...] | list[_m.Output],
                where: str) -> None:
    """Leading batch dimensions (:mod:`flyship.bundle.batch`): a batched argument is a tensor of rank >= 1, and a
    batched output's first dimension is a batched input's first, so the call can give it the leading dims back.

    Raises:
        BundleError: naming the argument or output and what to declare instead.
    """
    batched = []
    for i, a in enumerate(args):
        if a.batch and (a.kind != "tensor" or a.rank < 1):
            raise _fail(f"{where}.args[{i}].batch", f"expected a tensor of rank >= 1 for leading batch dimensions, "
                        f"got {a.kind} {a.name!r} of rank {a.rank}; only tensors with a first dimension to flatten "
                        "into can be batched")
        if a.batch:
            batched.append(a.name)
    for i, o in enumerate(outputs):
        if not o.batch:
            continue
        first = _expr.canonical(o.shape[0]) if o.shape else ""
        rows = [f"{n}.shape[0]" for n in batched]
        if not o.shape or _expr.dimension(o.shape[0]) not in {(n, "shape", 0) for n in batched}:
            raise _fail(f"{where}.outputs[{i}].batch", f"expected output {o.name!r}'s first dimension to be a batched "
                        f"input's first ({' or '.join(rows) or 'no input is batched'}), got "
                        f"{first or 'a rank-0 output'!r}; mark the input batched, or the output not batched")



def check_op(op: _m.Op, where: str) -> None:
    """One op's rules: its head (:func:`check_op_head`), its specializations and their variants."""
    check_op_head(op, where)
    _count(op.specializations, L.MAX_SPECIALIZATIONS, "specializations", f"{where}.specializations")
    seen: set[str] = set()
    for si, s in enumerate(op.specializations):
        sw = f"{where}.specializations[{si}] ({s.name})"
        check_name(s.name, f"{sw}.name")
        if s.name in seen:
            raise _fail(f"{sw}.name", f"specialization name {s.name!r} is duplicated")
        seen.add(s.name)
        check_specialization(op, s, sw)


def check_op_head(op: _m.Op, where: str) -> None:
    """An op's rules that do not depend on what was built: the frontend and reference names, the arguments,
    the outputs and their shapes, the names, the batch dimensions and the tuning key. The spec API runs them
    on a declaration before anything compiles."""
    check_name(op.frontend, f"{where}.frontend")  # an open name: the loader runs every frontend's ops alike
    if op.reference is not None:
        check_name(op.reference, f"{where}.reference")
    _count(op.args, L.MAX_ARGS, "arguments", f"{where}.args")
    _count(op.outputs, L.MAX_OUTPUTS, "outputs", f"{where}.outputs")
    _count((*op.args, *op.outputs), L.MAX_SLOTS, "arguments and outputs together", where)  # the core's slots
    check_args(op.args, where)
    if not any(a.kind == "tensor" for a in op.args):
        raise _fail(f"{where}.args", "expected at least one input tensor, got none; the loader runs the kernel on "
                                     "the device of the op's input tensors")
    check_effects(op, where)
    for i, o in enumerate(op.outputs):
        if len(o.shape) > L.MAX_RANK:
            raise _fail(f"{where}.outputs[{i}].shape", f"expected a rank up to {L.MAX_RANK}, got {len(o.shape)}")
    check_names(op, where)
    check_out_names(op, where)
    check_alias_letters(op, where)
    inputs = input_slots(op)
    for i, o in enumerate(op.outputs):
        for j, e in enumerate(o.shape):
            check_expression(e, inputs, f"{where}.outputs[{i}].shape[{j}]")
            if _expr.names_device(e):
                raise _fail(f"{where}.outputs[{i}].shape[{j}]", f"expected a shape over the inputs, got {e!r}, "
                            "which reads the device; an output's shape must not depend on which GPU runs the call "
                            "(fake kernels have no device); compute it from the inputs")
    check_batch(op.args, op.outputs, where)
    _count(op.tuning_key, L.MAX_RANK * L.MAX_ARGS, "tuning key expressions", f"{where}.tuning_key")
    for j, e in enumerate(op.tuning_key):
        check_expression(e, inputs, f"{where}.tuning_key[{j}]")


def input_slots(op: _m.Op) -> dict[str, _expr.Slot]:
    """The slots of the op's inputs (what output shapes, workspace shapes and tuning keys may read)."""
    outs = {o.name for o in op.outputs}
    return {k: v for k, v in _m.slots(op).items() if k not in outs}


def check_args(args: tuple[_m.Arg, ...], where: str) -> None:
    """Each argument: a tensor (rank in range, no default) or a scalar of a known type (rank 0, no dtypes, a
    default of its type), known dtypes, and only tensors written in place."""
    for i, a in enumerate(args):
        aw = f"{where}.args[{i}]"
        if a.kind not in ("tensor", *_m.SCALAR_TYPES):
            raise _fail(f"{aw}.kind", f"expected tensor or one of {', '.join(_m.SCALAR_TYPES)}, got {a.kind!r}")
        if a.kind == "tensor":
            if not 0 <= a.rank <= L.MAX_RANK:
                raise _fail(f"{aw}.rank", f"expected a rank in 0..{L.MAX_RANK}, got {a.rank}")
            if a.default is not None:
                raise _fail(f"{aw}.default", f"a tensor argument has no default, got {a.default!r}")
        elif a.rank != 0 or a.dtypes:
            raise _fail(aw, f"a {a.kind} scalar has rank 0 and no dtypes, got rank {a.rank}, dtypes {list(a.dtypes)}")
        for d in a.dtypes:
            if d not in _m.DTYPES:
                raise _fail(f"{aw}.dtypes", f"expected dtype names ({', '.join(_m.DTYPES)}), got {d!r}")
        if a.default is not None:
            check_scalar_value(a.kind, a.default, f"{aw}.default")
        check_mutable_arg(a, aw)


def check_specialization(op: _m.Op, s: _m.Specialization, sw: str) -> None:
    """One specialization's guard and example against its op, then its variants."""
    sl = _m.slots(op)
    tensor_in = {a.name for a in op.args if a.kind == "tensor"}
    tensors = tensor_in | {o.name for o in op.outputs}
    kinds = {a.name: a.kind for a in op.args}
    for t, d in s.guard.dtypes.items():
        if t not in tensor_in or d not in _m.DTYPES:
            raise _fail(f"{sw}.guard.dtypes", f"guard dtype {t}={d} names no input tensor or no known dtype")
    _count(s.guard.constraints, L.MAX_CONSTRAINTS, "constraints", f"{sw}.guard.constraints")
    for j, c in enumerate(s.guard.constraints):
        check_expression(c, sl, f"{sw}.guard.constraints[{j}]")
    for t, a in s.guard.alignment.items():
        if t not in tensors:
            raise _fail(f"{sw}.guard.alignment", f"{t!r} names no tensor of the op")
        if not _is_pow2(a) or a > L.MAX_ALIGNMENT:
            raise _fail(f"{sw}.guard.alignment.{t}", f"expected a power of two up to {L.MAX_ALIGNMENT}, got {a}")
    for t, shape in s.example.shapes.items():
        if len(shape) > L.MAX_RANK or any(d < 0 for d in shape):
            raise _fail(f"{sw}.example.shapes.{t}", f"expected up to {L.MAX_RANK} sizes >= 0, got {list(shape)}")
    if any(g < 0 or g > L.MAX_GRID for g in s.example.grid):
        raise _fail(f"{sw}.example.grid", f"expected 0..{L.MAX_GRID} per dimension, got {list(s.example.grid)}")
    for k, v in s.example.scalars.items():
        if k in kinds and kinds[k] != "tensor":
            check_scalar_value(kinds[k], v, f"{sw}.example.scalars.{k}")
    if not s.variants:
        raise _fail(f"{sw}.variants", "no compiled variants")
    _count(s.variants, L.MAX_VARIANTS, "variants", f"{sw}.variants")
    for vi, v in enumerate(s.variants):
        check_call_variant(v, sl, input_slots(op), f"{sw}.variants[{vi}] (target {v.target})")


def check_call_variant(v: _m.Variant, sl: dict[str, _expr.Slot], inputs: dict[str, _expr.Slot], vw: str) -> None:
    """A variant with its following launches (schema 1.2): its workspaces, each launch, and every workspace
    passed to some launch."""
    check_workspaces(v.workspaces, sl, inputs, vw)
    names = tuple(w.name for w in v.workspaces)
    check_variant(v, sl, vw, names)
    check_launch_count(v.launches, f"{vw}.then")
    for k, t in enumerate(v.then):
        tw = f"{vw}.then[{k}]"
        if t.target != v.target:
            raise _fail(f"{tw}.target", f"a following launch runs on its variant's target {v.target}, got "
                                        f"{t.target!r}")
        if t.then or t.workspaces:
            raise _fail(tw, "a following launch has no then or workspaces of its own; list every launch of "
                            "the call in the variant's then, and its workspaces in the variant's")
        check_variant(t, sl, tw, names)
    used = {f.arg for t in v.launches for f in t.kernargs.fields if f.kind == "workspace"}
    unused = [n for n in names if n not in used]
    if unused:
        raise _fail(f"{vw}.workspaces", f"workspaces {unused} are passed to no launch; drop them or bind them "
                                        "to a kernel argument")
