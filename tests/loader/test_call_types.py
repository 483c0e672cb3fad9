"""Arguments torch's argument parser refuses (a wrong type, an int beyond int64, an unknown keyword, too many
positional arguments, out tensors by position) are flyship CallTypeErrors saying what was expected and what to do,
on the C++ path (recording driver) and on the CPU path, as docs/loader.md promises; never torch's raw RuntimeError
with a type name or a whole tensor in it."""

from __future__ import annotations

import re

import pytest
import torch

from flyship.errors import CallTypeError

pytestmark = pytest.mark.cpu


@pytest.fixture(params=["record", "cpu"])
def ops(request, recorded_tiny, fresh_ops):
    return recorded_tiny() if request.param == "record" else fresh_ops()


X = torch.randn(4, 8)


@pytest.mark.parametrize("call, message", [
    (lambda o: o.scale_rows(X, None), "scale_rows: expected 'alpha' to be a float, got None; pass a Python float"),
    (lambda o: o.scale_rows(X, 1.0, 2**63),
     "scale_rows: expected 'bias' to be an int in the int64 range [-2**63, 2**63 - 1], got 9223372036854775808"),
    (lambda o: o.scale_rows(X, bias=1.5), "scale_rows: expected 'bias' to be an int, got float 1.5"),
    (lambda o: o.add(X, 3), "add: expected 'y' to be a tensor, got int 3; pass a torch.Tensor"),
    (lambda o: o.add(X, X, out=torch.empty(4, 8)),
     "add: expected keyword arguments among x, y, got out=a tensor of shape [4, 8]; the functional op returns "
     "fresh outputs: to write into a tensor you have, call .out(..., out=<tensor>)"),
    (lambda o: o.add(X, X, X), "add: expected at most 2 positional arguments (x, y), got 3"),
    (lambda o: o.add(X, x=X), "add: expected 'x' once, got it both by position and as x="),
    (lambda o: o.add.out(X, X, out=3), "add.out: expected out tensor out= to be a tensor, got int 3"),
    (lambda o: o.add.out(X, X, out=(torch.empty(4, 8),)),
     "add.out: expected out tensor out= to be a tensor, got a tuple of length 1"),
    (lambda o: o.add.out(X, X, torch.empty(4, 8)),
     "add.out: expected at most 2 positional arguments (the inputs x, y), got 3; the out tensors are keyword-only: "
     "pass out=<tensor>"),
    (lambda o: o.addsub.out(X, X, sum=torch.empty(4, 8), diff=torch.empty(4, 8), bogus=1),
     "addsub.out: expected keyword arguments among x, y, sum, diff, got bogus=int 1"),
])
def test_an_argument_torch_refuses_is_a_call_type_error_saying_what_to_pass(ops, call, message):
    with pytest.raises(CallTypeError, match=re.escape(message)) as e:
        call(ops)
    assert "tensor([" not in str(e.value)  # never a tensor's values in the message


def test_a_runtime_error_of_a_call_whose_arguments_fit_is_left_as_it_is(fresh_ops):
    ops = fresh_ops(references={"add": lambda x, y: (_ for _ in ()).throw(RuntimeError("the reference's own"))})
    with pytest.raises(RuntimeError, match="the reference's own") as e:
        ops.add(torch.randn(8), torch.randn(8))
    assert not isinstance(e.value, CallTypeError)
