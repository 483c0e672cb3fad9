"""The shapes ``flyship verify --emulate`` runs beyond the base case (:mod:`flyship.loader.tools.verify_emulated`):
rows and columns the guard ties together, its bounds, and the boundary shapes built from them."""

from __future__ import annotations

import re
from typing import Any, Optional

from flyship.bundle import manifest as _m
from flyship.bundle.errors import ExprError
from flyship.bundle.expr import forms as _forms
from flyship.bundle.expr.evaluate import evaluate_with_shapes

LARGE_ROWS = (513, 1025)  # more rows than 512 and 1024 (odd: a tail too), run when the guard admits them and ...
LARGE_ROWS_ELEMENTS = 1 << 17  # ... all tensors of the call hold at most this many elements (the emulator's cost)
_EQUAL_DIMS = re.compile(r"^(\w+)\.shape\[(\d+)\] == (\w+)\.shape\[(\d+)\]$")


# -- shapes ----------------------------------------------------------------------------------------

def tied(spec: _m.Specialization, start: tuple[str, int]) -> set[tuple[str, int]]:
    """The (argument, dim) pairs the guard's equality constraints (``y.shape[0] == x.shape[0]``) tie to ``start``."""
    group = {start}
    pairs = [m.groups() for c in spec.guard.constraints if (m := _EQUAL_DIMS.match(c.strip()))]
    grown = True
    while grown:
        grown = False
        for a, i, b, j in pairs:
            x, y = (a, int(i)), (b, int(j))
            if (x in group) != (y in group):
                group |= {x, y}
                grown = True
    return group


def upper_bound(spec: _m.Specialization, group: set[tuple[str, int]]) -> Optional[int]:
    """The smallest ``name.shape[d] <= N`` bound of the guard over ``group`` (None when there is none)."""
    bounds = [int(m.group(3)) for c in spec.guard.constraints
              if (m := re.match(r"^(\w+)\.shape\[(\d+)\] <= (\d+)$", c.strip())) and (m.group(1), int(m.group(2))) in group]
    return min(bounds) if bounds else None


def lower_bound(spec: _m.Specialization, group: set[tuple[str, int]]) -> Optional[int]:
    """The largest ``name.shape[d] >= N`` bound (``> N`` as N + 1) of the guard over ``group`` (None when none)."""
    bounds = [int(m.group(4)) + (m.group(3) == ">") for c in spec.guard.constraints
              if (m := re.match(r"^(\w+)\.shape\[(\d+)\] (>=|>) (\d+)$", c.strip()))
              and (m.group(1), int(m.group(2))) in group]
    return max(bounds) if bounds else None


def admits_shapes(spec: _m.Specialization, shapes: dict[str, tuple[int, ...]]) -> bool:
    """False when a guard constraint that reads only sizes (``x.shape[1] % 8 == 0``) refuses ``shapes``; a constraint
    that reads anything else (strides, scalars, the device) is left to the launch."""
    for c in spec.guard.constraints:
        try:
            if any(what not in ("shape", "numel") for _, what, _ in _forms.reads(c)):
                continue
            if not evaluate_with_shapes(c, shapes):
                return False
        except ExprError:
            continue
    return True


