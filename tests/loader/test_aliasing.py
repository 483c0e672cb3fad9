"""Memory a kernel writes must be its own: out= tensors and inputs written in place may not overlap an input, each
other, or themselves (an ``expand()``ed view). The C++ core owns the rule (csrc/bind.cpp); a call on CPU tensors
(the reference runs) is checked by that same code, so both paths refuse the same calls with the same message,
before anything runs."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch

import flyship
from flyship.errors import BundleError, CallError, CallTypeError

pytestmark = pytest.mark.cpu


@pytest.fixture(params=["cpu", "record"])
def path(request, triton_examples_bundle, ext, recorded, launches) -> tuple[Any, Any]:
    """The example ops on one call path, and a function that says whether anything ran on it (a launch on the
    recording driver; a reference call on the CPU path)."""
    if request.param == "record":
        ops = recorded(triton_examples_bundle)
        return ops, lambda: bool(launches())
    ops = flyship.load(triton_examples_bundle, namespace=f"flyship_a{uuid.uuid4().hex[:8]}")
    return ops, lambda: any(h.stats()["fallbacks"].get("cpu", 0) for h in ops)


def _refused(ops: Any, ran: Any, call: Any, message: str, error: type = CallError) -> None:
    with pytest.raises(error, match=message):
        call(ops)
    assert not ran(), "a refused call ran the kernel or the reference"


def test_an_out_tensor_that_is_an_input_is_refused(path):
    x, y = torch.randn(4, 64), torch.randn(4, 64)
    _refused(*path, lambda ops: ops.add.out(x, y, out=x), r"out tensor 'out' shares memory with input 'x'")


def test_an_out_tensor_whose_elements_share_memory_is_refused(path):
    x, y = torch.randn(4, 64), torch.randn(4, 64)
    _refused(*path, lambda ops: ops.add.out(x, y, out=torch.empty(1, 64).expand(4, 64)),
             r"out tensor 'out', which the kernel writes, has elements that share memory \(strides \[0, 1\] for "
             r"shape \[4, 64\], e\.g\. from expand\(\)\)")


def test_an_input_written_in_place_that_is_another_input_is_refused(path):
    r = torch.randn(8, 100)
    _refused(*path, lambda ops: ops.fused_add_rmsnorm(r, r, torch.randn(100)),
             r"input 'residual', which the kernel writes in place, shares memory with input 'x'")


def test_an_input_written_in_place_whose_elements_share_memory_is_refused(path):
    acc = torch.zeros(1).expand(64)
    _refused(*path, lambda ops: ops.accumulate(acc, torch.ones(64), 2.0),
             r"input 'acc', which the kernel writes, has elements that share memory")


def test_none_for_a_tensor_is_refused_naming_the_argument(path):
    _refused(*path, lambda ops: ops.add(None, torch.randn(4, 64)), r"expected a tensor for argument 'x', got None",
             CallTypeError)


def test_calls_that_share_no_memory_still_run(path):
    ops, ran = path
    x, y = torch.randn(4, 64), torch.randn(4, 64)
    out = torch.empty(8, 64)
    ops.add.out(x, y, out=out[4:])  # another part of one storage is not an overlap
    assert ran()


def test_an_empty_namespace_is_refused_instead_of_using_the_manifests(triton_examples_bundle, ext):
    with pytest.raises(BundleError, match="namespace: expected an ASCII identifier .* got ''"):
        flyship.load(triton_examples_bundle, namespace="")
