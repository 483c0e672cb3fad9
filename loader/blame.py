"""Which argument a failed reference is blamed on: one owner of that rule and of its words, for both call paths.

When an op's PyTorch reference fails (raises, or returns what the output rules do not give), the inputs may be the
cause, not the reference: sizes that break a guard constraint relating two arguments (``w.shape[0] ==
x.shape[1]``) in every specialization, or dtypes no specialization admits. :func:`blame` words the message so that
it names the argument first, expected vs got. The CPU kernel (loader/cpu.py) calls it directly; the C++ core calls
it on its cold path (``OpState::call_reference``, csrc/python_calls.cpp) through the plan's ``blame`` callable
(:func:`flyship.loader.plan.lower_bundle`), so a misfit call reads the same on the CPU, on a GPU and on the
recording driver.
"""

from __future__ import annotations

from typing import Any

from flyship.bundle import expr as _expr
from flyship.bundle import manifest as _m
from flyship.errors import ExprError


def blame(op: _m.Op, values: dict[str, Any], failure: str, fix: str, about_dtypes: bool) -> str:
    """The message (after ``flyship <ns>::<op>: ``) for a reference that failed on these inputs.

    Args:
        op: the op's manifest entry, with its specializations.
        values: the op's inputs by name, as the reference got them (the kernel's shapes: leading batch dims
            flattened); tensors, and Python ints, bools and floats.
        failure: what the reference did (``raised RuntimeError: ...``, ``returned output 'y' of shape ...``).
        fix: what to do when the inputs are not the cause (``fix the reference``).
        about_dtypes: whether input dtypes no specialization admits could be the cause (a reference that raised,
            or returned another dtype).

    Returns:
        Input shapes that do not fit together (:func:`misfit`), then dtypes no specialization admits
        (:func:`unadmitted`), named first as the cause with the argument to fix; else the failure and ``fix``.

    Example::

        blame(op, {"x": torch.ones(8), "y": torch.ones(5)}, "raised RuntimeError: ...", "fix the reference", True)
        # "input 'y' does not fit the others: expected x.shape[0] == y.shape[0], got x.shape[0] = 8, ..."
    """
    found = misfit(op, values)
    why = unadmitted(op, values) if about_dtypes else ""
    if found is not None:
        blamed, text = found
        also = f"; also {why}" if why else ""
        return (f"{text}{also}, and the reference (fallback) {failure}; pass '{blamed}' of a shape that fits the "
                "others as the constraint says")
    if why:
        return f"{why}, and the reference (fallback) {failure}; pass tensors of dtypes the op takes"
    return f"the reference (fallback) {failure}; {fix}"


def _tensor_dtypes(op: _m.Op, values: dict[str, Any]) -> dict[str, str]:
    """The input tensors' dtypes by name (``float32``), in the op's argument order."""
    import torch

    return {a.name: str(values[a.name].dtype).removeprefix("torch.") for a in op.args
            if isinstance(values.get(a.name), torch.Tensor)}


def unadmitted(op: _m.Op, values: dict[str, Any]) -> str:
    """Why no specialization takes these input dtypes (``no specialization admits the input dtypes x=int32,
    w=float32 (they take ...)``), or "" when one does."""
    got = _tensor_dtypes(op, values)
    takes = []
    for s in op.specializations:
        if all(got.get(t) == d for t, d in s.guard.dtypes.items()):
            return ""
        takes.append(f"{', '.join(f'{t}={d}' for t, d in s.guard.dtypes.items())} ({s.name})")
    return (f"no specialization admits the input dtypes {', '.join(f'{t}={d}' for t, d in got.items())} (they "
            f"take {'; '.join(takes) or 'nothing'})")


def misfit(op: _m.Op, values: dict[str, Any]) -> tuple[str, str] | None:
    """The argument to blame and why the input shapes do not fit together (``input 'w' does not fit the others:
    expected w.shape[0] == x.shape[1], got w.shape[0] = 100, x.shape[1] = 256 (x of shape [4, 256], w of shape
    [100])``), or None when they do.

    A misfit is a guard constraint that relates the sizes of two or more inputs and that every specialization
    admitting the input dtypes (every one, when none does) breaks. Limits of one argument (``x.shape[1] <= 8192``)
    and strides are left out: a kernel's limits, not a misfit, that the reference serves on the GPU too. The blamed
    argument is the last (in the op's argument order) of those the constraint names: the earlier one sets the size.
    """
    import torch

    names_in_order = [a.name for a in op.args]
    shapes = {n: tuple(v.shape) for n, v in values.items() if isinstance(v, torch.Tensor)}
    scalars = {n: int(v) for n, v in values.items() if isinstance(v, (bool, int))}
    dtypes = _tensor_dtypes(op, values)
    specs = op.specializations
    admitting = [s for s in specs if all(dtypes.get(t) == d for t, d in s.guard.dtypes.items())] or list(specs)
    first = ""
    for s in admitting:
        broken = [c for c in s.guard.constraints if _relates(c, shapes) and not _holds(c, shapes, scalars)]
        if not broken:
            return None
        first = first or broken[0]
    if not first:
        return None
    names = sorted(_relates(first, shapes), key=names_in_order.index)
    blamed = names[-1]
    given = ", ".join(f"{n} of shape {list(shapes[n])}" for n in names)
    return blamed, (f"input '{blamed}' does not fit the others: expected {first}, got "
                    f"{_sides(first, shapes, scalars)} ({given})")


def _relates(text: str, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """The tensors whose sizes constraint ``text`` relates, when it relates two or more of the inputs in
    ``shapes`` by size alone (no strides, outputs or device properties), else []."""
    try:
        reads = _expr.reads(text)
    except ExprError:
        return []
    names: list[str] = []
    for name, what, _ in reads:
        if what == "scalar":
            continue
        if name == _expr.DEVICE or what == "stride" or name not in shapes:
            return []
        if name not in names:
            names.append(name)
    return names if len(names) > 1 else []


def _holds(text: str, shapes: dict[str, tuple[int, ...]], scalars: dict[str, int]) -> bool:
    """Whether constraint ``text`` holds for these shapes (one that cannot be evaluated counts as holding: it
    blames nothing)."""
    try:
        return bool(_expr.evaluate_with_shapes(text, shapes, scalars))
    except ExprError:
        return True


def _sides(text: str, shapes: dict[str, tuple[int, ...]], scalars: dict[str, int]) -> str:
    """The values of a broken comparison's two sides (``w.shape[0] = 100, x.shape[1] = 256``), or "false"."""
    cmp = _expr.comparison(text)
    if cmp is None:
        return "false"
    parts = []
    for t in cmp[1:]:
        try:
            v = _expr.evaluate_with_shapes(t, shapes, scalars)
        except ExprError:
            return "false"
        if _expr.int_literal(t) is None:  # a literal side needs no "= value"
            parts.append(f"{t} = {v}")
    return ", ".join(parts) or "false"
