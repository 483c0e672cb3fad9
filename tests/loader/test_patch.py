"""flyship.patch: calls that fit a specialization run the op, all others the original, counted by reason;
argument mapping, refusals, undo, the routing report, torch.compile, prepared weights.

On the CPU, ``cpu_target="gfx942"`` makes the patch decide as a gfx942 device would; the op then runs its
reference on the CPU (counted by the op under "cpu"), so a routed call is told from the original by the
original's own call log (``dropin_model.CALLS``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import flyship
from flyship.loader.tools.patch import Const, PatchError, Prepared
from flyship.loader.tools.report import format_report, routing_report

pytestmark = pytest.mark.cpu

MODEL_DIR = Path(__file__).parent / "data" / "dropin"


@pytest.fixture
def model(monkeypatch):
    monkeypatch.syspath_prepend(str(MODEL_DIR))
    import dropin_model

    dropin_model.CALLS.clear()
    return dropin_model


def test_calls_that_fit_run_the_op_and_the_others_run_the_original_counted_by_reason(fresh_ops, model):
    ops = fresh_ops()
    with flyship.patch("dropin_model:add", ops.add, args={"x": "a", "y": "b"}, cpu_target="gfx942") as p:
        x, y = torch.randn(16), torch.randn(16)
        torch.testing.assert_close(model.add(x, y), x + y)
        torch.testing.assert_close(model.add(x.double(), y.double()), (x + y).double())
        torch.testing.assert_close(model.add(x[1:], y[1:]), x[1:] + y[1:])  # not 16-byte aligned
    assert model.CALLS == ["add", "add"]  # the float64 call and the mismatched one ran the original
    s = p.stats()
    assert s["to_op"] == 1 and sum(s["to_original"].values()) == 2
    reasons = " | ".join(s["to_original"])
    assert "float64" in reasons and "align" in reasons, reasons
    assert ops.add.stats()["fallbacks"] == {"cpu": 1}


def test_cpu_calls_go_to_the_original_unless_a_cpu_target_is_given(fresh_ops, model):
    ops = fresh_ops()
    with flyship.patch("dropin_model:add", ops.add, args={"x": "a", "y": "b"}) as p:
        model.add(torch.randn(4), torch.randn(4))
    assert model.CALLS == ["add"]
    assert p.stats()["to_original"] == {"cpu tensors": 1}


def test_undo_and_the_context_manager_put_the_original_back(fresh_ops, model):
    ops = fresh_ops()
    original = model.add
    p = flyship.patch("dropin_model:add", ops.add, args={"x": "a", "y": "b"})
    assert model.add is not original and p.active
    with pytest.raises(PatchError, match="already patched"):
        flyship.patch("dropin_model:add", ops.add, args={"x": "a", "y": "b"})
    p.undo()
    assert model.add is original and not p.active
    with p:
        assert model.add is not original
    assert model.add is original
    original_forward = model.Scale.forward
    with flyship.patch("dropin_model:Scale.forward", ops.scale_rows, args={"x": "hidden", "alpha": "self.alpha"}):
        assert model.Scale.forward is not original_forward
    assert model.Scale.forward is original_forward


def test_a_method_takes_an_attribute_from_self_and_a_renamed_keyword(fresh_ops, model):
    ops = fresh_ops()
    m = model.Scale(2.0)
    h = torch.randn(3, 4)
    with flyship.patch("dropin_model:Scale.forward", ops.scale_rows, args={"x": "hidden", "alpha": "self.alpha"},
                       cpu_target="gfx942") as p:
        torch.testing.assert_close(m(h, bias=1), h * 2 + 1)
        torch.testing.assert_close(m(hidden=h), h * 2)
    assert model.CALLS == [] and p.stats()["to_op"] == 2


def test_a_static_method_is_patched_and_restored_as_a_static_method(fresh_ops, model):
    ops = fresh_ops()
    x, y = torch.randn(8), torch.randn(8)
    raw = vars(model.Util)["add"]
    with flyship.patch("dropin_model:Util.add", ops.add, args={"x": "a", "y": "b"}, cpu_target="gfx942") as p:
        assert isinstance(vars(model.Util)["add"], staticmethod)
        torch.testing.assert_close(model.Util.add(x, y), x + y)
        torch.testing.assert_close(model.Util().add(x, y), x + y)
    assert vars(model.Util)["add"] is raw and model.CALLS == [] and p.stats()["to_op"] == 2


def test_an_in_place_original_gets_the_ops_output_copied_into_its_out_parameter(fresh_ops, model):
    ops = fresh_ops()
    x, y, out = torch.randn(8), torch.randn(8), torch.zeros(8)
    with flyship.patch("dropin_model:add_into", ops.add, args={"x": "a", "y": "b"}, inplace="out",
                       cpu_target="gfx942") as p:
        model.add_into(x, y, out)
    torch.testing.assert_close(out, x + y)
    assert model.CALLS == [] and p.stats()["to_op"] == 1


def test_a_parameter_the_op_ignores_sends_the_call_to_the_original_when_set(fresh_ops, model):
    ops = fresh_ops()
    x, y = torch.randn(8), torch.randn(8)
    with flyship.patch("dropin_model:add_scaled", ops.add, args={"x": "a", "y": "b"}, cpu_target="gfx942") as p:
        model.add_scaled(x, y)
        model.add_scaled(x, y, scale=1.0)
        torch.testing.assert_close(model.add_scaled(x, y, 3.0), (x + y) * 3)
    assert p.stats()["to_op"] == 2 and p.stats()["to_original"] == {"argument 'scale' set": 1}


def test_a_constant_and_a_callable_source_feed_op_inputs(fresh_ops, model):
    ops = fresh_ops()
    h = torch.randn(2, 4)
    with flyship.patch("dropin_model:Scale.forward", ops.scale_rows,
                       args={"x": lambda bound: bound["hidden"] * 1, "alpha": Const(3.0), "bias": "bias"},
                       cpu_target="gfx942"):
        torch.testing.assert_close(model.Scale(9.0)(h, 2), h * 3 + 2)


def test_patching_is_refused_when_the_signatures_cannot_be_matched_naming_the_parameters(fresh_ops, model):
    ops = fresh_ops()
    with pytest.raises(PatchError, match=r"the op's inputs x, y have no source among the original's parameters "
                                         r"\(a, b\)"):
        flyship.patch("dropin_model:add", ops.add)
    with pytest.raises(PatchError, match=r"parameters mask feed no op input"):
        flyship.patch("dropin_model:add_masked", ops.add, args={"x": "a", "y": "b"})
    with pytest.raises(PatchError, match=r"args= names z, which the op does not have; its inputs are x, y"):
        flyship.patch("dropin_model:add", ops.add, args={"x": "a", "y": "b", "z": "a"})
    with pytest.raises(PatchError, match=r"the source 'bb' of op input 'y' names no parameter of the original; its "
                                         r"parameters are a, b"):
        flyship.patch("dropin_model:add", ops.add, args={"x": "a", "y": "bb"})
    with pytest.raises(PatchError, match=r"has no attribute 'nope'"):
        flyship.patch("dropin_model:nope", ops.add)
    with pytest.raises(PatchError, match=r"expected 'package.module:Name'"):
        flyship.patch("dropin_model.add", ops.add)
    assert model.add.__module__ == "dropin_model" and not hasattr(model.add, "__flyship_patch__")
    with flyship.patch("dropin_model:add_masked", ops.add, args={"x": "a", "y": "b"}, ignore=["mask"]) as p:
        assert p.active


def test_the_routing_report_names_each_site_its_verdict_and_reasons(fresh_ops, model, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ops = fresh_ops()
    with flyship.patch("dropin_model:add", ops.add, args={"x": "a", "y": "b"}) as p:
        model.add(torch.randn(4), torch.randn(4))
    report = routing_report()
    assert report["rank"] == 3 and report["world_size"] == 4
    site = next(s for s in report["sites"] if s["op"] == ops.add.qualname)
    assert site["verdict"] == "ALL TO ORIGINAL" and site["to_original"] == {"cpu tensors": 1}
    text = format_report(report)
    assert "[rank 3/4," in text and f"dropin_model:add -> {ops.add.qualname}  ALL TO ORIGINAL  0 to op, 1 to " \
        "original (undone)" in text and "1 cpu tensors" in text
    assert p in flyship.loader.tools.patch.patches()


def test_the_patched_function_inside_a_compiled_model_stays_one_graph(fresh_ops, model):
    from torch._dynamo.testing import CompileCounterWithBackend

    ops = fresh_ops()
    torch.manual_seed(0)
    block = model.Block(4)
    x = torch.randn(3, 4)
    want = block(x)
    with torch.no_grad(), flyship.patch("dropin_model:add", ops.add, args={"x": "a", "y": "b"}), \
            flyship.patch("dropin_model:Scale.forward", ops.scale_rows, args={"x": "hidden", "alpha": "self.alpha"}):
        counter = CompileCounterWithBackend("aot_eager")
        torch._dynamo.reset()
        got = torch.compile(block, backend=counter, fullgraph=True)(x)  # inference: the ops have no backward yet
    torch.testing.assert_close(got, want)
    assert counter.frame_count == 1
    targets = {str(n.target) for g in counter.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert f"{ops.namespace}.add.default" in targets and f"{ops.namespace}.scale_rows.default" in targets, targets
    assert ops.add.stats()["fallbacks"] == {"cpu": 1}  # the compiled graph ran the op (its CPU reference)


def test_a_prepared_weight_is_computed_once_and_again_after_an_in_place_update(fresh_ops, model):
    calls = []

    def transpose(w):
        calls.append(1)
        return w.t().contiguous()

    prep = Prepared(None, transpose)
    w = torch.randn(3, 5)
    a = prep(w)
    assert prep(w) is a and len(calls) == 1
    ptr = w.data_ptr()
    with torch.no_grad():
        w.mul_(2)  # as optimizer.step() does: same tensor, same storage, new version
    assert w.data_ptr() == ptr
    b = prep(w)
    assert len(calls) == 2 and b is not a
    torch.testing.assert_close(b, w.t())
    other = w.clone()
    prep(other)
    assert len(calls) == 3 and prep.prepares == 3 and prep.hits == 1


def test_a_prepared_source_in_a_patch_feeds_the_op_the_prepared_copy(fresh_ops, model):
    ops = fresh_ops()
    m = model.Scale(1.0)
    m.offset = torch.randn(2, 4)
    prep = Prepared("self.offset", lambda t: t * 10)
    h = torch.randn(2, 4)
    with flyship.patch("dropin_model:Scale.forward", ops.scale_rows, args={"x": prep, "alpha": "self.alpha"},
                       ignore=["hidden"], cpu_target="gfx942"):
        torch.testing.assert_close(m(h), m.offset * 10)
        torch.testing.assert_close(m(h), m.offset * 10)
        with torch.no_grad():
            m.offset.add_(1)
        torch.testing.assert_close(m(h), m.offset * 10)
    assert prep.prepares == 2 and prep.hits == 1


def test_the_flyship_package_exposes_the_drop_in_api_lazily():
    assert flyship.patch is flyship.loader.tools.patch.patch
    assert flyship.Prepared is Prepared and callable(flyship.routing_report)
    assert "flyship.loader.tools.bench" in sys.modules or callable(flyship.bench)
