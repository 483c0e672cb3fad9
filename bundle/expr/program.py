"""An expression compiled into the postfix program the C++ core evaluates per call (``csrc/expr.h``), with the
argument slots its operands name."""

from __future__ import annotations

import ast
from typing import Mapping

from flyship.bundle.expr.grammar import (_ATTRS, _BINOPS, _CALLS, _CMPOPS, DEVICE_PROPERTIES, _dim, _fail,
                                         _is_device, _tensor_index, parse)
from flyship.bundle.frozen import frozen

@frozen
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


def compile_program(text: str, slots: Mapping[str, Slot]) -> list[str | int]:
    """Compile an expression into the postfix program the C++ core runs (``csrc/expr.h``).

    Args:
        text: the expression.
        slots: argument name -> :class:`Slot`.

    Returns:
        A flat list of words: an opcode mnemonic (:data:`OPCODES`), then its int operands (const: value;
        shape/stride: slot, dim; numel/scalar: slot; device: the property's index in :data:`DEVICE_PROPERTIES`).

    Raises:
        ExprError: an unknown name, a float scalar used as an integer, or a dimension out of range.
    """
    prog: list[str | int] = []

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
            prog.extend(("const", int(n.value)))
        elif _is_device(n):
            prog.extend(("device", DEVICE_PROPERTIES.index(n.attr)))
        elif isinstance(n, ast.Name):
            prog.extend(("scalar", slot(n.id, False).index))
        elif isinstance(n, ast.Attribute):
            prog.extend(("numel", slot(n.value.id, True).index))
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
            prog.append("neg" if isinstance(n.op, ast.USub) else "not")
        elif isinstance(n, ast.Compare):
            emit(n.left)
            emit(n.comparators[0])
            prog.append(_CMPOPS[type(n.ops[0])])
        elif isinstance(n, ast.BoolOp):
            emit(n.values[0])
            for v in n.values[1:]:
                emit(v)
                prog.append("and" if isinstance(n.op, ast.And) else "or")
        elif isinstance(n, ast.Call):
            emit(n.args[0])
            emit(n.args[1])
            prog.append(_CALLS[n.func.id])
        else:  # pragma: no cover - parse() rejects everything else
            raise _fail(text, f"cannot compile {ast.unparse(n)!r}")

    emit(parse(text))
    return prog
