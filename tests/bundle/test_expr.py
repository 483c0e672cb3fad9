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
    with pytest.raises(ExprError, match="division by zero"):
        expr.evaluate_with_shapes("x.shape[0] // 0", {"x": (3,)})


def test_a_value_that_leaves_int64_is_an_error_not_a_wrap():
    with pytest.raises(expr.ExprOverflowError, match="leaves int64"):
        expr.evaluate_with_shapes("x.numel * 4611686018427387904 // 2", {"x": (3,)})
    with pytest.raises(expr.ExprOverflowError, match="x.numel of shape"):
        expr.evaluate_with_shapes("x.numel", {"x": (2**62, 4)})
    assert expr.evaluate_with_shapes("x.shape[0] * 2 - x.shape[0]", {"x": (2**62 - 1,)}) == 2**62 - 1
