"""The expression grammar has one reader, :mod:`flyship.bundle.expr`: code that asks what an expression reads, pins
or becomes asks these queries instead of parsing the text itself. Bundle tier: stdlib only."""

from __future__ import annotations

import doctest

import pytest

from flyship.bundle import expr as E
from flyship.bundle.errors import ExprError

pytestmark = pytest.mark.cpu


def test_the_documented_examples_of_the_queries_hold():
    assert doctest.testmod(E).failed == 0


def test_reads_names_each_size_stride_count_device_property_and_scalar_once_in_order():
    assert E.reads("max(x.shape[-1], n) + x.shape[-1] * device.cu_count - y.stride[0] + cdiv(z.numel, n)") == (
        ("x", "shape", -1), ("n", "scalar", None), ("device", "cu_count", None), ("y", "stride", 0),
        ("z", "numel", None))
    assert E.reads("4 + 1") == ()


def test_dimension_and_comparison_answer_only_for_exactly_that_shape():
    assert E.dimension("x.stride[ 1 ]") == ("x", "stride", 1)
    assert E.dimension("x.shape[0] + 0") is None and E.dimension("x.numel") is None
    assert E.comparison("x.shape[0]+1 <= 2147483647") == ("le", "x.shape[0] + 1", "2147483647")
    assert E.comparison("a == 1 and b == 2") is None


def test_int_literal_is_the_value_of_a_bare_literal_only():
    assert [E.int_literal(t) for t in ("7", " -3 ", "1 + 1", "n")] == [7, -3, None, None]


def test_pinned_reads_the_constants_a_guard_fixes_from_either_side():
    assert E.pinned(["x.stride[0] == 1", "8 * 2 == x.shape[1]", "x.shape[0] <= 4", "y.numel == n", "a == 1 or b"]) \
        == {("x", "stride", 0): 1, ("x", "shape", 1): 16}


def test_substitute_tensors_writes_in_a_contiguous_tensors_shape_rule():
    ws = {"ws": ("x.shape[0]", "cdiv(y.numel, 4)")}
    assert E.substitute_tensors("ws.stride[0] + ws.shape[-1] - ws.numel + x.stride[0]", ws) == (
        "cdiv(y.numel, 4) + cdiv(y.numel, 4) - x.shape[0] * cdiv(y.numel, 4) + x.stride[0]")
    assert E.substitute_tensors("ws.stride[1]", ws) == "1"


def test_a_query_on_text_outside_the_grammar_raises_an_expr_error():
    for query in (E.reads, E.dimension, E.comparison, E.int_literal):
        with pytest.raises(ExprError):
            query("x.shape[")
