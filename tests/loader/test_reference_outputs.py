"""What a reference returns, as the op hands it on, on both paths that run one: the CPU kernel (loader/cpu.py) and the
C++ fallback (csrc/python_calls.cpp ``OpState::call_reference``, on the recording driver for a target without code
objects). Both refuse what they cannot hand on with the same words, and neither hands on what the op never promises
(a Parameter, an output that requires grad)."""

from __future__ import annotations

import uuid
from typing import Any, Callable

import pytest
import torch

import flyship
from flyship.errors import CallError

pytestmark = [pytest.mark.cpu, pytest.mark.filterwarnings("ignore:.*running the PyTorch reference")]


@pytest.fixture(params=["cpu", "record"])
def with_references(request: pytest.FixtureRequest, triton_examples_bundle, ext,
                    recorded) -> Callable[[dict[str, Any]], Any]:
    """``with_references(refs)``: the Triton example ops with these references, on the CPU path or on the C++
    path's fallback (gfx90a: no code object fits, every call runs the reference)."""

    def make(references: dict[str, Any]) -> Any:
        if request.param == "cpu":
            return flyship.load(triton_examples_bundle, namespace=f"flyship_o{uuid.uuid4().hex[:8]}",
                                references=references)
        return recorded(triton_examples_bundle, target="gfx90a", references=references)

    return make


def test_a_reference_that_returns_an_in_place_inputs_new_value_is_told_to_write_that_input(with_references):
    ops = with_references({"accumulate": lambda acc, x, alpha: acc + alpha * x})
    with pytest.raises(CallError) as info:
        ops.accumulate(torch.zeros(64), torch.ones(64))
    message = str(info.value)
    assert "the kernel writes acc in place, so the reference must write acc in place too, e.g. " \
           "acc.copy_(new_value), and return None" in message
    assert "x.copy_" not in message


@pytest.mark.parametrize("overload", ["functional", "out"])
def test_a_sparse_reference_output_is_refused_saying_to_return_a_dense_one(with_references, overload):
    ops = with_references({"softmax": lambda x: torch.softmax(x, -1).to_sparse()})
    x = torch.randn(4, 64)
    with pytest.raises(CallError, match=r"softmax: the reference \(fallback\) returned output 'out' as a "
                                        r"torch\.sparse_coo tensor, expected a dense one \(torch\.strided\); return a "
                                        r"dense tensor from the reference \(e\.g\. result\.to_dense\(\)\)"):
        if overload == "out":
            ops.softmax.out(x, out=torch.empty(4, 64))
        else:
            ops.softmax(x)


@pytest.mark.parametrize("returned", ["Parameter", "requires_grad_"])
def test_a_reference_output_that_requires_grad_comes_back_as_a_plain_tensor_without_grad(with_references, returned):
    def ref(x, y):
        s = x + y
        return torch.nn.Parameter(s) if returned == "Parameter" else s.requires_grad_()

    ops = with_references({"add": ref})
    x, y = torch.randn(4, 64), torch.randn(4, 64)
    for got in (ops.add(x, y), getattr(torch.ops, ops.namespace).add(x, y)):
        assert type(got) is torch.Tensor
        assert not got.requires_grad and got.grad_fn is None
        torch.testing.assert_close(got, x + y)


def test_with_inputs_that_require_grad_the_output_gets_the_ops_history_not_the_references(with_references):
    ops = with_references({"add": lambda x, y: torch.nn.Parameter(x.detach() + y.detach())})
    x = torch.randn(4, 64, requires_grad=True)
    got = ops.add(x, torch.randn(4, 64))
    assert type(got) is torch.Tensor and got.requires_grad and not got.is_leaf
    with pytest.raises(RuntimeError, match="derivative for .*add is not implemented"):
        got.sum().backward()
