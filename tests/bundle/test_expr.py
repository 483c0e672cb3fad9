import pytest

from flyship.bundle import expr
from flyship.bundle.errors import ExprError

pytestmark = pytest.mark.cpu


def test_grid_expression_evaluates_with_floor_semantics():
    shapes = {"x": (1000, 7)}
    assert expr.evaluate_with_shapes("cdiv(x.shape[0], 256)", shapes) == 4
    assert expr.evaluate_with_shapes("-7 // 2", shapes) == -4
    assert expr.evaluate_with_shapes("x.shape[-1] % 4", shapes) == 3
    assert expr.evaluate_with_shapes("x.numel", shapes) == 7000
    assert expr.evaluate_with_shapes("x.stride[0] == 7 and x.stride[1] == 1", shapes) == 1


def test_unknown_syntax_is_refused_with_the_offending_part():
    with pytest.raises(ExprError, match="unsupported call"):
        expr.parse("foo(x.shape[0], 2)")
    with pytest.raises(ExprError, match="integer literals"):
        expr.parse("x.shape[0] * 1.5")
    with pytest.raises(ExprError, match="one operator"):
        expr.parse("0 < x.shape[0] < 5")


def test_program_encodes_slots_and_resolves_negative_dims():
    slots = {"x": expr.Slot(0, "tensor", 2), "n": expr.Slot(1, "int")}
    prog = expr.compile_program("cdiv(x.shape[-1], n)", slots)
    assert prog == ["shape", 0, 1, "scalar", 1, "cdiv"]
    with pytest.raises(ExprError, match="out of range"):
        expr.compile_program("x.shape[2]", slots)
    with pytest.raises(ExprError, match="unknown name"):
        expr.compile_program("y.shape[0]", slots)


def test_substitute_inlines_constexprs():
    assert expr.substitute("cdiv(x.numel, BLOCK)", {"BLOCK": 1024}) == "cdiv(x.numel, 1024)"


def test_division_by_zero_names_the_expression():
    with pytest.raises(ExprError, match="division by zero") as e:
        expr.evaluate_with_shapes("x.shape[0] // 0", {"x": (3,)})
    assert e.value.kind == expr.DIVISION == "ExprDivisionError"


def test_a_value_that_leaves_int64_is_an_error_not_a_wrap():
    with pytest.raises(ExprError, match="leaves int64") as e:
        expr.evaluate_with_shapes("x.numel * 4611686018427387904 // 2", {"x": (3,)})
    assert e.value.kind == expr.OVERFLOW == "ExprOverflowError"
    with pytest.raises(ExprError, match="x.numel of shape") as e:
        expr.evaluate_with_shapes("x.numel", {"x": (2**62, 4)})
    assert e.value.kind == expr.OVERFLOW
    assert expr.evaluate_with_shapes("x.shape[0] * 2 - x.shape[0]", {"x": (2**62 - 1,)}) == 2**62 - 1


def test_trunc_div_rounds_toward_zero_like_llvm_sdiv_for_negative_and_zero_dividends():
    """FlyDSL's host arithmetic divides with arith.divsi (truncating); the expressions floor. trunc_div writes the
    truncation exactly: (n - 1) // 8 + 1 at n = 0 is 1 launched workgroup in FlyDSL, not 0."""
    from flyship.bundle.expr import trunc_div

    q, guard = trunc_div("x.shape[0] - 9", "8")
    assert guard == ()
    for n in range(0, 40):
        want = int((n - 9) / 8)  # C / LLVM sdiv
        assert expr.evaluate_with_shapes(q, {"x": (n,)}) == want, n
    q, guard = trunc_div("x.shape[0] - 9", "x.shape[1]")
    assert guard == ("x.shape[1] >= 1",)  # a divisor that may be 0 or negative is guarded
    assert expr.evaluate_with_shapes(q, {"x": (0, 4)}) == -2 and expr.evaluate_with_shapes(q, {"x": (17, 4)}) == 2
    assert trunc_div("x.shape[0] + 7", "8") == ("(x.shape[0] + 7) // 8", ())  # non-negative: plain floor


def test_only_expressions_over_sizes_and_non_negative_literals_are_known_non_negative():
    assert expr.nonnegative("cdiv(x.shape[0], 8) * x.stride[1] + device.cu_count")
    assert not expr.nonnegative("x.shape[0] - 1") and not expr.nonnegative("n") and not expr.nonnegative("-1")
    assert expr.is_constant("3 * 4") and not expr.is_constant("x.numel") and not expr.is_constant("device.cu_count")
