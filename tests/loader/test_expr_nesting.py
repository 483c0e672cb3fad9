"""Expression nesting is bounded by a limit of the table (bundle/limits.py: MAX_EXPR_NESTING), never by Python's
stack (issue 32 item 3): ``'-' * 998 + '1'`` fits the 1,000-character limit and is a flyship error in the
expression parser, the tuning reader and load(tuning=). The C++ core parses no text: it runs postfix programs with
an explicit stack of MAX_PROGRAM_DEPTH entries; the edge on both sides is checked here."""

from __future__ import annotations

import json

import pytest

from flyship.bundle import expr
from flyship.bundle import limits as _limits
from flyship.bundle import tuning as tt
from flyship.errors import BundleError, ExprError
from flyship.loader.plan import lower_program

pytestmark = pytest.mark.cpu

DEEP = "-" * 998 + "1"
LIMIT = _limits.MAX_EXPR_NESTING


def test_an_expression_nested_past_the_limit_is_an_expr_error_not_a_recursion_error():
    assert len(DEEP) <= expr.MAX_EXPR_CHARS
    with pytest.raises(ExprError, match=r"nests 999 levels deep, expected at most 64"):
        expr.parse(DEEP)
    for text in ("(" * 300 + "1" + ")" * 300, " + ".join(["1"] * 300), "not " * 240 + "1", "-" * 5000 + "1"):
        with pytest.raises(ExprError):
            expr.parse(text)


def test_the_nesting_edge_is_exact():
    assert expr.evaluate_with_shapes("-" * (LIMIT - 1) + "1", {}) == (-1) ** (LIMIT - 1)  # LIMIT levels: the leaf too
    with pytest.raises(ExprError, match=f"nests {LIMIT + 1} levels deep"):
        expr.parse("-" * LIMIT + "1")


def _table(tmp_path, key_text):
    doc = {"format": "flyship-tuning", "version": "1.1", "namespace": "ns", "keys": {"add": [key_text]},
           "entries": [{"op": "add", "target": "gfx942", "key": [1], "spec": "f32"}]}
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_tuning_reader_refuses_a_deep_key_expression_as_a_bundle_error(tmp_path):
    with pytest.raises(BundleError, match="nests 999 levels deep"):
        tt.read(_table(tmp_path, DEEP))


def test_load_with_a_tuning_table_of_a_deep_key_expression_is_a_bundle_error(tiny_bundle, tmp_path):
    import flyship

    with pytest.raises(BundleError, match="nests 999 levels deep"):
        flyship.load(tiny_bundle, namespace="flyship_deep_key", tuning=_table(tmp_path, DEEP))


def test_the_cpp_core_runs_a_program_at_the_stack_limit_and_refuses_one_entry_more(record_ext):
    """The C++ side's edge: its evaluator is a loop over the program with a fixed stack of MAX_PROGRAM_DEPTH."""
    text = "1"
    for _ in range(expr.MAX_PROGRAM_DEPTH - 1):
        text = f"(1 + {text})"  # each level keeps one more value on the stack
    program = lower_program(text, {})
    got = record_ext.evaluate_program(program, [], [], [], 304)
    assert tuple(got) == ("ok", expr.MAX_PROGRAM_DEPTH) == ("ok", expr.evaluate_with_shapes(text, {}))
    deeper = {"text": "(hand-made)", "code": ["const", 1] * (expr.MAX_PROGRAM_DEPTH + 1)
              + ["add"] * expr.MAX_PROGRAM_DEPTH}
    with pytest.raises(Exception, match=f"deeper than {expr.MAX_PROGRAM_DEPTH} values"):
        record_ext.evaluate_program(deeper, [], [], [], 304)
