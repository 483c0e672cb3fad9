"""Integer expressions over an op's arguments: launch grids, output shapes, kernarg values, guards.

The manifest stores every quantity that depends on a call's inputs as a small expression in a
Python subset, e.g. ``cdiv(x.shape[0], 128)`` or ``x.shape[1] % 8 == 0``. Grammar:

* integer literals, and the names of ``int`` scalar arguments;
* ``device.cu_count``: the number of compute units (AMD CUs, NVIDIA SMs) of the device the call runs on,
  read once per device by the loader (grids and guards only: an output's shape never depends on the device);
* ``<tensor>.shape[i]``, ``<tensor>.stride[i]`` (in elements, as torch reports them) and
  ``<tensor>.numel``; ``i`` is an integer literal, negative counts from the end;
* ``+ - * // %`` (``//`` and ``%`` with Python's floor semantics), unary ``-``;
  ``cdiv(a, b)``, ``min(a, b)``, ``max(a, b)``;
* comparisons ``== != < <= > >=`` (one operator each), ``and``, ``or``, ``not``; booleans are 0 / 1.

Semantics, the same in this module's evaluator and the C++ core's (``csrc/expr.h``; a differential test
runs both): signed 64-bit integers; every operation gives its mathematical result and a result outside
int64 is an error (an :class:`ExprError` of ``kind`` :data:`OVERFLOW`), never a silent wrap; ``//`` and ``%``
floor, ``cdiv`` is the ceiling; a zero divisor is an error (``kind`` :data:`DIVISION`); every operand is
evaluated (``and``/``or`` do not short-circuit), so the first error in postfix order is the one reported.

Limits, enforced by :func:`parse` so that an expression the compile stage accepts never fails at load:
``MAX_EXPR_CHARS`` characters, literals within int64, and a postfix program of at most
``MAX_PROGRAM_WORDS`` words needing at most ``MAX_PROGRAM_DEPTH`` stack entries.

The loader compiles each expression into a postfix program (:func:`compile_program`) that the C++ core
evaluates per call; opcodes travel by mnemonic (``"shape"``, ``"cdiv"``), which the core maps once.
"""

from __future__ import annotations

import ast
import functools
from typing import Any, Callable, Mapping, Optional, Sequence

from flyship.bundle import limits as _limits
from flyship.bundle.errors import ExprError
from flyship.bundle.frozen import frozen

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_EXPR_CHARS = 1000
# The C++ core refuses longer or deeper programs: one table for both (bundle/limits.py -> csrc/limits.h).
MAX_PROGRAM_WORDS = _limits.MAX_PROGRAM_WORDS
MAX_PROGRAM_DEPTH = _limits.MAX_PROGRAM_DEPTH

# Opcode mnemonics of the postfix program; the C++ core maps them to its codes (csrc/expr.h kOpcodeNames).
_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "floordiv", ast.Mod: "mod"}
_CMPOPS = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}
_CALLS = {"cdiv": "cdiv", "min": "min", "max": "max"}
_ATTRS = {"shape": "shape", "stride": "stride"}
# Device properties an expression may name as ``device.<name>``; the program's operand is the index here
# (csrc/expr.h kDevicePropertyNames).
DEVICE = "device"
DEVICE_PROPERTIES = ("cu_count",)
OPCODES = ("const", "shape", "stride", "numel", "scalar", *_BINOPS.values(), "cdiv", "min", "max", "neg",
           *_CMPOPS.values(), "and", "or", "not", "device")


# The two ways an evaluation fails for given inputs, told apart by ``ExprError.kind`` (the C++ core's words match:
# tests/loader/test_expr_differential.py).
OVERFLOW = "ExprOverflowError"  # a value (or an intermediate one) leaves int64 for these inputs
DIVISION = "ExprDivisionError"  # a division by zero for these inputs


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
    if len(text) > MAX_EXPR_CHARS:
        raise ExprError(f"expression {text[:60]!r}...: {len(text)} characters, expected at most {MAX_EXPR_CHARS}; "
                        "split the rule or simplify it")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:  # ValueError: a NUL, a lone surrogate
        raise _fail(text, f"not valid syntax ({getattr(e, 'msg', type(e).__name__)})") from None
    _check(tree, text)
    words, depth = _program_size(tree)
    if words > MAX_PROGRAM_WORDS or depth > MAX_PROGRAM_DEPTH:
        raise _fail(text, f"compiles to {words} words needing {depth} stack entries; expected at most "
                          f"{MAX_PROGRAM_WORDS} words and {MAX_PROGRAM_DEPTH} entries (the C++ core's limits); "
                          "simplify it")
    return tree


