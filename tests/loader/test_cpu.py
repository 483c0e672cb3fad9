"""CPU tensors run the op's PyTorch reference: real numbers for opcheck, unit tests and CPU-only CI."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from flyship.errors import FlyshipError

pytestmark = pytest.mark.cpu


def test_a_call_on_cpu_tensors_runs_the_reference_and_counts_it_under_cpu(fresh_ops):
    ops = fresh_ops()
    x, y = torch.randn(16), torch.randn(16)
    torch.testing.assert_close(ops.add(x, y), x + y)
    s, d = ops.addsub(x, y)
    torch.testing.assert_close((s, d), (x + y, x - y))
    torch.testing.assert_close(ops.scale_rows(x.view(4, 4), 2.0, 1), x.view(4, 4) * 2 + 1)
    assert ops.add.stats() == {"calls": 1, "launches": {"f32": 0, "f16": 0}, "fallbacks": {"cpu": 1}, "empty": 0,
                                 "original": 0}
    ops.add.reset_stats()
    assert ops.add.stats()["calls"] == 0


def test_the_out_variant_on_cpu_writes_the_reference_result_into_out(fresh_ops):
    ops = fresh_ops()
    x, y, out = torch.randn(8), torch.randn(8), torch.empty(8)
    v = out._version
    assert ops.add.out(x, y, out=out) is out
    torch.testing.assert_close(out, x + y)
    assert out._version > v
    s, d = torch.empty(8), torch.empty(8)
    ops.addsub.out(x, y, sum=s, diff=d)
    torch.testing.assert_close((s, d), (x + y, x - y))


def test_a_cpu_call_with_the_fallback_off_raises_saying_how_to_fix_it(fresh_ops):
    ops = fresh_ops(fallback=False)
    with pytest.raises(FlyshipError, match=r"got CPU tensors and the fallback is off .*move inputs with \.cuda\(\)"):
        ops.add(torch.randn(4), torch.randn(4))
    assert ops.add.stats()["calls"] == 0


def test_a_cpu_output_that_aliases_an_input_is_copied(fresh_ops):
    ops = fresh_ops(references={"add": lambda x, y: x})
    x = torch.randn(4)
    out = ops.add(x, torch.randn(4))
    assert out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(out, x)


def test_a_reference_whose_output_breaks_the_output_rule_is_refused_on_cpu(fresh_ops):
    ops = fresh_ops(references={"add": lambda x, y: torch.cat([x, y])})
    with pytest.raises(FlyshipError, match=r"returned output 'out' of shape \[8\].*rule gives \[4\]"):
        ops.add(torch.randn(4), torch.randn(4))


@pytest.mark.parametrize("name", ["add", "scale_rows", "addsub"])
def test_opcheck_passes_on_cpu_tensors_of_the_tiny_bundle(fresh_ops, name):
    ops = fresh_ops()
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    args = {"add": (x.flatten(), y.flatten()), "scale_rows": (x, 0.5, 2), "addsub": (x.flatten(), y.flatten())}[name]
    opcheck(getattr(torch.ops, ops.namespace).__getattr__(name).default, args)


def test_opcheck_passes_on_cpu_tensors_of_the_flydsl_example_bundle(example_bundle, ext):
    import uuid

    import flyship

    ops = flyship.load(example_bundle, namespace=f"flyship_cpu{uuid.uuid4().hex[:8]}")
    x, w = torch.randn(8, 32), torch.randn(32)
    opcheck(ops.rmsnorm.default, (x, w, 1e-5))
    opcheck(ops.softmax.default, (x,))
    ops.rmsnorm.reset_stats()
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(ops.rmsnorm(x, w, 1e-5), want, atol=1e-5, rtol=1e-5)
    assert ops.rmsnorm.stats()["fallbacks"] == {"cpu": 1}


def test_inputs_whose_sizes_do_not_fit_together_blame_the_argument_not_the_reference(fresh_ops):
    ops = fresh_ops()
    with pytest.raises(FlyshipError, match=r"input 'y' does not fit the others: expected x.shape\[0\] == y.shape\[0\], "
                                           r"got x.shape\[0\] = 8, y.shape\[0\] = 5 \(x of shape \[8\], y of shape "
                                           r"\[5\]\), and the reference \(fallback\) raised RuntimeError: .*; pass 'y' "
                                           r"of a shape that fits"):
        ops.add(torch.randn(8), torch.randn(5))


def test_a_misfit_the_reference_serves_runs_on_cpu_as_the_gpu_fallback_would(fresh_ops):
    ops = fresh_ops()
    x, y = torch.randn(8), torch.randn(1)
    torch.testing.assert_close(ops.add(x, y), x + y)  # the guard refuses it, the reference broadcasts


def _load(bundle):
    import uuid

    import flyship

    return flyship.load(bundle, namespace=f"flyship_fit{uuid.uuid4().hex[:8]}")


@pytest.mark.parametrize("op, args, blamed, constraint, got", [
    ("rmsnorm", lambda: (torch.randn(4, 256), torch.randn(100)), "w", "w.shape[0] == x.shape[1]",
     "w.shape[0] = 100, x.shape[1] = 256"),
    ("gemm", lambda: (torch.randn(128, 64).bfloat16(), torch.randn(128, 32).bfloat16()), "b",
     "b.shape[1] == a.shape[1]", "b.shape[1] = 32, a.shape[1] = 64"),
    ("gemm", lambda: (torch.randn(128, 64), torch.randn(128, 32)), "b", "b.shape[1] == a.shape[1]",
     "b.shape[1] = 32, a.shape[1] = 64"),  # the dtypes are wrong too, but the K mismatch is what fails
], ids=["rmsnorm-weight-length", "gemm-k", "gemm-k-f32"])
def test_example_ops_blame_the_argument_whose_size_does_not_fit(example_bundle, ext, op, args, blamed, constraint,
                                                                 got):
    import re

    with pytest.raises(FlyshipError, match=rf"input '{blamed}' does not fit the others: expected "
                                           rf"{re.escape(constraint)}, got {re.escape(got)} .*; pass '{blamed}' of a "
                                           "shape that fits") as e:
        getattr(_load(example_bundle), op)(*args())
    assert str(e.value).index("does not fit") < str(e.value).index("the reference (fallback) raised")


def test_a_residual_with_the_wrong_row_count_is_blamed_on_cpu(patterns_bundle, ext):
    with pytest.raises(FlyshipError, match=r"input 'residual' does not fit the others: expected residual.shape\[0\] == "
                                           r"x.shape\[0\], got residual.shape\[0\] = 3, x.shape\[0\] = 4"):
        _load(patterns_bundle).fused_add_rmsnorm(torch.randn(4, 256), torch.randn(3, 256), torch.randn(256))


def test_accumulate_lengths_that_differ_are_blamed_on_cpu(triton_examples_bundle, ext):
    with pytest.raises(FlyshipError, match=r"input 'x' does not fit the others: expected x.shape\[0\] == "
                                           r"acc.shape\[0\], got x.shape\[0\] = 7, acc.shape\[0\] = 10"):
        _load(triton_examples_bundle).accumulate(torch.zeros(10), torch.ones(7), 2.0)
