"""Training ops from one bundle (examples/triton/training.py, schema 4.0): autograd pairs whose backward writes
gradients in place, a backward that ends with a host step, and composite ops, on the CPU.

The CPU path runs each op's reference (the bundle's own references.py), so gradients are checked with real numbers
against torch's; the recording driver runs the real C++ path and shows which buffers the backward kernels got. The
GPU proof (the real cubins on an H200) is tests/gpu/test_training.py.
"""

from __future__ import annotations

import struct
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from flyship.bundle import manifest as _m

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def ops(training_bundle: Path, ext: Any) -> Any:
    import flyship

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fallback warning per op: CPU calls run the references
        o = flyship.load(training_bundle, namespace=f"flyship_tr{uuid.uuid4().hex[:8]}")
    return o


@pytest.fixture(autouse=True)
def quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def leaf(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


def test_the_bundle_is_written_as_4_1_because_a_backward_consumes_buffers_and_composites_are_declared(
        training_bundle):
    m = _m.read(training_bundle)
    assert m.schema_version == "4.1" and _m.must_understand(m) == ("mutable", "consumes", "composites")
    assert [c.name for c in m.composites] == ["scale_bwd", "cross_entropy", "swiglu", "rope"]
    assert m.op("swiglu_fwd").backward.consumed(m.op("swiglu_bwd")) == {"a": "a", "b": "b"}
    assert m.op("ce_fwd").backward.consumed(m.op("ce_bwd")) == {"dlogits": "dlogits"}


def test_cross_entropy_loss_and_gradient_equal_torch_with_ignored_rows(ops):
    torch.manual_seed(0)
    logits = leaf(12, 300)
    target = torch.randint(0, 300, (12,))
    target[[2, 7]] = -100
    loss = ops.cross_entropy(logits, target)
    loss.backward()
    ref_logits = logits.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref_logits, target, ignore_index=-100)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(logits.grad, ref_logits.grad)
    assert logits.grad[[2, 7]].abs().max() == 0


@pytest.mark.parametrize("name", ["swiglu", "rope", "scale"])
def test_gradients_of_each_pair_pass_gradcheck_in_float64(ops, name):
    torch.manual_seed(1)
    d = torch.float64
    if name == "swiglu":
        fn, args = (lambda a, b: ops.swiglu(a, b)), (leaf(3, 5, dtype=d), leaf(3, 5, dtype=d))
    elif name == "rope":
        cos, sin = torch.randn(4, 3, dtype=d), torch.randn(4, 3, dtype=d)
        fn, args = (lambda q, k: ops.rope(q, k, cos, sin)), (leaf(4, 2, 6, dtype=d), leaf(4, 2, 6, dtype=d))
    else:  # dw's partial sums are float32 by declaration: gradcheck the input; dw is compared below
        w = torch.randn(7, dtype=d)
        fn, args = (lambda x: ops.scale(x, w)), (leaf(40, 7, dtype=d),)
    assert torch.autograd.gradcheck(fn, args)


def test_a_backward_ending_with_a_host_reduction_gives_the_weight_gradient_of_torch(ops):
    torch.manual_seed(2)
    x, w = leaf(70, 33), leaf(33)
    g = torch.randn(70, 33)
    (ops.scale(x, w) * g).sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (x2 * w2 * g).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad, rtol=1e-5, atol=1e-5)


def test_inputs_the_user_still_holds_are_not_overwritten_by_the_backward_that_consumes_them(ops):
    torch.manual_seed(3)
    w = leaf(6, 10)
    a, b = w * 1.5, w - 0.5  # non-leaf inputs the user keeps
    a0, b0 = a.detach().clone(), b.detach().clone()
    ops.swiglu(a, b).sum().backward()
    assert torch.equal(a, a0) and torch.equal(b, b0)
    w2 = w.detach().clone().requires_grad_()
    (F.silu(w2 * 1.5) * (w2 - 0.5)).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)


def test_a_leaf_input_is_never_consumed_and_keeps_its_values(ops):
    a, b = leaf(4, 8), leaf(4, 8)
    a0 = a.detach().clone()
    ops.swiglu(a, b).sum().backward()
    assert torch.equal(a.detach(), a0)
    torch.testing.assert_close(a.grad, (b * torch.sigmoid(a) * (1 + a * (1 - torch.sigmoid(a)))).detach())


def _grad_buffer(make: Any) -> tuple[int, int]:
    """(data_ptr of the dropped input, data_ptr of the gradient that reached its producer)."""
    seen: list[int] = []
    a, other = make()
    ptr = a.data_ptr()
    a.register_hook(lambda g: seen.append(g.data_ptr()))
    out = other(a)
    del a
    out.sum().backward()
    return ptr, seen[0]


