"""The spec API's composite(): what a spec may declare, refused with the composite's name before anything builds."""

from __future__ import annotations

import pytest

from flyship.compiler.spec import Output, Scalar, Tensor
from flyship.compiler.spec.composite import composite_entry
from flyship.errors import SpecError

pytestmark = pytest.mark.compile


def test_a_composite_becomes_a_manifest_entry_with_its_arguments_in_order():
    c = composite_entry("cross_entropy", "ce", [Tensor("logits", rank=2), Scalar("ignore_index", "int", -100)],
                        ["loss"], doc="mean loss")
    assert (c.name, c.function, c.returns, c.doc) == ("cross_entropy", "ce", ("loss",), "mean loss")
    assert [(a.name, a.kind, a.rank, a.default) for a in c.args] == [("logits", "tensor", 2, None),
                                                                    ("ignore_index", "int", 0, -100)]


@pytest.mark.parametrize("args, returns, message", [
    ([Tensor("x", rank=2, mutable=True)], ["y"],
     r"composite c: argument 'x': a composite's Tensor takes name and rank only, got mutable=True; .*declare "
     r"mutable=True on the Tensor of the op that takes 'x' .* and Tensor\('x', rank=2\) here \(docs/training.md"),
    ([Tensor("x", rank=3, batch=True)], ["y"],
     r"got batch=True; .*declare batch=True on the Tensor of the op that takes 'x' \(batch=True: that op flattens "
     r"the leading dims"),
    ([Output("y", like="x")], ["y"], r"composite c: args= takes Tensor\(...\) and Scalar\(...\), got Output"),
    ([Tensor("x", rank=2)], "y", r"composite c: returns= expects a list of names"),
    ([Scalar("s", "int", 1.5)], ["y"], r"composite c"),
])
def test_a_composite_the_rule_book_would_refuse_is_a_spec_error(args, returns, message):
    with pytest.raises(SpecError, match=message):
        composite_entry("c", "fn", args, returns)


def test_a_composite_function_taking_other_arguments_than_declared_is_refused_from_its_source(tmp_path):
    from flyship.compiler.spec.composite import check_composite_functions

    refs = tmp_path / "refs.py"
    refs.write_text("def ce(ops, logits, target, ignore_index=-100):\n    pass\n\ndef any_(*a):\n    pass\n")
    two = composite_entry("ce", "ce", [Tensor("logits", rank=2), Tensor("target", rank=1)], ["loss"])
    check_composite_functions(refs, [two, composite_entry("v", "any_", [Tensor("x", rank=1)], ["y"])])
    one = composite_entry("ce", "ce", [Tensor("logits", rank=2)], ["loss"])
    with pytest.raises(SpecError, match=r"composite ce: refs\.py's ce\(ops, logits, target, ignore_index\) is called "
                                        r"as ce\(ops, logits\); expected it to take ops and then the 1 declared"):
        check_composite_functions(refs, [one])


def test_a_composite_naming_a_missing_function_is_refused_in_the_composites_own_words(tmp_path):
    from types import SimpleNamespace

    from flyship.compiler.pipeline.checking import check_references_module, needed_references
    from flyship.errors import CompileError

    refs = tmp_path / "refs.py"
    refs.write_text("def swiglu(ops, a, b):\n    pass\n")
    sf = SimpleNamespace(ops=[], composites=[composite_entry("swiglu", "swigl", [Tensor("a", rank=2)], ["c"])])
    with pytest.raises(CompileError, match=r"composite swiglu: function='swigl' is not defined in .*it defines swiglu"):
        check_references_module(refs, needed_references(sf))
