"""The torch surface without a GPU: schemas, fake kernels (opcheck on meta tensors), torch.compile tracing,
and autograd behaviour (CPU calls: test_cpu.py)."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

pytestmark = pytest.mark.cpu


def meta(*shape: int, **kw) -> torch.Tensor:
    return torch.randn(*shape, device="meta", **kw)


def test_schemas_are_registered_as_the_manifest_implies(tiny):
    ns = torch.ops.flyship_tiny
    assert str(ns.add.default._schema) == "flyship_tiny::add(Tensor x, Tensor y) -> Tensor"
    assert str(ns.add.out._schema) == "flyship_tiny::add.out(Tensor x, Tensor y, *, Tensor(a!) out) -> ()"
    assert str(ns.scale_rows.default._schema) == ("flyship_tiny::scale_rows(Tensor x, float alpha=1., int bias=0) "
                                                  "-> Tensor")
    assert str(ns.addsub.out._schema) == ("flyship_tiny::addsub.out(Tensor x, Tensor y, *, Tensor(a!) sum, "
                                          "Tensor(b!) diff) -> ()")


@pytest.mark.parametrize("key", ["CUDA", "CPU", "Autograd", "ADInplaceOrView"])
def test_kernels_are_registered_for_gpu_cpu_and_autograd_keys(tiny, key):
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has("flyship_tiny::add.out", key)
    if key != "ADInplaceOrView":
        assert has("flyship_tiny::add", key)


@pytest.mark.parametrize("case", ["add", "add.out", "scale_rows", "scale_rows.out", "addsub", "addsub.out"])
def test_opcheck_passes_on_meta_tensors(tiny, case):
    ns = torch.ops.flyship_tiny
    x, y, x2 = meta(300), meta(300), meta(12, 40)
    calls = {
        "add": (ns.add.default, (x, y), {}),
        "add.out": (ns.add.out, (x, y), {"out": meta(300)}),
        "scale_rows": (ns.scale_rows.default, (x2, 2.0, 3), {}),
        "scale_rows.out": (ns.scale_rows.out, (x2,), {"alpha": 0.5, "out": meta(12, 40)}),
        "addsub": (ns.addsub.default, (x, y), {}),
        "addsub.out": (ns.addsub.out, (x, y), {"sum": meta(300), "diff": meta(300)}),
    }
    op, args, kwargs = calls[case]
    result = opcheck(op, args, kwargs)
    assert set(result.values()) == {"SUCCESS"}, result


def test_fake_kernels_follow_the_output_rules(tiny):
    out = torch.ops.flyship_tiny.scale_rows(meta(7, 33, dtype=torch.float32))
    assert out.shape == (7, 33) and out.dtype == torch.float32 and out.device.type == "meta"
    s, d = torch.ops.flyship_tiny.addsub(meta(5), meta(5))
    assert s.shape == d.shape == (5,)
    with pytest.raises(RuntimeError, match=r"expected 'x' of rank 2, got rank 1"):
        torch.ops.flyship_tiny.scale_rows(meta(7))


def test_torch_compile_traces_the_ops_into_one_graph_with_dynamic_shapes(tiny):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, y):
        s, d = torch.ops.flyship_tiny.addsub(x, y)
        z = tiny.add(s, d)
        return tiny.scale_rows(z.view(8, -1), 2.0, bias=3)

    cf = torch.compile(f, backend=backend, fullgraph=True, dynamic=True)
    assert cf(meta(64), meta(64)).shape == (8, 8)
    assert cf(meta(128), meta(128)).shape == (8, 16)
    assert len(graphs) == 1  # no graph break, no recompile for a new size
    code = graphs[0].code
    for name in ("flyship_tiny.addsub", "flyship_tiny.add.default", "flyship_tiny.scale_rows.default"):
        assert name in code


def test_torch_compile_functionalizes_the_out_variant(tiny):
    def g(x, y, o):
        tiny.add.out(x, y, out=o)
        return o * 2

    out = torch.compile(g, backend="aot_eager", fullgraph=True)(meta(32), meta(32), torch.empty(32, device="meta"))
    assert out.shape == (32,)


def test_backward_through_an_op_raises_that_it_has_no_derivative(tiny):
    x = meta(16, requires_grad=True)
    y = torch.ops.flyship_tiny.add(x, meta(16))
    assert y.requires_grad
    with pytest.raises(RuntimeError, match="derivative for flyship_tiny::add is not implemented"):
        y.sum().backward()


def test_the_out_variant_refuses_inputs_that_require_grad(tiny):
    x = torch.randn(16, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"add\.out: functions with out=\.\.\. arguments don't support automatic "
                                           r"differentiation, but argument 'x' requires grad"):
        tiny.add.out(x, torch.randn(16), out=torch.empty(16))
    with torch.no_grad():
        got = tiny.add.out(x, torch.ones(16), out=torch.empty(16))
    torch.testing.assert_close(got, x.detach() + 1)
