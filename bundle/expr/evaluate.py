"""The one interpreter of expressions in Python, with the C++ core's semantics (package docstring): on ints for
example checks and the compile stage, on torch SymInts for fake kernels."""

from __future__ import annotations

import ast
import functools
from typing import Any, Callable, Mapping, Optional

from flyship.bundle.errors import ExprError
from flyship.bundle.expr.grammar import (_BINOPS, DIVISION, INT64_MAX, INT64_MIN, OVERFLOW, _dim, _fail, _is_device,
                                         _tensor_index, parse)
from flyship.bundle.frozen import frozen

@frozen
class Symbolic:
    """Arithmetic over symbolic sizes (torch SymInts), for fake kernels: ``min``/``max`` that trace
    (``torch.sym_min``/``torch.sym_max``). Symbolic values are not range-checked; the C++ core checks the
    real call."""

    min: Callable[[Any, Any], Any]
    max: Callable[[Any, Any], Any]


def _div(a: Any, b: Any, op: str, text: str) -> Any:
    """Floor division, modulo or ceiling division with the core's refusals (zero divisor)."""
    if isinstance(b, int) and b == 0:
        raise ExprError(f"expression {text!r}: division by zero", kind=DIVISION)
    if op == "floordiv":
        return a // b
    if op == "mod":
        return a % b
    return -((-a) // b)


def evaluate(text: str, env: Callable[[str, str, int | None], Any], *, symbolic: Optional[Symbolic] = None) -> Any:
    """Evaluate an expression with the C++ core's semantics (module docstring). The one interpreter of
    expressions in Python: example checks and the compile stage use it on ints, fake kernels on SymInts.

    Args:
        text: the expression.
        env: ``env(name, what, index)`` resolves ``what`` in ``{"shape", "stride", "numel", "scalar"}`` for
            argument ``name`` (``index`` as written, negative counts from the end), and ``what == "device"``
            for the device property ``name`` (``"cu_count"``).
        symbolic: evaluate on symbolic sizes (no range checks; min/max from here).

    Returns:
        The value (booleans as 0 / 1).

    Raises:
        ExprError: division by zero (``kind`` :data:`DIVISION`), a value outside int64 (``kind``
            :data:`OVERFLOW`; not with ``symbolic``).
        ExprError: a name ``env`` cannot resolve (its own error, re-raised).
    """

    def checked(v: Any) -> Any:
        if symbolic is None and not INT64_MIN <= v <= INT64_MAX:
            raise ExprError(f"expression {text!r}: a value leaves int64 ({v}) for these inputs", kind=OVERFLOW)
        return v

    def ev(n: ast.expr) -> Any:
        if isinstance(n, ast.Constant):
            return int(n.value)
        if isinstance(n, ast.Name):
            return checked(env(n.id, "scalar", None))
        if _is_device(n):
            return checked(env(n.attr, "device", None))
        if isinstance(n, ast.Attribute):
            return checked(env(n.value.id, "numel", None))
        if isinstance(n, ast.Subscript):
            name, what, idx = _tensor_index(n, text)
            return checked(env(name, what, idx))
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            op = _BINOPS[type(n.op)]
            if op == "add":
                return checked(a + b)
            if op == "sub":
                return checked(a - b)
            if op == "mul":
                return checked(a * b)
            return checked(_div(a, b, op, text))
        if isinstance(n, ast.UnaryOp):
            v = ev(n.operand)
            return checked(-v) if isinstance(n.op, ast.USub) else int(not v)
        if isinstance(n, ast.Compare):
            a, b = ev(n.left), ev(n.comparators[0])
            return int({ast.Eq: a == b, ast.NotEq: a != b, ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b,
                        ast.GtE: a >= b}[type(n.ops[0])])
        if isinstance(n, ast.BoolOp):
            vals = [ev(v) for v in n.values]  # all of them, as the postfix program does
            return int(all(vals) if isinstance(n.op, ast.And) else any(vals))
        if isinstance(n, ast.Call):
            a, b = ev(n.args[0]), ev(n.args[1])
            if n.func.id == "cdiv":
                return checked(_div(a, b, "cdiv", text))
            if symbolic is not None:
                return (symbolic.min if n.func.id == "min" else symbolic.max)(a, b)
            return min(a, b) if n.func.id == "min" else max(a, b)
        raise _fail(text, f"cannot evaluate {ast.unparse(n)!r}")

    return ev(parse(text))


def evaluate_with_shapes(text: str, shapes: Mapping[str, tuple[int, ...]], scalars: Mapping[str, int] = (),
                         strides: Mapping[str, tuple[int, ...]] | None = None,
                         device: Mapping[str, int] | None = None) -> int:
    """Evaluate against concrete shapes (row-major contiguous strides unless ``strides`` is given).

    Args:
        device: device properties (``{"cu_count": 304}``) for ``device.*`` names; None when there is no device.

    Raises:
        ExprError: a name that is neither a tensor in ``shapes`` nor a scalar in ``scalars``, or a device
            property without ``device``; see :func:`evaluate`.
    """
    scalars = dict(scalars)

    def env(name: str, what: str, idx: int | None) -> int:
        if what == "device":
            if device is None or name not in device:
                raise _fail(text, f"device.{name} needs a device, and there is none here; device properties "
                                  "may appear in grids, guards and kernarg values, not in output shapes")
            return int(device[name])
        if what == "scalar":
            if name not in scalars:
                raise _fail(text, f"unknown name {name!r}; known: {', '.join(sorted([*shapes, *scalars]))}")
            return scalars[name]
        if name not in shapes:
            raise _fail(text, f"unknown tensor {name!r}; known: {', '.join(sorted(shapes))}")
        shape = tuple(shapes[name])
        if what == "numel":
            n = functools.reduce(lambda a, b: a * b, shape, 1)
            if not INT64_MIN <= n <= INT64_MAX:
                raise ExprError(f"expression {text!r}: {name}.numel of shape {shape} leaves int64", kind=OVERFLOW)
            return n
        if what == "stride":
            st = tuple(strides[name]) if strides and name in strides else contiguous_strides(shape)
            return st[_dim(idx, len(shape), text, name)]
        return shape[_dim(idx, len(shape), text, name)]

    return evaluate(text, env)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements, as ``torch.empty(shape).stride()`` gives them."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))
