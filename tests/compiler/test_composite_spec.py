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


def test_a_composite_with_a_per_cu_workspace_is_declared_and_its_function_must_take_it(tmp_path):
    from flyship.compiler.spec import Workspace
    from flyship.compiler.spec.composite import check_composite_functions

    c = composite_entry("colsum", "colsum", [Tensor("x", rank=2)], ["y"],
                        workspaces=[Workspace("partial", shape=("device.cu_count", "x.shape[1]"), zero=True)])
    assert [(w.name, w.shape, w.dtype, w.zero) for w in c.workspaces] == [
        ("partial", ("device.cu_count", "x.shape[1]"), "float32", True)]
    refs = tmp_path / "refs.py"
    refs.write_text("def colsum(ops, x, partial):\n    pass\n\ndef short(ops, x):\n    pass\n")
    check_composite_functions(refs, [c])
    import dataclasses

    with pytest.raises(SpecError, match=r"short\(ops, x\) is called as short\(ops, x, partial\); expected it to take "
                                        r"ops and then the 1 declared arguments and its 1 workspaces"):
        check_composite_functions(refs, [dataclasses.replace(c, function="short")])
    with pytest.raises(SpecError, match=r"composite c.workspaces\[0\].name: workspace name 'y' repeats"):
        composite_entry("c", "fn", [Tensor("x", rank=1)], ["y"], workspaces=[Workspace("y", shape=("4",))])
    with pytest.raises(SpecError, match=r"composite c.workspaces\[0\].shape\[0\]"):
        composite_entry("c", "fn", [Tensor("x", rank=1)], ["y"], workspaces=[Workspace("w", shape=("z.numel",))])
    with pytest.raises(SpecError, match=r"workspaces= expects a list of Workspace"):
        composite_entry("c", "fn", [Tensor("x", rank=1)], ["y"], workspaces=Workspace("w", shape=("4",)))


KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def colsum_partial(x, partial, n_rows, n_cols, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r in range(pid, n_rows, tl.num_programs(0)):
        acc += tl.load(x + r * n_cols + cols, mask=m, other=0.0)
    tl.store(partial + pid * n_cols + cols, acc, mask=m)
'''

SPEC = """
import sys
sys.path.insert(0, {folder!r})
from flyship.compiler.spec import (Constexpr, Spec, Tensor, Value, Workspace, composite, namespace, op,
                                   references)
from kern import colsum_partial
namespace("t")
references("refs.py")
op("colsum_partial", kernel=colsum_partial, grid=("device.cu_count",), reference="colsum_partial_ref",
   args=[Tensor("x", rank=2), Tensor("partial", rank=2, mutable=True), Value("n_rows", "x.shape[0]"),
         Value("n_cols", "x.shape[1]"), Constexpr("BLOCK")],
   specs=[Spec("f32", dtypes={{"x": "float32", "partial": "float32"}}, shapes={{"x": (1000, 64), "partial": (304, 64)}},
               constexprs={{"BLOCK": 64}}, options={{"specialize": "declared"}},
               constraints=("x.shape[1] <= 64", "partial.shape[1] == x.shape[1]", "partial.shape[0] == device.cu_count",
                            "x.stride[1] == 1", "x.stride[0] == x.shape[1]", "partial.stride[0] == x.shape[1]"))])
composite("colsum", function="colsum", args=[Tensor("x", rank=2)], returns=["y"],
          workspaces=[Workspace("partial", shape=("device.cu_count", "x.shape[1]"), zero=True)])
"""

REFS = '''
import torch


def colsum_partial_ref(x, partial):
    partial.zero_()
    partial[0].copy_(x.float().sum(0))


def colsum(ops, x, partial):
    ops.colsum_partial(x, partial)
    return partial.sum(0)
'''


def test_a_spec_with_a_per_cu_partial_buffer_in_a_composite_builds_as_5_0(tmp_path):
    # Issue 34 item 2: the two documented ways to a per-SM partial buffer (an Output sized by device.cu_count, a
    # composite that sees a workspace) could not be combined; the composite's workspace is the way (docs/training.md).
    import textwrap

    from flyship.bundle import manifest as M

    from ..conftest import run_build

    pytest.importorskip("triton", reason="needs triton 3.6 (the FlyDSL venv); it would build the per-CU column sum")
    (tmp_path / "kern.py").write_text(KERNEL)
    (tmp_path / "refs.py").write_text(REFS)
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(SPEC.format(folder=str(tmp_path))))
    run_build(spec, tmp_path / "o", ["gfx942"])
    m = M.read(tmp_path / "o")
    assert m.schema_version == "5.0" and "composite_workspaces" in M.must_understand(m)
    (c,) = m.composites
    assert [(w.name, w.shape, w.zero) for w in c.workspaces] == [("partial", ("device.cu_count", "x.shape[1]"), True)]
    (v,) = m.op("colsum_partial").specializations[0].variants
    assert v.launch.grid[0] == "device.cu_count"
