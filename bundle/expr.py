"""Integer expressions over an op's arguments: launch grids, output shapes, kernarg values, guards.

The manifest stores every quantity that depends on a call's inputs as a small expression in a
Python subset, e.g. ``cdiv(x.shape[0], 128)`` or ``x.shape[1] % 8 == 0``. Grammar:

* integer literals, and the names of ``int`` scalar arguments;
* ``<tensor>.shape[i]``, ``<tensor>.stride[i]`` (in elements, as torch reports them) and
  ``<tensor>.numel``; ``i`` is an integer literal, negative counts from the end;
* ``+ - * // %`` (``//`` and ``%`` with Python's floor semantics), unary ``-``;
  ``cdiv(a, b)``, ``min(a, b)``, ``max(a, b)``;
* comparisons ``== != < <= > >=`` (one operator each), ``and``, ``or``, ``not``; booleans are 0 / 1.

All arithmetic is on signed 64-bit integers. The loader compiles each expression into a postfix
program (:func:`compile_program`) that the C++ core evaluates per call.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from typing import Callable, Mapping

from flyship.bundle.errors import ExprError

# Opcodes of the postfix program the C++ core evaluates (csrc/expr.h mirrors these numbers).
OP_CONST, OP_SHAPE, OP_STRIDE, OP_NUMEL, OP_SCALAR = 0, 1, 2, 3, 4
OP_ADD, OP_SUB, OP_MUL, OP_FLOORDIV, OP_MOD, OP_CDIV, OP_MIN, OP_MAX, OP_NEG = 10, 11, 12, 13, 14, 15, 16, 17, 18
OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_AND, OP_OR, OP_NOT = 20, 21, 22, 23, 24, 25, 26, 27, 28

_BINOPS = {ast.Add: OP_ADD, ast.Sub: OP_SUB, ast.Mult: OP_MUL, ast.FloorDiv: OP_FLOORDIV, ast.Mod: OP_MOD}
_CMPOPS = {ast.Eq: OP_EQ, ast.NotEq: OP_NE, ast.Lt: OP_LT, ast.LtE: OP_LE, ast.Gt: OP_GT, ast.GtE: OP_GE}
_CALLS = {"cdiv": OP_CDIV, "min": OP_MIN, "max": OP_MAX}
_ATTRS = {"shape": OP_SHAPE, "stride": OP_STRIDE}


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where an argument lives in the op's argument list, as the C++ core numbers it.

    Attributes:
        index: position among the op's arguments (inputs, then outputs).
        kind: ``"tensor"`` or ``"int"`` (only int scalars may appear in expressions).
        rank: number of dimensions of a tensor; 0 for scalars.
    """

    index: int
    kind: str
    rank: int = 0


def _fail(text: str, why: str) -> ExprError:
    return ExprError(f"expression {text!r}: {why}")


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> ast.expr:
    """Parse and check an expression.

    Raises:
        ExprError: syntax outside the grammar in this module's docstring, naming the offending part.
    """
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"expression: expected a non-empty string, got {text!r}")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise _fail(text, f"not valid syntax ({e.msg})") from None
    _check(tree, text)
    return tree


def _check(node: ast.AST, text: str) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise _fail(text, f"only integer literals are allowed, got {node.value!r}")
    elif isinstance(node, ast.Name):
        pass
    elif isinstance(node, ast.Attribute):
        if node.attr != "numel" or not isinstance(node.value, ast.Name):
            raise _fail(text, f"unsupported attribute {ast.unparse(node)!r}; use x.shape[i], x.stride[i] or x.numel")
    elif isinstance(node, ast.Subscript):
        _tensor_index(node, text)
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise _fail(text, f"operator {type(node.op).__name__} not supported; use + - * // %")
        _check(node.left, text)
        _check(node.right, text)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.Not)):
            raise _fail(text, f"unary {type(node.op).__name__} not supported")
        _check(node.operand, text)
    elif isinstance(node, ast.Compare):
        if len(node.ops) != 1 or type(node.ops[0]) not in _CMPOPS:
            raise _fail(text, "comparisons take one operator (== != < <= > >=); join several with 'and'")
        _check(node.left, text)
        _check(node.comparators[0], text)
    elif isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, text)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _CALLS or len(node.args) != 2 or node.keywords:
            raise _fail(text, f"unsupported call {ast.unparse(node)!r}; allowed: cdiv(a, b), min(a, b), max(a, b)")
        for a in node.args:
            _check(a, text)
    else:
        raise _fail(text, f"unsupported syntax {ast.unparse(node)!r}")