def _program_size(n: ast.expr) -> tuple[int, int]:
    """(words, stack depth) of the postfix program :func:`compile_program` emits for a checked tree."""
    if isinstance(n, ast.Subscript):
        return 3, 1
    if isinstance(n, (ast.Constant, ast.Name, ast.Attribute)):
        return 2, 1
    if isinstance(n, ast.UnaryOp):
        w, d = _program_size(n.operand)
        return w + 1, d
    if isinstance(n, ast.BoolOp):
        operands = n.values
    elif isinstance(n, ast.BinOp):
        operands = [n.left, n.right]
    elif isinstance(n, ast.Compare):
        operands = [n.left, n.comparators[0]]
    else:  # ast.Call
        operands = list(n.args)
    w, d = _program_size(operands[0])
    for v in operands[1:]:  # the value so far stays on the stack while the next operand is computed
        vw, vd = _program_size(v)
        w, d = w + vw + 1, max(d, 1 + vd)
    return w, d


def _check(node: ast.AST, text: str) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise _fail(text, f"only integer literals are allowed, got {node.value!r}")
        if not INT64_MIN <= node.value <= INT64_MAX:
            raise _fail(text, f"literal {node.value} does not fit int64")
    elif isinstance(node, ast.Name):
        pass
    elif isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == DEVICE:
            if node.attr not in DEVICE_PROPERTIES:
                raise _fail(text, f"unknown device property {node.attr!r}; known: "
                                  f"{', '.join(f'device.{p}' for p in DEVICE_PROPERTIES)}")
        elif node.attr != "numel" or not isinstance(node.value, ast.Name):
            raise _fail(text, f"unsupported attribute {ast.unparse(node)!r}; use x.shape[i], x.stride[i], x.numel "
                              "or device.cu_count")
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
    negate = isinstance(sl, ast.UnaryOp) and isinstance(sl.op, ast.USub)
    lit = sl.operand if negate else sl
    # Only an int literal (never a bool, a float or a string: ``-'a'`` would be Python's TypeError, ``-True`` -1).
    if isinstance(lit, ast.Constant) and type(lit.value) is int:
        idx = -lit.value if negate else lit.value
    if not ok or not isinstance(idx, int):
        raise _fail(text, f"expected x.shape[<int>] or x.stride[<int>], got {ast.unparse(node)!r}")
    return v.value.id, v.attr, idx


def names_device(text: str) -> bool:
    """Whether an expression reads a device property (``device.cu_count``)."""
    return any(_is_device(n) for n in ast.walk(parse(text)))


def _is_device(n: ast.AST) -> bool:
    return isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == DEVICE


def nonnegative(text: str) -> bool:
    """Whether an expression is non-negative for every input: sizes, strides and numel combined with
    ``+ * // %``, ``cdiv``, ``min``, ``max`` and non-negative literals (torch strides are never negative).
    Where it holds, truncating and unsigned division (C, LLVM ``sdiv`` / ``udiv``) equal the language's floor."""

    def ok(n: ast.AST) -> bool:
        if isinstance(n, ast.Constant):
            return n.value >= 0
        if isinstance(n, (ast.Subscript, ast.Attribute)):
            return True  # a size, a stride, numel or device.cu_count
        if isinstance(n, ast.BinOp):
            return isinstance(n.op, (ast.Add, ast.Mult, ast.FloorDiv, ast.Mod)) and ok(n.left) and ok(n.right)
        if isinstance(n, ast.Call):
            return all(ok(a) for a in n.args)
        return False

    return ok(parse(text))


def is_constant(text: str) -> bool:
    """Whether an expression reads nothing of the call (literals and operators only)."""
    return not any(isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)) for n in ast.walk(parse(text)))


def trunc_div(a: str, b: str) -> tuple[str, tuple[str, ...]]:
    """``a / b`` rounded toward zero (C, LLVM ``sdiv``: FlyDSL's ``arith.divsi``) in this language's floor
    arithmetic, and the guard constraints it needs: the language's ``//`` floors, which differs for a negative
    ``a`` (``(n - 1) // 8`` at n = 0: -1 floored, 0 truncated). For ``b > 0``: ``max(a, 0) // b - max(-a, 0) // b``;
    a ``b`` that is not a positive literal gets the constraint ``b >= 1``. A non-negative ``a`` keeps ``a // b``.

    Example:
        >>> trunc_div("x.shape[0] - 1", "8")
        ('max(x.shape[0] - 1, 0) // 8 - max(-(x.shape[0] - 1), 0) // 8', ())
    """
    guard = () if is_constant(b) and evaluate_with_shapes(b, {}) >= 1 else (canonical(f"{b} >= 1"),)
    if nonnegative(a):
        return canonical(f"({a}) // ({b})"), guard
    return canonical(f"max({a}, 0) // ({b}) - max(-({a}), 0) // ({b})"), guard


# ---------------------------------------------------------------------------------------------
# Queries: what an expression reads and how it is built, for code that must not parse the grammar itself.
# Each raises ExprError for text outside the grammar.


def int_literal(text: str) -> Optional[int]:
    """The value of an expression that is one integer literal (``"1"``, ``"-3"``), else None.
    """
    node = parse(text)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value
    return node.value if isinstance(node, ast.Constant) else None


