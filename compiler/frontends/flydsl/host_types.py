"""The types a FlyDSL launcher's host function passes, read from their printed form: a tensor's
``!fly.memref`` layout (static and dynamic shape / stride entries with their integer widths), the packed
``!llvm.struct`` of a tensor's dynamic sizes, and the kernarg field one kernel operand becomes
(:class:`FieldPlan`). Used by :mod:`.host_ir` and :mod:`.host_values`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from flyship.compiler.frontends.base import FrontendError

MEMREF_RE = re.compile(r"^!fly\.memref<([^,]+),\s*([a-z_]+),\s*(.*)>$")
INT_WIDTHS = {"i8": 1, "i16": 2, "i32": 4, "i64": 8}
SCALAR_FIELDS = {"f32": "f32", "f64": "f64", "f16": "f16", "bf16": "bf16", "i32": "i32", "i64": "i64", "i1": "i8",
                 "i8": "i8", "i16": "i16"}


@dataclasses.dataclass(frozen=True)
class LayoutEntry:
    """One shape or stride entry of a tensor layout: static value or dynamic with an integer width."""

    static: int | None
    width: str  # "i32" / "i64" for dynamic entries


@dataclasses.dataclass(frozen=True)
class TensorLayout:
    dtype: str
    shape: tuple[LayoutEntry, ...]
    stride: tuple[LayoutEntry, ...]

    @property
    def dynamic(self) -> bool:
        return any(e.static is None for e in (*self.shape, *self.stride))


@dataclasses.dataclass(frozen=True)
class FieldPlan:
    """A kernarg value: offset relative to its kernel argument, and what goes there."""

    rel_offset: int
    kind: str  # pointer / shape / stride / scalar / expr
    type: str
    arg: str | None = None
    dim: int | None = None
    expr: str | None = None
    value: float | None = None  # a float Value's constant (kind "constant")


def parse_layout(type_text: str) -> TensorLayout:
    """Parse ``!fly.memref<f32, global, (?,?):(?{i64},1)>``.

    Raises:
        FrontendError: nested (hierarchical) layouts, which flyship does not bind yet.
    """
    m = MEMREF_RE.match(type_text.strip())
    if not m:
        raise FrontendError(f"FlyDSL IR: expected a !fly.memref tensor type, got {type_text!r}")
    dtype, _space, layout = m.groups()
    if layout.count(":") != 1:
        raise FrontendError(f"FlyDSL IR: cannot read the layout of {type_text!r}")
    shape, stride = (p.strip() for p in layout.split(":"))
    # A rank-1 layout prints without parentheses (``?:1``); rank >= 2 as ``(?,?):(?{i64},1)``.
    shape = shape[1:-1] if shape.startswith("(") and shape.endswith(")") else shape
    stride = stride[1:-1] if stride.startswith("(") and stride.endswith(")") else stride
    if "(" in shape or "(" in stride:
        raise FrontendError(f"FlyDSL IR: hierarchical layout {type_text!r} is not supported; pass flat tensors")

    def entries(text: str) -> tuple[LayoutEntry, ...]:
        out = []
        for tok in filter(None, (t.strip() for t in text.split(","))):
            if tok.startswith("?"):
                w = re.search(r"\{(i\d+)\}", tok)
                out.append(LayoutEntry(None, w.group(1) if w else "i32"))
            else:
                out.append(LayoutEntry(int(tok), "i32"))
        return tuple(out)

    return TensorLayout(dtype, entries(shape), entries(stride))


def struct_members(type_text: str) -> list[Any]:
    """Parse ``!llvm.struct<packed (struct<packed (i32, i32)>, struct<packed (i64)>)>`` into nested lists."""
    s = type_text.strip()
    s = s[len("!llvm."):] if s.startswith("!llvm.") else s
    pos = 0

    def parse() -> Any:
        nonlocal pos
        if s.startswith("struct<", pos):
            pos += len("struct<")
            if s.startswith("packed ", pos):
                pos += len("packed ")
            elif not s.startswith("(", pos):
                raise FrontendError(f"FlyDSL IR: unexpected struct syntax in {type_text!r}")
            assert s[pos] == "("
            pos += 1
            items = []
            while s[pos] != ")":
                items.append(parse())
                while s[pos] in ", ":
                    pos += 1
            pos += 1  # ')'
            assert s[pos] == ">"
            pos += 1
            return items
        m = re.compile(r"[a-z0-9]+").match(s, pos)
        if not m:
            raise FrontendError(f"FlyDSL IR: cannot read struct member at {s[pos:pos + 20]!r} in {type_text!r}")
        pos = m.end()
        return m.group(0)

    return parse()