def _tensor_index(node: ast.Subscript, text: str) -> tuple[str, str, int]:
    v, sl = node.value, node.slice
    ok = isinstance(v, ast.Attribute) and v.attr in _ATTRS and isinstance(v.value, ast.Name)
    idx = None
    if isinstance(sl, ast.Constant) and isinstance(sl.value, int) and not isinstance(sl.value, bool):
        idx = sl.value
    elif isinstance(sl, ast.UnaryOp) and isinstance(sl.op, ast.USub) and isinstance(sl.operand, ast.Constant):
        idx = -sl.operand.value
    if not ok or not isinstance(idx, int):
        raise _fail(text, f"expected x.shape[<int>] or x.stride[<int>], got {ast.unparse(node)!r}")
    return v.value.id, v.attr, idx


def names(text: str) -> set[str]:
    """Argument names an expression refers to (tensors and int scalars)."""
    out: set[str] = set()
    for node in ast.walk(parse(text)):
        if isinstance(node, ast.Name) and node.id not in _CALLS:
            out.add(node.id)
    return out


def canonical(text: str) -> str:
    """The expression in normal form (stable spacing and parentheses), for manifests and diffs."""
    return ast.unparse(parse(text))


def substitute(text: str, values: Mapping[str, int]) -> str:
    """Replace bare names (e.g. Triton constexprs such as ``BLOCK``) by integer literals."""

    class _Sub(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id in values:
                v = values[node.id]
                if isinstance(v, bool) or not isinstance(v, int):
                    raise _fail(text, f"{node.id} must be an integer to appear in an expression, got {v!r}")
                return ast.copy_location(ast.Constant(v), node)
            return node

    parse(text)
    tree = _Sub().visit(ast.parse(text.strip(), mode="eval")).body
    return canonical(ast.unparse(tree))


def _floordiv(a: int, b: int, text: str) -> int:
    if b == 0:
        raise _fail(text, "division by zero")
    return a // b


def evaluate(text: str, env: Callable[[str, str, int | None], int]) -> int:
    """Evaluate an expression; ``env(name, what, index)`` resolves ``what`` in
    ``{"shape", "stride", "numel", "scalar"}`` for argument ``name``.

    Returns:
        The value as a Python int (booleans as 0 / 1).

    Raises:
        ExprError: division by zero, or a name ``env`` cannot resolve (its own error, re-raised).
    """

    def ev(n: ast.expr) -> int:
        if isinstance(n, ast.Constant):
            return int(n.value)
        if isinstance(n, ast.Name):
            return int(env(n.id, "scalar", None))
        if isinstance(n, ast.Attribute):
            return int(env(n.value.id, "numel", None))
        if isinstance(n, ast.Subscript):
            name, what, idx = _tensor_index(n, text)
            return int(env(name, what, idx))
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            op = type(n.op)
            if op is ast.Add:
                return a + b
            if op is ast.Sub:
                return a - b
            if op is ast.Mult:
                return a * b
            if op is ast.FloorDiv:
                return _floordiv(a, b, text)
            return a - b * _floordiv(a, b, text)
        if isinstance(n, ast.UnaryOp):
            v = ev(n.operand)
            return -v if isinstance(n.op, ast.USub) else int(not v)
        if isinstance(n, ast.Compare):
            a, b = ev(n.left), ev(n.comparators[0])
            return int({ast.Eq: a == b, ast.NotEq: a != b, ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b,
                        ast.GtE: a >= b}[type(n.ops[0])])
        if isinstance(n, ast.BoolOp):
            vals = [ev(v) for v in n.values]
            return int(all(vals) if isinstance(n.op, ast.And) else any(vals))
        if isinstance(n, ast.Call):
            a, b = ev(n.args[0]), ev(n.args[1])
            if n.func.id == "cdiv":
                return -_floordiv(-a, b, text)
            return min(a, b) if n.func.id == "min" else max(a, b)
        raise _fail(text, f"cannot evaluate {ast.unparse(n)!r}")

    return ev(parse(text))


def evaluate_with_shapes(text: str, shapes: Mapping[str, tuple[int, ...]], scalars: Mapping[str, int] = (),
                         strides: Mapping[str, tuple[int, ...]] | None = None) -> int:
    """Evaluate against concrete shapes (row-major contiguous strides unless ``strides`` is given).

    Raises:
        ExprError: a name that is neither a tensor in ``shapes`` nor a scalar in ``scalars``.
    """
    scalars = dict(scalars)

    def env(name: str, what: str, idx: int | None) -> int:
        if what == "scalar":
            if name not in scalars:
                raise _fail(text, f"unknown name {name!r}; known: {', '.join(sorted([*shapes, *scalars]))}")
            return scalars[name]
        if name not in shapes:
            raise _fail(text, f"unknown tensor {name!r}; known: {', '.join(sorted(shapes))}")
        shape = tuple(shapes[name])
        if what == "numel":
            return functools.reduce(lambda a, b: a * b, shape, 1)
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


def _dim(idx: int | None, rank: int, text: str, name: str) -> int:
    assert idx is not None
    d = idx + rank if idx < 0 else idx
    if not 0 <= d < rank:
        raise _fail(text, f"dimension {idx} out of range for {name!r} of rank {rank}")
    return d


def compile_program(text: str, slots: Mapping[str, Slot]) -> list[int]:
    """Compile an expression into the postfix program the C++ core runs (``csrc/expr.h``).

    Args:
        text: the expression.
        slots: argument name -> :class:`Slot`.

    Returns:
        A flat list of int64 words: opcode, then its operands (CONST: value; SHAPE/STRIDE: slot, dim;
        NUMEL/SCALAR: slot).

    Raises:
        ExprError: an unknown name, a float scalar used as an integer, or a dimension out of range.
    """
    prog: list[int] = []

    def slot(name: str, want_tensor: bool) -> Slot:
        if name not in slots:
            raise _fail(text, f"unknown name {name!r}; the op's arguments are {', '.join(slots)}")
        s = slots[name]
        if want_tensor and s.kind != "tensor":
            raise _fail(text, f"{name!r} is a {s.kind} argument, expected a tensor")
        if not want_tensor and s.kind != "int":
            raise _fail(text, f"{name!r} is a {s.kind} argument; only int scalars can appear as bare names")
        return s

    def emit(n: ast.expr) -> None:
        if isinstance(n, ast.Constant):
            prog.extend((OP_CONST, int(n.value)))
        elif isinstance(n, ast.Name):
            prog.extend((OP_SCALAR, slot(n.id, False).index))
        elif isinstance(n, ast.Attribute):
            prog.extend((OP_NUMEL, slot(n.value.id, True).index))
        elif isinstance(n, ast.Subscript):
            name, what, idx = _tensor_index(n, text)
            s = slot(name, True)
            prog.extend((_ATTRS[what], s.index, _dim(idx, s.rank, text, name)))
        elif isinstance(n, ast.BinOp):
            emit(n.left)
            emit(n.right)
            prog.append(_BINOPS[type(n.op)])
        elif isinstance(n, ast.UnaryOp):
            emit(n.operand)
            prog.append(OP_NEG if isinstance(n.op, ast.USub) else OP_NOT)
        elif isinstance(n, ast.Compare):
            emit(n.left)
            emit(n.comparators[0])
            prog.append(_CMPOPS[type(n.ops[0])])
        elif isinstance(n, ast.BoolOp):
            emit(n.values[0])
            for v in n.values[1:]:
                emit(v)
                prog.append(OP_AND if isinstance(n.op, ast.And) else OP_OR)
        elif isinstance(n, ast.Call):
            emit(n.args[0])
            emit(n.args[1])
            prog.append(_CALLS[n.func.id])
        else:  # pragma: no cover - parse() rejects everything else
            raise _fail(text, f"cannot compile {ast.unparse(n)!r}")

    emit(parse(text))
    return prog