def reads(text: str) -> tuple[tuple[str, str, Optional[int]], ...]:
    """What an expression reads of the call, in reading order, each once: ``(tensor, "shape" | "stride", index)``
    for ``x.shape[i]`` / ``x.stride[i]`` (the index as written: negative counts from the end), ``(tensor, "numel",
    None)``, ``("device", property, None)`` and ``(scalar, "scalar", None)`` for a bare name.

    Example:
        >>> reads("cdiv(x.numel, 4) * y.shape[-1] + n")
        (('x', 'numel', None), ('y', 'shape', -1), ('n', 'scalar', None))
    """
    out: list[tuple[str, str, Optional[int]]] = []

    def visit(n: ast.AST) -> None:
        if isinstance(n, ast.Subscript):
            out.append(_tensor_index(n, text))
        elif isinstance(n, ast.Attribute):
            out.append((n.value.id, n.attr, None))  # x.numel or device.<property>: parse() allows no other
        elif isinstance(n, ast.Name):
            out.append((n.id, "scalar", None))
        elif isinstance(n, ast.Call):
            for a in n.args:  # the callee (cdiv, min, max) is not a read
                visit(a)
        else:
            for child in ast.iter_child_nodes(n):
                visit(child)

    visit(parse(text))
    return tuple(dict.fromkeys(out))


def dimension(text: str) -> Optional[tuple[str, str, int]]:
    """``(tensor, "shape" | "stride", index)`` of an expression that is exactly one size or stride
    (``x.shape[1]``), else None.
    """
    node = parse(text)
    return _tensor_index(node, text) if isinstance(node, ast.Subscript) else None


def comparison(text: str) -> Optional[tuple[str, str, str]]:
    """``(operator, left, right)`` of an expression that is one comparison, the operator by its mnemonic
    (``"eq"``, ``"le"``...) and both sides in :func:`canonical` form, else None.

    Example:
        >>> comparison("x.shape[0]==8")
        ('eq', 'x.shape[0]', '8')
    """
    node = parse(text)
    if not isinstance(node, ast.Compare):
        return None
    return _CMPOPS[type(node.ops[0])], ast.unparse(node.left), ast.unparse(node.comparators[0])


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


def pinned(constraints: Sequence[str]) -> dict[tuple[str, str, Optional[int]], int]:
    """What a guard pins to one value: each size, stride or element count that a constraint equates with an
    expression reading nothing of the call (``x.stride[1] == 1``, ``4096 == x.shape[-1]``), keyed like
    :func:`reads` (the index as written), with its value.

    Example:
        >>> pinned(["x.stride[1] == 1", "x.shape[0] <= 8", "2 * 4 == y.numel"])
        {('x', 'stride', 1): 1, ('y', 'numel', None): 8}
    """
    out: dict[tuple[str, str, Optional[int]], int] = {}
    for c in constraints:
        cmp = comparison(c)
        if cmp is None or cmp[0] != "eq":
            continue
        for read, value in ((cmp[1], cmp[2]), (cmp[2], cmp[1])):
            node = parse(read)
            if isinstance(node, ast.Subscript):
                key: Optional[tuple[str, str, Optional[int]]] = _tensor_index(node, read)
            elif isinstance(node, ast.Attribute) and node.attr == "numel":
                key = (node.value.id, "numel", None)
            else:
                key = None
            if key is not None and is_constant(value):
                out[key] = evaluate_with_shapes(value, {})
    return out


def substitute_tensors(text: str, shapes: Mapping[str, Sequence[str]]) -> str:
    """Write in the shape rule of each tensor named in ``shapes`` (a workspace's, whose allocation is contiguous):
    ``w.shape[d]`` becomes its d-th expression, ``w.stride[d]`` the product of the later ones (1 for the last) and
    ``w.numel`` the product of all, so the result reads only the other names. Returns :func:`canonical` text.

    Example:
        >>> substitute_tensors("cdiv(ws.numel, ws.stride[0])", {"ws": ("x.shape[0]", "4")})
        'cdiv(x.shape[0] * 4, 4)'
    """
    rules = {k: [parse(e) for e in v] for k, v in shapes.items()}

    def product(nodes: list[ast.expr]) -> ast.expr:
        out: ast.expr = nodes[0] if nodes else ast.Constant(1)
        for n in nodes[1:]:
            out = ast.BinOp(out, ast.Mult(), n)
        return out

    class _Tensors(ast.NodeTransformer):
        def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
            name, what, idx = _tensor_index(node, text)
            if name not in rules:
                return node
            d = idx % len(rules[name])
            return rules[name][d] if what == "shape" else product(rules[name][d + 1:])

        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            if node.attr == "numel" and isinstance(node.value, ast.Name) and node.value.id in rules:
                return product(rules[node.value.id])
            return node

    parse(text)
    tree = _Tensors().visit(ast.parse(text.strip(), mode="eval")).body
    return canonical(ast.unparse(tree))


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


def _dim(idx: int | None, rank: int, text: str, name: str) -> int:
    assert idx is not None
    d = idx + rank if idx < 0 else idx
    if not 0 <= d < rank:
        raise _fail(text, f"dimension {idx} out of range for {name!r} of rank {rank}")
    return d


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