def test_an_input_nobody_holds_any_more_is_consumed_its_buffer_becomes_the_gradient(ops):
    w = leaf(4, 8)
    b = (w * 2).detach()
    ptr, grad_ptr = _grad_buffer(lambda: (w * 1, lambda a: ops.swiglu(a, b)))
    assert grad_ptr == ptr


def test_a_gradient_buffer_shared_with_another_branch_is_copied_not_overwritten(ops):
    torch.manual_seed(4)
    q = leaf(5, 2, 8)
    cos, sin = torch.randn(5, 4), torch.randn(5, 4)
    seen = []
    z = q * 3  # created first: its backward runs after rope's, and gets the same gradient tensor from the add
    z.register_hook(lambda g: seen.append(g.clone()))
    s = z + ops.rope_fwd(q, cos, sin)
    upstream = s.detach() * 2
    (s * s.detach()).sum().backward()
    torch.testing.assert_close(seen[0], upstream / 2)  # d(s * s.detach())/ds = s: untouched by rope's in-place bwd


def test_cross_entropys_gradient_buffer_is_the_forwards_output_scaled_in_place(ops):
    logits = leaf(6, 50)
    target = torch.randint(0, 50, (6,))
    loss, dlogits = ops.ce_fwd(logits, target)
    assert loss.requires_grad and not dlogits.requires_grad  # no derivative through the gradient output
    held = dlogits.clone()
    (loss * 3).sum().backward()
    assert torch.equal(dlogits, held)  # the user holds it: the backward scaled a copy
    torch.testing.assert_close(logits.grad, held * 3)


def test_a_second_backward_through_a_consumed_pair_is_refused_not_silently_wrong(ops):
    w = leaf(4, 6)
    a, b = w * 1, w * 2
    c = ops.swiglu(a, b)
    del a, b
    c.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        c.sum().backward()


def _step(ops: Any, logits, target, a, b, q, k, cos, sin, x, w):
    c = ops.swiglu(a, b)
    q2, k2 = ops.rope(q, k, cos, sin)
    return ops.cross_entropy(logits, target) + c.square().mean() + (q2 * k2).sum() + ops.scale(x, w).sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_runs_a_training_step_of_every_op_without_graph_breaks(ops, backend):
    torch.manual_seed(5)
    args = [leaf(8, 50), torch.randint(0, 50, (8,)), leaf(4, 6), leaf(4, 6), leaf(5, 2, 8), leaf(5, 2, 8),
            torch.randn(5, 4), torch.randn(5, 4), leaf(9, 7), leaf(7)]
    eager = _step(ops, *args)
    eager.backward()
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in args]
    torch._dynamo.reset()
    out = torch.compile(lambda *t: _step(ops, *t), backend=backend, fullgraph=True)(*copies)
    out.backward()
    torch.testing.assert_close(out, eager)
    for x, y in zip(args, copies):
        if x.requires_grad:
            torch.testing.assert_close(y.grad, x.grad)
    explained = torch._dynamo.explain(lambda *t: _step(ops, *t))(
        *[t.detach().clone().requires_grad_(t.requires_grad) for t in args])
    assert explained.graph_break_count == 0


OPCHECK_ARGS = {
    "swiglu_fwd": lambda: (leaf(4, 6), leaf(4, 6)),
    "swiglu_bwd": lambda: (torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6)),
    "rope_fwd": lambda: (leaf(5, 2, 8), torch.randn(5, 4), torch.randn(5, 4)),
    "rope_bwd": lambda: (torch.randn(5, 2, 8), torch.randn(5, 4), torch.randn(5, 4)),
    "ce_fwd": lambda: (leaf(8, 50), torch.randint(0, 50, (8,)), -100),
    "ce_bwd": lambda: (torch.randn(8, 50), torch.rand(8)),
    "scale": lambda: (leaf(9, 7), leaf(7)),
    "scale_bwd_partial": lambda: (torch.randn(40, 7), torch.randn(40, 7), torch.randn(7)),
    "scale_bwd": lambda: (torch.randn(40, 7), torch.randn(40, 7), torch.randn(7)),
    "cross_entropy": lambda: (leaf(8, 50), torch.randint(0, 50, (8,)), -100),
    "swiglu": lambda: (leaf(4, 6), leaf(4, 6)),
    "rope": lambda: (leaf(5, 2, 8), leaf(5, 2, 8), torch.randn(5, 4), torch.randn(5, 4)),
}


