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
    assert ops.add.stats() == {"calls": 1, "launches": {"f32": 0, "f16": 0}, "fallbacks": {"cpu": 1}, "empty": 0}
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
