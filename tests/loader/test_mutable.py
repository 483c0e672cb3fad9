"""Inputs the kernel writes in place (issue 9, pattern 7) in the workload Python, without a GPU: the torch schema
marks them ``Tensor(a!)``, no fresh output is made for them, the CPU path (the reference) writes them in place,
torch.compile's functionalized trace keeps the write, opcheck passes, autograd follows torch's in-place rule, and
the C++ call path (recording driver) hands the kernel the tensor's own memory."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
import torch
from torch.library import opcheck

import flyship
from flyship.errors import FlyshipError
from flyship.loader.tools.verify import example_inputs

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def ops(triton_examples_bundle, ext) -> Any:
    return flyship.load(triton_examples_bundle, namespace=f"flyship_m{uuid.uuid4().hex[:8]}")


def _lib(ops: Any) -> Any:
    return getattr(torch.ops, ops.namespace)


def test_the_schema_marks_the_written_input_and_an_in_place_only_op_returns_nothing(ops):
    assert ops.fused_add_rmsnorm.schema == ("fused_add_rmsnorm(Tensor x, Tensor(a!) residual, Tensor w, "
                                            "float eps=1e-06) -> Tensor")
    assert ops.fused_add_rmsnorm.out_schema == ("fused_add_rmsnorm.out(Tensor x, Tensor(a!) residual, Tensor w, "
                                                "float eps=1e-06, *, Tensor(b!) out) -> ()")
    assert ops.accumulate.schema == "accumulate(Tensor(a!) acc, Tensor x, float alpha=1.0) -> ()"
    assert ops.accumulate.out_schema is None and not hasattr(_lib(ops).accumulate, "out")
    with pytest.raises(TypeError, match="only writes its inputs acc in place"):
        ops.accumulate.out(torch.zeros(4), torch.ones(4), out=torch.empty(4))


def test_on_cpu_tensors_the_reference_writes_the_residual_in_place_and_returns_only_the_output(ops):
    x, r, w = torch.randn(8, 100), torch.randn(8, 100), torch.randn(100)
    r0 = r.clone()
    out = ops.fused_add_rmsnorm(x, r, w, 1e-5)
    torch.testing.assert_close(r, r0 + x)
    h = r0 + x
    torch.testing.assert_close(out, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w)
    acc = torch.zeros(10)
    assert ops.accumulate(acc, torch.ones(10), 2.0) is None
    torch.testing.assert_close(acc, torch.full((10,), 2.0))


@pytest.mark.parametrize("case", ["fused", "fused.out", "accumulate"])
def test_opcheck_passes_for_ops_that_write_an_input_on_the_cpu(ops, case):
    x, r, w = torch.randn(8, 100), torch.randn(8, 100), torch.randn(100)
    lib = _lib(ops)
    if case == "fused":
        result = opcheck(lib.fused_add_rmsnorm.default, (x, r, w, 1e-5))
    elif case == "fused.out":
        result = opcheck(lib.fused_add_rmsnorm.out, (x, r, w, 1e-5), {"out": torch.empty(8, 100)})
    else:
        result = opcheck(lib.accumulate.default, (torch.randn(300), torch.randn(300), 0.5))
    assert set(result.values()) == {"SUCCESS"} and len(result) == 4


def test_torch_compile_fullgraph_keeps_the_in_place_write_for_code_that_reads_it_afterwards(ops):
    lib = _lib(ops)

    def block(x, r, w, acc):
        out = lib.fused_add_rmsnorm(x, r, w, 1e-6)
        lib.accumulate(acc, out.flatten(), 0.5)
        return out * 2 + r, acc.sum()  # reads both written tensors after the ops

    x, r, w, acc = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64), torch.randn(4 * 64)
    eager_in = (x, r.clone(), w, acc.clone())
    compiled_in = (x, r.clone(), w, acc.clone())
    want = block(*eager_in)
    torch._dynamo.reset()
    got = torch.compile(block, fullgraph=True, dynamic=True)(*compiled_in)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(compiled_in[1], eager_in[1])  # the copy-back into the caller's residual
    torch.testing.assert_close(compiled_in[3], eager_in[3])


def test_the_functionalized_graph_carries_the_write_as_auto_functionalized_and_returns_it_for_the_copy_back(ops):
    from torch._functorch.aot_autograd import aot_function

    lib = _lib(ops)
    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm.code)
        return gm

    def f(x, r, w):
        out = lib.fused_add_rmsnorm(x, r, w, 1e-6)
        return out + r

    aot_function(f, fw_compiler=keep)(torch.randn(2, 8), torch.randn(2, 8), torch.randn(8))
    (code,) = graphs
    assert "auto_functionalized" in code
    # The graph returns the residual's new value beside f's one output: AOT autograd's epilogue copies it back
    # into the caller's tensor (the mutation survives functionalization, and `out + r` reads the new value).
    returned = code.split("return (", 1)[1].split(")", 1)[0]
    assert len([v for v in returned.split(",") if v.strip()]) == 2


def test_autograd_follows_torchs_rule_for_in_place_ops(ops):
    x, w = torch.randn(4, 16), torch.randn(16)
    leaf = torch.randn(4, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        ops.fused_add_rmsnorm(x, leaf, w)
    r = leaf * 1
    v = r._version
    out = ops.fused_add_rmsnorm(x, r, w)
    assert r._version > v  # a backward that saved the old residual is refused by torch's version check
    assert type(r.grad_fn).__name__ == "NotImplemented" and type(out.grad_fn).__name__ == "NotImplemented"
    with pytest.raises(RuntimeError, match="derivative for .*fused_add_rmsnorm is not implemented"):
        r.sum().backward()
    with torch.no_grad():
        ops.fused_add_rmsnorm(x, leaf, w)  # no autograd: the leaf may be written


def test_a_reference_that_returns_the_new_value_instead_of_writing_it_is_refused(triton_examples_bundle, ext):
    def returns_new(x, residual, w, eps=1e-6):
        return residual + x, (residual + x) * w

    ops = flyship.load(triton_examples_bundle, namespace=f"flyship_m{uuid.uuid4().hex[:8]}",
                       references={"fused_add_rmsnorm": returns_new})
    with pytest.raises(FlyshipError, match="must write residual in place too"):
        ops.fused_add_rmsnorm(torch.randn(2, 8), torch.randn(2, 8), torch.randn(8))


def _field(buf: bytes, offset: int) -> int:
    return struct.unpack_from("<Q", buf, offset)[0]


@pytest.mark.parametrize("target", ["sm_90", "gfx942"])
def test_the_kernel_gets_the_residuals_own_memory_and_a_fresh_output(triton_examples_bundle, recorded, launches,
                                                                    target):
    ops = recorded(triton_examples_bundle, target=target)
    x, r, w = torch.randn(8, 1000), torch.randn(8, 1000), torch.randn(1000)
    out = ops.fused_add_rmsnorm(x, r, w, 1e-5)
    (launch,) = launches()
    spec = ops.fused_add_rmsnorm.manifest.specializations[0]
    assert spec.name == "f32_n1024"
    v = next(v for v in spec.variants if v.target.startswith(target))
    fields = {f.arg: f.offset for f in v.kernargs.fields if f.kind == "pointer"}
    buf = launch["kernargs"]
    assert _field(buf, fields["residual"]) == r.data_ptr()  # written in place: no copy, no fresh tensor
    assert _field(buf, fields["x"]) == x.data_ptr() and _field(buf, fields["out"]) == out.data_ptr()
    assert out.data_ptr() not in (x.data_ptr(), r.data_ptr())
    assert ops.accumulate(torch.zeros(5000), torch.ones(5000)) is None
    (launch,) = launches()
    assert tuple(launch["grid"]) == (5, 1, 1)


def test_opcheck_passes_through_the_recording_drivers_call_path(triton_examples_bundle, recorded):
    ops = recorded(triton_examples_bundle)
    lib = _lib(ops)
    # The recording driver runs no kernel, so the values the aot_dispatch test compares are not computed.
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    result = opcheck(lib.fused_add_rmsnorm.default, (torch.randn(8, 100), torch.randn(8, 100), torch.randn(100), 1e-5),
                     test_utils=tests)
    assert result == dict.fromkeys(tests, "SUCCESS")
    result = opcheck(lib.accumulate.default, (torch.randn(300), torch.randn(300), 0.5), test_utils=tests)
    assert result == dict.fromkeys(tests, "SUCCESS")


def test_an_input_written_in_place_that_shares_memory_with_another_input_is_refused(triton_examples_bundle,
                                                                                   recorded, launches):
    ops = recorded(triton_examples_bundle)
    r = torch.randn(8, 100)
    with pytest.raises(RuntimeError, match="input 'residual', which the kernel writes in place, shares memory with "
                                           "input 'x'"):
        ops.fused_add_rmsnorm(r, r, torch.randn(100))
    assert launches() == []


def test_the_flydsl_fused_add_rmsnorm_launches_on_the_residuals_own_memory(patterns_bundle, recorded, launches):
    for target in ("gfx942", "gfx950"):
        ops = recorded(patterns_bundle, target=target)
        handle = ops.fused_add_rmsnorm
        spec = handle.manifest.specializations[0]
        x, r, w, eps = example_inputs(handle.manifest, spec, "cpu")
        out = handle(x, r, w, eps)
        (launch,) = launches()
        v = next(v for v in spec.variants if v.target == target)
        fields = {f.arg: f.offset for f in v.kernargs.fields if f.kind == "pointer"}
        assert _field(launch["kernargs"], fields["residual"]) == r.data_ptr()
        assert _field(launch["kernargs"], fields["out"]) == out.data_ptr()
        assert tuple(launch["grid"]) == tuple(spec.example.grid) == (64, 1, 1)


@pytest.mark.parametrize("target", ["sm_90", "gfx942"])
def test_the_gpu_tests_shapes_dispatch_to_the_specializations_they_expect(ops, target):
    from tests.gpu.test_triton_inplace import DTYPES, ROWS

    for dt, dtype in DTYPES.items():
        for (m, n), block in ROWS.items():
            x, r, w = torch.randn(m, n).to(dtype), torch.randn(m, n).to(dtype), torch.randn(n).to(dtype)
            assert ops.fused_add_rmsnorm.dispatch(x, r, w, 1e-5, target=target).spec == f"{dt}_n{block}", (m, n)
    x, w = torch.randn(8, 300), torch.randn(300)
    column_major = torch.randn(300, 8).t()
    assert ops.fused_add_rmsnorm.dispatch(x, column_major, w, target=target).spec is None
    assert ops.fused_add_rmsnorm.dispatch(x, torch.randn(8, 300), w, target=target,
                                          out=torch.empty(8, 300)).spec == "f32_n1024"
    for n in (1, 1000, 1024, 5000, 1 << 20):
        assert ops.accumulate.dispatch(torch.randn(n), torch.randn(n), 0.25, target=target).spec == "f32"