@pytest.mark.parametrize("name", sorted(OPCHECK_ARGS))
def test_opcheck_passes_for_every_op_and_composite(ops, name):
    torch.manual_seed(6)
    packet = getattr(getattr(torch.ops, ops.namespace), name)
    result = torch.library.opcheck(packet.default, OPCHECK_ARGS[name]())
    assert set(result.values()) == {"SUCCESS"}, result


def test_composites_are_ops_of_the_bundle_and_named_in_its_errors(ops):
    assert ops.cross_entropy is getattr(getattr(torch.ops, ops.namespace), "cross_entropy")
    assert ops["swiglu"] is ops.swiglu and "rope" in dir(ops)
    with pytest.raises(AttributeError, match="cross_entropy"):
        ops.no_such_op  # noqa: B018 - the message lists composites too


def test_flyship_list_and_the_ops_object_show_the_composites_and_the_backward_pairs(ops, training_bundle):
    from flyship.loader.tools.cli import describe

    assert ops.composites == ("scale_bwd", "cross_entropy", "swiglu", "rope")
    assert ops.backwards == {"swiglu_fwd": "swiglu_bwd", "rope_fwd": "rope_bwd", "ce_fwd": "ce_bwd",
                             "scale": "scale_bwd"}  # scale's backward is a composite (a host step after a kernel)
    assert "swiglu_fwd (backward: swiglu_bwd)" in repr(ops) and "composites: scale_bwd, cross_entropy" in repr(ops)
    text = describe(_m.read(training_bundle))
    assert "  backward: rope_bwd (grads q <- dq)" in text and "  backward of: rope_fwd" in text
    assert f"{ops.namespace}::" not in text  # the manifest's namespace, not the one this test loaded under
    m = _m.read(training_bundle)
    composite = text.split(f"\n{m.namespace}::cross_entropy(", 1)[1]
    assert "[composite: references.py:" in composite.splitlines()[1]
    assert "  backward of: scale" in text.split(f"\n{m.namespace}::scale_bwd(", 1)[1]


def _pointers(kernargs: bytes) -> set[int]:
    return {struct.unpack_from("<Q", kernargs, o)[0] for o in range(0, len(kernargs) - 7, 8)}


@pytest.mark.parametrize("held", [True, False])
def test_on_the_recording_driver_the_backward_kernel_gets_the_dropped_buffer_or_a_copy_of_a_held_one(
        training_bundle, recorded, launches, held):
    ops = recorded(training_bundle, target="sm_90")
    w = leaf(64, 100)
    a, b = w * 1, w * 2
    ptr_a, ptr_b = a.data_ptr(), b.data_ptr()
    c = ops.swiglu(a, b)
    keep = (a, b) if held else ()
    del a, b
    c.sum().backward()
    fwd, bwd = launches()
    assert (fwd["symbol"], bwd["symbol"]) == ("swiglu_fwd_kernel", "swiglu_bwd_kernel")
    assert {ptr_a, ptr_b} <= _pointers(fwd["kernargs"])
    assert ({ptr_a, ptr_b} & _pointers(bwd["kernargs"])) == (set() if held else {ptr_a, ptr_b})
    del keep


def test_the_training_manifest_validates_against_the_json_schema(training_bundle):
    import json

    from flyship.bundle import schema as S

    jsonschema = pytest.importorskip("jsonschema", reason="needs jsonschema; it would validate the 4.0 manifest")
    jsonschema.Draft202012Validator(S.load()).validate(json.loads((training_bundle / "manifest.json").read_text()))


@pytest.mark.parametrize("name", ["swiglu", "scale", "cross_entropy"])
def test_a_double_backward_through_a_pair_is_refused_not_a_silent_zero(ops, name):
    # The backward kernels compute first derivatives only: a gradient taken with create_graph=True may be used
    # (a gradient penalty's first step), but differentiating it again must raise, never give zeros or None.
    torch.manual_seed(4)
    w = leaf(4, 6)
    if name == "swiglu":
        a, b = w * 1.5, w - 0.5
        out = ops.swiglu(a, b).square().sum()
    elif name == "scale":
        out = ops.scale(w * 2, torch.randn(6)).square().sum()
    else:
        out = ops.cross_entropy(w * 3, torch.tensor([1, 2, 0, 5]))
    with pytest.raises(RuntimeError, match="double backward"):
        # cross-entropy saves no input (its gradient is made in the forward): refused at the first, create_graph step
        (g,) = torch.autograd.grad(out, w, create_graph=True)
        torch.autograd.grad((g.square().sum() + w.sum()), w)
    (g1,) = torch.autograd.grad(out, w)  # first derivatives stay as they were
    assert g1.abs().sum() > 0
