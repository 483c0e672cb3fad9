"""A functional call's outputs have the layout the op's fake kernel promises (a tensor of its own, contiguous) on
every path: a launch allocates them so, and a reference's result that is not so (the transposed result of
transposed inputs, a view of an input) is copied into such a tensor, on the CPU path (loader/cpu.py) and in the C++
fallback (csrc/python_calls.cpp, ``OpState::fallback``). ``torch.library.opcheck`` and torch.compile compare the
strides of real outputs with the fake kernel's."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

# The record path falls back for these layouts (the kernels take unit column strides) and warns once per reason.
pytestmark = [pytest.mark.cpu, pytest.mark.filterwarnings("ignore:.*running the PyTorch reference")]


def test_the_result_of_transposed_inputs_is_returned_contiguous(call_path):
    ops, _ = call_path
    x, y = torch.randn(64, 4), torch.randn(64, 4)  # add's reference on x.t(), y.t() gives strides (1, 4)
    out = ops.add(x.t(), y.t())
    assert out.stride() == (64, 1)
    torch.testing.assert_close(out, x.t() + y.t())
    w = torch.randn(64)
    out = ops.rmsnorm(x.t(), w, 1e-5)
    assert out.stride() == (64, 1)
    xt = x.t()
    torch.testing.assert_close(out, xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + 1e-5) * w)


@pytest.mark.parametrize("name", ["add", "rmsnorm", "softmax", "softmax_3d"])
def test_opcheck_passes_on_transposed_inputs(call_path, name):
    ops, _ = call_path
    x, y = torch.randn(64, 8), torch.randn(64, 8)
    x3 = torch.randn(2, 64, 8).transpose(1, 2)  # leading dims that flatten only by copying
    op, args = {"add": ("add", (x.t(), y.t())), "rmsnorm": ("rmsnorm", (x.t(), torch.randn(64), 1e-5)),
                "softmax": ("softmax", (x.t(),)), "softmax_3d": ("softmax", (x3,))}[name]
    opcheck(getattr(ops, op).default, args)
