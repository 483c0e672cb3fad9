"""Views with a math bit (``z.conj()``: the conjugate bit; ``z.conj().imag``: the negative bit) as arguments. torch's
math-bits fallback would run before flyship's kernel and read the op's return as the written tensor (the out variant
returns nothing): an INTERNAL ASSERT, then the process aborted. flyship's own kernel for those keys
(csrc/register.cpp MathBitsKernel) refuses a written one, naming it, and materializes a read-only one, on the C++
path and on the CPU path (which share it), for the functional op, its .out variant and ops that write an input."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flyship.errors import CallTypeError

pytestmark = pytest.mark.cpu


def _neg(shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 view with the negative bit (the imaginary part of a conjugated complex tensor)."""
    v = torch.randn(*shape, dtype=torch.complex64).conj().imag
    assert v.is_neg()
    return v


def _refused(ops: Any, ran: Any, call: Any, message: str) -> None:
    with pytest.raises(CallTypeError, match=message):
        call(ops)
    assert not ran(), "a refused call ran the kernel or the reference"


def test_an_out_tensor_with_the_negative_bit_is_refused_naming_it(call_path):
    _refused(*call_path, lambda ops: ops.add.out(torch.randn(4, 64), torch.randn(4, 64), out=_neg((4, 64))),
             r"add\.out: expected argument 'out', which the kernel writes, to be a tensor of its own, got a view "
             r"with the negative bit .*; pass out\.resolve_neg\(\) \(or out\.clone\(\)\)")


def test_an_out_tensor_with_the_conjugate_bit_is_refused_naming_it(call_path):
    out = torch.zeros(4, 64, dtype=torch.complex64).conj()
    _refused(*call_path, lambda ops: ops.add.out(torch.randn(4, 64), torch.randn(4, 64), out=out),
             r"add\.out: expected argument 'out', which the kernel writes, .* got a view with the conjugate bit "
             r".*; pass out\.resolve_conj\(\)")


def test_an_input_written_in_place_with_the_negative_bit_is_refused_naming_it(call_path):
    _refused(*call_path, lambda ops: ops.fused_add_rmsnorm(torch.randn(4, 64), _neg((4, 64)), torch.randn(64)),
             r"fused_add_rmsnorm: expected argument 'residual', which the kernel writes, .* negative bit")
    _refused(*call_path, lambda ops: ops.accumulate(_neg((64,)), torch.randn(64)),
             r"accumulate: expected argument 'acc', which the kernel writes, .* negative bit")


def test_an_input_written_in_place_is_refused_also_through_torch_ops(call_path):
    ops, ran = call_path
    lib = getattr(torch.ops, ops.namespace)
    _refused(lib, ran, lambda lib: lib.fused_add_rmsnorm.out(torch.randn(4, 64), _neg((4, 64)), torch.randn(64),
                                                             out=torch.empty(4, 64)),
             r"fused_add_rmsnorm\.out: expected argument 'residual'")


@pytest.mark.filterwarnings("ignore:.*running the PyTorch reference")
@pytest.mark.parametrize("path", ["cpu", "record fallback"])
def test_a_read_only_input_with_the_negative_bit_runs_on_its_values(path, triton_examples_bundle, ext, recorded):
    import uuid

    import flyship

    if path == "cpu":
        ops = flyship.load(triton_examples_bundle, namespace=f"flyship_n{uuid.uuid4().hex[:8]}")
    else:  # a target without code objects: the C++ path runs the reference
        ops = recorded(triton_examples_bundle, target="gfx90a")
    x, y = _neg((4, 64)), torch.randn(4, 64)
    got = ops.add(x, y)
    torch.testing.assert_close(got, x.resolve_neg() + y)
    assert not got.is_neg()
    out = torch.empty(4, 64)
    ops.add.out(y, x, out=out)
    torch.testing.assert_close(out, x.resolve_neg() + y)
    r = torch.randn(4, 64)
    r0 = r.clone()
    w = torch.randn(64)
    ops.fused_add_rmsnorm(x, r, w)  # the written input is plain, a read-only one has the bit
    torch.testing.assert_close(r, r0 + x.resolve_neg())


def test_a_read_only_input_with_the_negative_bit_reaches_the_kernel_as_a_materialized_copy(
        triton_examples_bundle, recorded, launches):
    ops = recorded(triton_examples_bundle)
    z = torch.randn(4, 64, dtype=torch.complex64)
    x = z.conj().imag
    ops.add(x, torch.randn(4, 64))
    (launch,) = launches()
    # the kernel reads memory, not the bit: it must be handed the negated values, never the view's storage
    assert x.data_ptr().to_bytes(8, "little") not in bytes(launch["kernargs"])