def fewer_columns(spec: _m.Specialization, c: int, low: Optional[int]) -> list[tuple[int, str]]:
    """Column counts below the example's ``c``, fewest (cheapest) first: the fewest the guard allows (one, or its
    ``>= N`` bound), half, and ``c - 1``; each with the words that say why."""
    fewest = (max(low, 1), "the guard's lower bound") if low is not None else (1, "one column")
    picked: dict[int, str] = {}
    for n, why in (fewest, (c // 2, "half the example's"), (c - 1, "one fewer than the example's")):
        if 1 <= n < c and (low is None or n >= low):
            picked.setdefault(n, why)
    return sorted(picked.items())


def _resize(shapes: dict[str, tuple[int, ...]], group: set[tuple[str, int]], n: int) -> dict[str, tuple[int, ...]]:
    return {k: tuple(n if (k, d) in group else s for d, s in enumerate(v)) for k, v in shapes.items()}


def shape_groups(op: _m.Op, spec: _m.Specialization, b: int) -> list[tuple[str, list[tuple[str, dict[str, tuple[int, ...]]]]]]:
    """The shapes to run beyond the smallest admitted one, cheapest first: each a (kind, alternatives) pair where the
    first alternative the guard admits runs. Rows are dim 0 of the first tensor input and every dim the guard ties to
    it; columns its last dim and theirs. With B the base case's rows (``b``, the first of :func:`base_rows` the guard
    admits): one row; B rows and fewer columns than the example's C (the fewest the guard's ``>= N`` bound allows, else
    one; C // 2; C - 1; a count its size constraints refuse is left out); B + 1 rows (a tail no
    block of rows divides); the columns + 1 (a tail no vector width divides); the largest column count a ``<= N``
    bound allows (up to 65536), one row; more than 256 rows and more than the base's grid covers
    (max(2B + 3, 259), else max(3B, 384)); 513 and 1025 rows (past the power-of-two breaks at 512 and 1024) where
    the guard admits them and the call's tensors hold at most :data:`LARGE_ROWS_ELEMENTS` elements; the example
    itself. Inputs keep the example's dim order (:func:`shaped_inputs`)."""
    shapes = {k: tuple(v) for k, v in spec.example.shapes.items()}
    first = next((a.name for a in op.args if a.kind == "tensor" and len(shapes.get(a.name, ())) >= 1), None)
    if first is None:
        return []
    rows_group = tied(spec, (first, 0))
    base = _resize(shapes, rows_group, b)
    groups: list[tuple[str, list[tuple[str, dict[str, tuple[int, ...]]]]]] = [
        ("one row", [("1 row", _resize(shapes, rows_group, 1))]),
        ("a row tail", [(f"{b + 1} rows", _resize(base, rows_group, b + 1))]),
    ]
    rank = len(shapes[first])
    if rank >= 2:
        cols_group = tied(spec, (first, rank - 1))
        if not cols_group & rows_group:
            c = shapes[first][-1]
            low = lower_bound(spec, cols_group)
            fewer = [(n, why, _resize(base, cols_group, n)) for n, why in fewer_columns(spec, c, low)]
            groups[1:1] = [("fewer columns", [(f"{b} rows x {n} column{'s' * (n != 1)} ({why})", new)])
                           for n, why, new in fewer if admits_shapes(spec, new)]  # a count the sizes refuse: not tried
            groups.append(("a column tail", [(f"{b} rows x {c + 1} columns", _resize(base, cols_group, c + 1))]))
            top = upper_bound(spec, cols_group)
            if top is not None and c < top <= 65536:
                groups.append(("the largest columns", [(f"1 row x {top} columns (the guard's bound)",
                                                        _resize(_resize(shapes, rows_group, 1), cols_group, top))]))
    big = [max(2 * b + 3, 259), max(3 * b, 384)]
    groups.append(("past the base's grid", [(f"{n} rows", _resize(shapes, rows_group, n)) for n in big]))
    top_rows = upper_bound(spec, rows_group)
    for n in LARGE_ROWS:  # the next power-of-two breaks (a wrap or a fixed grid at 512 or 1024 rows), where affordable
        elements = _numel(_resize(shapes, rows_group, n).values())
        if n > big[0] and (top_rows is None or n <= top_rows) and elements <= LARGE_ROWS_ELEMENTS:
            groups.append((f"past {n - 1} rows", [(f"{n} rows", _resize(shapes, rows_group, n))]))
    if shapes != base:
        groups.append(("the example", [("the example's shape", shapes)]))
    return groups


def _numel(shapes: Any) -> int:
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= int(d)
        total += n
    return total


def base_rows(op: _m.Op, spec: _m.Specialization) -> list[int]:
    """Row counts to try for the base case (layouts and outputs checked there), smallest first: 8 to 256 below the
    example's rows, then the example's (the emulator's cost grows with the rows)."""
    shapes = spec.example.shapes
    first = next((a.name for a in op.args if a.kind == "tensor" and len(shapes.get(a.name, ())) >= 1), None)
    if first is None:
        return [0]
    rows = int(shapes[first][0])
    return [n for n in (8, 16, 32, 64, 128, 256) if n < rows] + [rows]
