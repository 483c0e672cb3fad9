"""Memory a kernel writes must be its own: out= tensors and inputs written in place may not overlap an input, each
other, or themselves (an ``expand()``ed view). The C++ core owns the rule (csrc/bind.cpp); a call on CPU tensors
(the reference runs) is checked by that same code, so both paths refuse the same calls with the same message,
before anything runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import flyship
from flyship.errors import BundleError, CallError, CallTypeError

pytestmark = pytest.mark.cpu


def _refused(ops: Any, ran: Any, call: Any, message: str, error: type = CallError) -> None:
    with pytest.raises(error, match=message):
        call(ops)
    assert not ran(), "a refused call ran the kernel or the reference"


def test_an_out_tensor_that_is_an_input_is_refused(call_path):
    x, y = torch.randn(4, 64), torch.randn(4, 64)
    _refused(*call_path, lambda ops: ops.add.out(x, y, out=x), r"out tensor 'out' shares memory with input 'x'")


def test_an_out_tensor_whose_elements_share_memory_is_refused(call_path):
    x, y = torch.randn(4, 64), torch.randn(4, 64)
    _refused(*call_path, lambda ops: ops.add.out(x, y, out=torch.empty(1, 64).expand(4, 64)),
             r"out tensor 'out', which the kernel writes, has elements that share memory \(strides \[0, 1\] for "
             r"shape \[4, 64\], e\.g\. from expand\(\)\)")


def test_an_input_written_in_place_that_is_another_input_is_refused(call_path):
    r = torch.randn(8, 100)
    _refused(*call_path, lambda ops: ops.fused_add_rmsnorm(r, r, torch.randn(100)),
             r"input 'residual', which the kernel writes in place, shares memory with input 'x'")


def test_an_input_written_in_place_whose_elements_share_memory_is_refused(call_path):
    acc = torch.zeros(1).expand(64)
    _refused(*call_path, lambda ops: ops.accumulate(acc, torch.ones(64), 2.0),
             r"input 'acc', which the kernel writes, has elements that share memory")


def test_an_out_tensor_whose_rows_overlap_each_other_is_refused(call_path):
    # Row i is elements i..i+7 of one storage: torch's has_internal_overlap says TooHard (not Yes) for it.
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    _refused(*call_path, lambda ops: ops.add.out(x, y, out=torch.empty(64).as_strided((4, 8), (1, 1))),
             r"out tensor 'out', which the kernel writes, has elements that share memory \(strides \[1, 1\] for "
             r"shape \[4, 8\].*pass a tensor whose elements do not overlap \(\.clone\(\) or \.contiguous\(\)\)")


def test_an_input_written_in_place_whose_rows_overlap_is_refused(call_path):
    residual = torch.randn(200).as_strided((8, 100), (1, 1))
    _refused(*call_path, lambda ops: ops.fused_add_rmsnorm(torch.randn(8, 100), residual, torch.randn(100), 1e-6),
             r"input 'residual', which the kernel writes, has elements that share memory \(strides \[1, 1\]")


@pytest.mark.parametrize("view", ["column slice", "transposed", "every other row", "every other column"])
def test_written_views_whose_elements_are_apart_are_accepted(call_path, view):
    # torch's has_internal_overlap says TooHard for all but the transposed one; their strides prove them apart.
    ops, _ = call_path
    x, y = torch.randn(4, 64), torch.randn(4, 64)
    out = {"column slice": lambda: torch.empty(4, 128)[:, :64], "transposed": lambda: torch.empty(64, 4).t(),
           "every other row": lambda: torch.empty(8, 64)[::2],
           "every other column": lambda: torch.empty(4, 128)[:, ::2]}[view]()
    ops.add.out(x, y, out=out)
    torch.testing.assert_close(out, x + y)
    residual = torch.randn(8, 200)[:, :100]  # an input written in place through a column slice: not refused
    ops.fused_add_rmsnorm(torch.ones(8, 100), residual, torch.ones(100), 1e-6)


def test_none_for_a_tensor_is_refused_naming_the_argument(call_path):
    _refused(*call_path, lambda ops: ops.add(None, torch.randn(4, 64)), r"expected a tensor for argument 'x', got None",
             CallTypeError)


def test_calls_that_share_no_memory_still_run(call_path):
    ops, ran = call_path
    x, y = torch.randn(4, 64), torch.randn(4, 64)
    out = torch.empty(8, 64)
    ops.add.out(x, y, out=out[4:])  # another part of one storage is not an overlap
    assert ran()


def test_an_empty_namespace_is_refused_instead_of_using_the_manifests(triton_examples_bundle, ext):
    with pytest.raises(BundleError, match="namespace: expected an ASCII identifier .* got ''"):
        flyship.load(triton_examples_bundle, namespace="")
