"""One expression semantics: Python's evaluator (flyship.bundle.expr) and the C++ core's (csrc/expr.h) give
equal results or equal refusals (division by zero, int64 overflow) on thousands of random expressions over
edge values; and the tables the plan's names map through are the bundle's own."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flyship.bundle import expr
from flyship.bundle import manifest as _m
from flyship.bundle.errors import ExprError
from flyship.loader.plan import lower_program

pytestmark = pytest.mark.cpu

INT64_MIN, INT64_MAX = expr.INT64_MIN, expr.INT64_MAX
EDGES = [0, 1, -1, 2, -2, 3, 7, 255, 2**31 - 1, 2**31, 2**32, 2**62, INT64_MAX, -INT64_MAX, INT64_MIN]
SIZES = [0, 1, 2, 3, 1000, 2**31, 2**32, 2**62, INT64_MAX]
# x: a rank-2 tensor, y: a rank-1 tensor, n and m: int scalars; device.cu_count is the device's CU count.
SLOTS = {"x": expr.Slot(0, "tensor", 2), "y": expr.Slot(1, "tensor", 1), "n": expr.Slot(2, "int"),
         "m": expr.Slot(3, "int")}


def literal(v: int) -> str:
    return "(-9223372036854775807 - 1)" if v == INT64_MIN else f"({v})"


leaves = st.one_of(
    st.sampled_from(EDGES).map(literal),
    st.integers(INT64_MIN + 1, INT64_MAX).map(literal),
    st.sampled_from(["x.shape[0]", "x.shape[-1]", "x.stride[0]", "x.stride[1]", "x.numel", "y.shape[0]",
                     "y.stride[0]", "y.numel", "n", "m", "device.cu_count"]),
)


def combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(st.sampled_from(["+", "-", "*", "//", "%", "==", "!=", "<", "<=", ">", ">=", "and", "or"]),
                       children, children).map(lambda t: f"({t[1]} {t[0]} {t[2]})")
    calls = st.tuples(st.sampled_from(["cdiv", "min", "max"]), children, children).map(
        lambda t: f"{t[0]}({t[1]}, {t[2]})")
    unary = st.tuples(st.sampled_from(["-", "not "]), children).map(lambda t: f"({t[0]}{t[1]})")
    return st.one_of(binary, calls, unary)


expressions = st.recursive(leaves, combine, max_leaves=10)


@st.composite
def environments(draw):
    def shape(rank: int) -> tuple[int, ...]:
        while True:
            s = tuple(draw(st.sampled_from(SIZES)) for _ in range(rank))
            n = 1
            for d in s:
                n *= d
            if n <= INT64_MAX:  # a tensor's element count is an int64
                return s

    shapes = {"x": shape(2), "y": shape(1)}
    strides = {k: tuple(draw(st.sampled_from(SIZES)) for _ in v) for k, v in shapes.items()}
    scalars = {"n": draw(st.sampled_from(EDGES)), "m": draw(st.integers(INT64_MIN, INT64_MAX))}
    cu_count = draw(st.sampled_from([80, 228, 304, 1, INT64_MAX]))
    return shapes, strides, scalars, cu_count


def python_side(text: str, shapes, strides, scalars, cu_count=304) -> tuple[str, int | None]:
    try:
        return "ok", expr.evaluate_with_shapes(text, shapes, scalars, strides, device={"cu_count": cu_count})
    except ExprError as e:  # the two failures of an evaluation, told apart by kind
        return {expr.DIVISION: "divides by zero", expr.OVERFLOW: "overflows int64"}[e.kind], None


def cpp_side(ext, text: str, shapes, strides, scalars, cu_count=304) -> tuple[str, int | None]:
    return tuple(ext.evaluate_program(lower_program(text, SLOTS), [list(shapes["x"]), list(shapes["y"]), [], []],
                                      [list(strides["x"]), list(strides["y"]), [], []],
                                      [0, 0, scalars["n"], scalars["m"]], cu_count))


@settings(max_examples=4000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=expressions, env=environments())
def test_python_and_cpp_evaluate_random_expressions_alike(record_ext, text, env):
    try:
        expr.parse(text)
    except ExprError:
        return  # beyond the limits: refused where expressions are compiled, never reaches the core
    assert cpp_side(record_ext, text, *env) == python_side(text, *env), text


@pytest.mark.parametrize("text, want", [
    ("x.numel * 4611686018427387904 // 2", ("overflows int64", None)),  # wrapped to a small number before
    ("(-9223372036854775807 - 1) // -1", ("overflows int64", None)),
    ("(-9223372036854775807 - 1) % -1", ("ok", 0)),
    ("cdiv(-9223372036854775807 - 1, -1)", ("overflows int64", None)),
    ("cdiv(-9223372036854775807 - 1, 2)", ("ok", -(2**62))),
    ("-(-9223372036854775807 - 1)", ("overflows int64", None)),
    ("9223372036854775807 + 1 - 1", ("overflows int64", None)),
    ("x.shape[0] // 0 + 9223372036854775807 * 2", ("divides by zero", None)),  # the first error in postfix order
    ("0 and 1 // 0", ("divides by zero", None)),  # no short circuit in either
    ("-7 // 2 + -7 % 3 + cdiv(-7, 2)", ("ok", -4 + 2 - 3)),
    ("min(x.shape[0] * 100, device.cu_count * 4)", ("ok", 300)),  # a persistent grid: rows or CUs x occupancy
    ("device.cu_count == 304", ("ok", 1)),  # a CU count the kernel baked in, as a guard
    ("device.cu_count * 9223372036854775807", ("overflows int64", None)),
])
def test_edge_cases_agree_and_match_the_documented_semantics(record_ext, text, want):
    env = ({"x": (3, 4), "y": (5,)}, {"x": (4, 1), "y": (1,)}, {"n": 0, "m": 0})
    assert python_side(text, *env) == want
    assert cpp_side(record_ext, text, *env) == want


def test_the_plan_tables_are_the_bundles_own(record_ext):
    t = record_ext.PLAN_TABLES
    assert tuple(t["opcodes"]) == expr.OPCODES
    assert tuple(t["field_kinds"]) == _m.FIELD_KINDS
    assert dict(t["field_types"]) == _m.FIELD_TYPES
    assert tuple(t["arg_kinds"]) == ("tensor", *_m.SCALAR_TYPES)
    assert (t["max_program_depth"], t["max_program_words"]) == (expr.MAX_PROGRAM_DEPTH, expr.MAX_PROGRAM_WORDS)


def test_expressions_beyond_the_limits_are_refused_where_they_are_compiled():
    wide = "n"
    for _ in range(7):  # a balanced sum of 128 leaves: 383 words, nested 8 levels (a flat chain nests past the limit)
        wide = f"({wide} + {wide})"
    with pytest.raises(ExprError, match="at most 256 words"):
        expr.parse(wide)
    deep = "1"
    for _ in range(40):
        deep = f"(1 + {deep})"  # each level keeps one more value on the stack
    with pytest.raises(ExprError, match="32 entries"):
        expr.parse(deep)
    with pytest.raises(ExprError, match="characters, expected at most 1000"):
        expr.parse("1 + " * 300 + "1")
    with pytest.raises(ExprError, match="does not fit int64"):
        expr.parse("9223372036854775808")


def test_device_properties_are_refused_where_no_device_is_known():
    with pytest.raises(ExprError, match="unknown device property 'sm_count'"):
        expr.parse("device.sm_count")
    with pytest.raises(ExprError, match="device.cu_count needs a device"):
        expr.evaluate_with_shapes("device.cu_count", {"x": (3,)})
    assert expr.names_device("min(x.shape[0], device.cu_count)")
    assert not expr.names_device("x.shape[0]")
    assert expr.compile_program("device.cu_count", SLOTS) == ["device", 0]
