"""The torch side of an op: its schema strings and its fake (meta) kernel.

The schema follows from the manifest's ``args`` and ``outputs`` (docs/bundle-format.md)::

    add(Tensor x, Tensor y) -> Tensor
    add.out(Tensor x, Tensor y, *, Tensor(a!) out) -> ()
    addsub.out(Tensor x, Tensor y, *, Tensor(a!) sum, Tensor(b!) diff) -> ()

The fake kernel computes output shapes with the same postfix programs the C++ core runs, evaluated on
Python ints or SymInts, so torch.compile traces the op with dynamic shapes without a graph break.
"""

from __future__ import annotations

import string
from typing import Any, Callable

from flyship.bundle import expr as _expr
from flyship.bundle import manifest as _m
from flyship.bundle.errors import BundleError

_TYPES = {"tensor": "Tensor", "int": "int", "float": "float", "bool": "bool"}


def _default(a: _m.Arg) -> str:
    if a.kind == "bool":
        return "True" if a.default else "False"
    if a.kind == "int":
        return str(int(a.default))
    return repr(float(a.default))


def out_names(op: _m.Op) -> list[str]:
    """Keyword names of the out tensors: ``out`` for one output (torch's convention), else the outputs' names.

    Raises:
        BundleError: an out name collides with an input name.
    """
    names = ["out"] if len(op.outputs) == 1 else [o.name for o in op.outputs]
    clash = set(names) & {a.name for a in op.args}
    if clash:
        raise BundleError(f"op {op.name}: input names {sorted(clash)} collide with the out= argument names of the "
                          "out variant; rename the inputs")
    return names


def schemas(op: _m.Op) -> tuple[str, str]:
    """The functional schema and the ``.out`` schema of an op (without namespace).

    Raises:
        BundleError: an op without outputs, or too many of them for alias letters.
    """
    if not op.outputs:
        raise BundleError(f"op {op.name}: expected at least one output, got none")
    if len(op.outputs) > len(string.ascii_lowercase):
        raise BundleError(f"op {op.name}: too many outputs ({len(op.outputs)})")
    params = []
    for a in op.args:
        p = f"{_TYPES[a.kind]} {a.name}"
        if a.kind != "tensor" and a.default is not None:
            p += "=" + _default(a)
        params.append(p)
    n = len(op.outputs)
    ret = "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
    functional = f"{op.name}({', '.join(params)}) -> {ret}"
    letters = string.ascii_lowercase[:n]
    outs = [f"Tensor({letter}!) {name}" for letter, name in zip(letters, out_names(op))]
    # The out variant returns nothing: torch.compile functionalizes a custom op that mutates its
    # arguments only if its outputs carry no alias annotation (a `-> Tensor(a!)` return is refused).
    out = f"{op.name}.out({', '.join(params + ['*'] + outs)}) -> ()"
    return functional, out


def _run(code: list[int], shape: Callable, stride: Callable, numel: Callable, scalar: Callable) -> Any:
    """Evaluate a postfix program on Python ints or SymInts (mirrors csrc/expr.h)."""
    import torch

    st: list[Any] = []
    i = 0
    binops: dict[int, Callable[[Any, Any], Any]] = {
        _expr.OP_ADD: lambda a, b: a + b,
        _expr.OP_SUB: lambda a, b: a - b,
        _expr.OP_MUL: lambda a, b: a * b,
        _expr.OP_FLOORDIV: lambda a, b: a // b,
        _expr.OP_MOD: lambda a, b: a % b,
        _expr.OP_CDIV: lambda a, b: -((-a) // b),
        _expr.OP_MIN: torch.sym_min,
        _expr.OP_MAX: torch.sym_max,
        _expr.OP_EQ: lambda a, b: int(a == b),
        _expr.OP_NE: lambda a, b: int(a != b),
        _expr.OP_LT: lambda a, b: int(a < b),
        _expr.OP_LE: lambda a, b: int(a <= b),
        _expr.OP_GT: lambda a, b: int(a > b),
        _expr.OP_GE: lambda a, b: int(a >= b),
        _expr.OP_AND: lambda a, b: int(bool(a) and bool(b)),
        _expr.OP_OR: lambda a, b: int(bool(a) or bool(b)),
    }
    while i < len(code):
        op = code[i]
        if op == _expr.OP_CONST:
            st.append(code[i + 1])
            i += 2
        elif op in (_expr.OP_SHAPE, _expr.OP_STRIDE):
            st.append((shape if op == _expr.OP_SHAPE else stride)(code[i + 1], code[i + 2]))
            i += 3
        elif op == _expr.OP_NUMEL:
            st.append(numel(code[i + 1]))
            i += 2
        elif op == _expr.OP_SCALAR:
            st.append(scalar(code[i + 1]))
            i += 2
        elif op == _expr.OP_NEG:
            st[-1] = -st[-1]
            i += 1
        elif op == _expr.OP_NOT:
            st[-1] = int(not st[-1])
            i += 1
        else:
            b = st.pop()
            st[-1] = binops[op](st[-1], b)
            i += 1
    return st[0]


def make_fake(op: _m.Op, is_out: bool, qualname: str) -> Callable[..., Any]:
    """The fake kernel of the functional op (fresh outputs) or of its ``.out`` variant (checks the out tensors,
    returns nothing).

    It checks what the C++ core checks without data: argument ranks, and out tensors' shapes and dtypes.
    """
    import torch

    slots = _m.slots(op)
    inputs_only = {k: s for k, s in slots.items() if s.index < len(op.args)}
    shape_programs = [[_expr.compile_program(e, inputs_only) for e in o.shape] for o in op.outputs]
    arg_names = [a.name for a in op.args]
    defaults = {a.name: a.default for a in op.args if a.default is not None}
    outs = out_names(op)

    def fake(*args: Any, **kwargs: Any) -> Any:
        values = dict(defaults)
        values.update(zip(arg_names, args))
        values.update({k: v for k, v in kwargs.items() if k in arg_names})
        by_slot = [values[n] for n in arg_names]
        first = None
        for a, v in zip(op.args, by_slot):
            if a.kind == "tensor":
                if v.dim() != a.rank:
                    raise RuntimeError(f"flyship {qualname}: expected '{a.name}' of rank {a.rank}, got rank {v.dim()} "
                                       f"(shape {list(v.shape)})")
                first = first if first is not None else v
        results = []
        for o, progs in zip(op.outputs, shape_programs):
            shape = [_run(p, lambda s, d: by_slot[s].shape[d], lambda s, d: by_slot[s].stride(d),
                          lambda s: by_slot[s].numel(), lambda s: by_slot[s]) for p in progs]
            dtype = by_slot[slots[o.dtype].index].dtype if o.dtype in inputs_only else getattr(torch, o.dtype)
            results.append((shape, dtype))
        if is_out:
            got = [kwargs[n] for n in outs]
            for name, t, (shape, dtype) in zip(outs, got, results):
                if list(t.shape) != list(shape) or t.dtype != dtype:
                    raise RuntimeError(f"flyship {qualname}: expected out tensor '{name}' of shape {list(shape)} and "
                                       f"dtype {dtype}, got shape {list(t.shape)} and dtype {t.dtype}")
            return None
        made = [first.new_empty(shape, dtype=dtype) for shape, dtype in results]
        return made[0] if len(made) == 1 else tuple(made)

    fake.__name__ = f"{op.name}_{'out_' if is_out else ''}fake"
    return fake
