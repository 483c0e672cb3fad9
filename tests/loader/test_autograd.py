"""Autograd pairs: an op whose manifest names a backward op trains (``loss.backward()`` runs the backward op).

The tiny bundle's ``addsub(x, y) -> (x + y, x - y)`` is its own backward (it is linear and self-adjoint).
Meta tensors run the whole autograd path here without a GPU (shapes only); real numbers on the CPU go
through the references (when CPU calls run the reference); the GPU tests run the kernels.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from flyship.bundle import manifest as _m
from flyship.bundle.errors import BundleError

pytestmark = pytest.mark.cpu


class _Calls(TorchDispatchMode):
    """Records the ops that run (below autograd)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def meta(n: int) -> torch.Tensor:
    return torch.empty(n, device="meta", requires_grad=True)


def cpu_or_skip(fn, *args):
    """Run ``fn``; skip when this build refuses CPU tensors (before CPU calls run the reference)."""
    try:
        return fn(*args)
    except RuntimeError as e:
        if "expected tensors on a GPU device" in str(e):
            pytest.skip("CPU calls do not run the reference in this build; this would check gradients with real "
                        "numbers through the references")
        raise


def test_loading_a_bundle_with_an_autograd_pair_warns_nothing(fresh_ops):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh_ops()


def test_backward_through_an_op_with_a_backward_runs_the_backward_op(fresh_ops):
    ops = fresh_ops()
    x, y = meta(8), meta(8)
    s, d = ops.addsub(x, y)
    with _Calls() as calls:
        (s.sum() * 2 + d.sum()).backward()
    assert f"{ops.namespace}.addsub.default" in calls.names
    assert x.grad.shape == (8,) and y.grad.shape == (8,)


def test_backward_of_an_op_without_a_backward_says_the_derivative_is_not_implemented(fresh_ops):
    ops = fresh_ops()
    out = ops.add(meta(8), meta(8))
    with pytest.raises(RuntimeError, match="not implemented"):
        out.sum().backward()


@pytest.mark.parametrize("path", ["handle", "torch.ops"])
def test_forward_mode_ad_through_an_op_with_a_backward_is_refused_not_a_silent_none_tangent(fresh_ops, path):
    import torch.autograd.forward_ad as fwad

    from flyship.errors import CallError

    ops = fresh_ops()
    call = ops.addsub if path == "handle" else getattr(torch.ops, ops.namespace).addsub
    with fwad.dual_level():
        x = fwad.make_dual(torch.randn(8), torch.ones(8))
        with pytest.raises(CallError, match=rf"flyship {ops.namespace}::addsub: expected inputs without forward-mode "
                                            r"AD tangents \(its backward op addsub gives reverse-mode gradients "
                                            r"only\), got a dual tensor as argument 0; use reverse mode"):
            call(x, torch.randn(8))
        s, d = ops.addsub(torch.randn(8), torch.randn(8))  # no tangent: runs as ever, inside dual_level() too
    assert s.shape == (8,)


def test_torch_compile_traces_forward_and_backward_without_graph_breaks(fresh_ops):
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    ops = fresh_ops()
    graphs: dict[str, str] = {}

    def record(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = str(gm.graph)
            return make_boxed_func(gm)

        return compiler

    op = getattr(torch.ops, ops.namespace).addsub

    def loss(x, y):
        s, d = op(x, y)
        return (s * d).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, backend=aot_autograd(fw_compiler=record("fw"), bw_compiler=record("bw")),
                             fullgraph=True)
    x, y = meta(8), meta(8)
    compiled(x, y).backward()
    assert f"{ops.namespace}.addsub.default" in graphs["fw"]
    assert f"{ops.namespace}.addsub.default" in graphs["bw"]
    assert x.grad.shape == (8,)


def test_gradients_match_the_reference_on_the_cpu(fresh_ops):
    ops = fresh_ops()
    x = torch.randn(16, dtype=torch.float64, requires_grad=True)
    y = torch.randn(16, dtype=torch.float64, requires_grad=True)
    cpu_or_skip(ops.addsub, x, y)
    assert torch.autograd.gradcheck(lambda a, b: ops.addsub(a, b), (x, y))
    gs, gd = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    gx, gy = torch.autograd.grad(ops.addsub(x, y), (x, y), (gs, gd))
    torch.testing.assert_close(gx, gs + gd)
    torch.testing.assert_close(gy, gs - gd)


