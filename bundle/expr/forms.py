"""Questions about an expression and rewrites of it, answered on its parsed tree: does it read the device, is it
non-negative or constant, what does it read, its canonical text, and the same expression with values or tensor
shapes substituted (used by the compile stage and the rule book)."""

from __future__ import annotations

import ast
from typing import Mapping, Optional, Sequence

from flyship.bundle.expr.evaluate import evaluate_with_shapes
from flyship.bundle.expr.grammar import _CMPOPS, _fail, _is_device, _tensor_index, parse

def names_device(text: str) -> bool:
    """Whether an expression reads a device property (``device.cu_count``)."""
    return any(_is_device(n) for n in ast.walk(parse(text)))


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
