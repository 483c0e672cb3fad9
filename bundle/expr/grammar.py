"""The expression grammar's one parser and checker (:func:`parse`; the grammar and its limits are in the package
docstring), the constants it shares with the C++ core (opcode mnemonics, device properties, int64 range,
failure kinds) and the small helpers the evaluator and the program compiler share."""

from __future__ import annotations

import ast
import functools

from flyship.bundle import limits as _limits
from flyship.bundle.errors import ExprError

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


def _is_device(n: ast.AST) -> bool:
    return isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == DEVICE


def _dim(idx: int | None, rank: int, text: str, name: str) -> int:
    assert idx is not None
    d = idx + rank if idx < 0 else idx
    if not 0 <= d < rank:
        raise _fail(text, f"dimension {idx} out of range for {name!r} of rank {rank}")
    return d