def test_opcheck_passes_for_an_op_with_a_backward_on_the_cpu(fresh_ops):
    ops = fresh_ops()
    x = torch.randn(16, requires_grad=True)
    y = torch.randn(16, requires_grad=True)
    cpu_or_skip(ops.addsub, x, y)
    torch.library.opcheck(getattr(torch.ops, ops.namespace).addsub.default, (x, y))


# ---------------------------------------------------------------------------------------------
# The manifest's checks of a backward


def _with_backward(bundle_copy, backward):
    def edit(d):
        for op in d["ops"]:
            if op["name"] == "addsub":
                op["backward"] = backward

    return bundle_copy(edit)


@pytest.mark.parametrize("backward, message", [
    ({"op": "nope", "inputs": {}, "grads": {"x": "sum"}}, "expected an op of this bundle, got 'nope'"),
    ({"op": "addsub", "inputs": {"x": "grad:sum"}, "grads": {"x": "sum"}}, r"backward inputs \['y'\] have no source"),
    ({"op": "addsub", "inputs": {"x": "grad:nope", "y": "x"}, "grads": {"x": "sum"}}, "expected 'grad:' of an output"),
    ({"op": "addsub", "inputs": {"x": "z", "y": "x"}, "grads": {"x": "sum"}}, "expected a forward input or output"),
    ({"op": "addsub", "inputs": {"x": "x", "y": "y"}, "grads": {"sum": "sum"}},
     r"expected a tensor input of addsub \(x, y\), got 'sum'"),
    ({"op": "addsub", "inputs": {"x": "x", "y": "y"}, "grads": {"x": "nope"}},
     "expected a buffer addsub gives: output sum, output diff"),
])
def test_a_backward_that_does_not_fit_the_bundle_is_refused_when_read(bundle_copy, backward, message):
    with pytest.raises(BundleError, match=message):
        _m.read(_with_backward(bundle_copy, backward))


def test_a_1_0_manifest_without_backward_keys_still_loads(bundle_copy):
    def edit(d):
        d["schema_version"] = "1.0"
        for op in d["ops"]:
            op.pop("backward", None)

    m = _m.read(bundle_copy(edit))
    assert all(op.backward is None for op in m.ops)


def test_backward_saves_only_the_forward_tensors_it_reads(tiny_bundle):
    m = _m.read(tiny_bundle)
    op = m.op("addsub")
    assert op.backward.saved(op) == ()
    b = _m.Backward(op="addsub", inputs={"x": "grad:sum", "y": "x"}, grads={"x": "sum"})
    assert b.saved(op) == ("x",)
    assert _m.to_json_data(m)["ops"][2]["backward"]["grads"] == {"x": "sum", "y": "diff"}


def test_an_input_that_requires_grad_but_gets_none_from_the_backward_raises(bundle_copy, ext):
    import uuid

    import flyship

    path = _with_backward(bundle_copy, {"op": "addsub", "inputs": {"x": "grad:sum", "y": "grad:diff"},
                                        "grads": {"x": "sum"}})
    ops = flyship.load(path, namespace=f"flyship_t{uuid.uuid4().hex[:10]}")
    s, d = ops.addsub(meta(8), meta(8))
    with pytest.raises(RuntimeError, match="expected gradients only for x .* got an input 'y' that requires grad"):
        (s.sum() + d.sum()).backward()


def test_the_flydsl_example_softmax_trains_through_its_backward_op(example_bundle, ext):
    import uuid

    import flyship

    ops = flyship.load(example_bundle, namespace=f"flyship_e{uuid.uuid4().hex[:8]}")
    x = meta(0).new_empty(64, 300).requires_grad_()
    y = ops.softmax(x)
    with _Calls() as calls:
        (y * torch.empty(64, 300, device="meta")).sum().backward()
    assert f"{ops.namespace}.softmax_bwd.default" in calls.names and x.grad.shape == (64, 300)
    d = ops.softmax_bwd.dispatch(torch.randn(64, 300), torch.randn(64, 300), target="gfx942")
    assert d.spec == "f32"
