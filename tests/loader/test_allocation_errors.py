"""Running out of memory is not a refused call: torch's OutOfMemoryError (what code that frees memory and retries
catches) leaves a call as itself, from the reference on the CPU path (loader/cpu.py) and in the C++ fallback
(csrc/python_calls.cpp); any other allocator failure in the C++ core (the CPU allocator's is a plain RuntimeError)
says what flyship was allocating (``OpState::allocate``)."""

from __future__ import annotations

import pytest
import torch

from flyship.errors import CallError

pytestmark = [pytest.mark.cpu, pytest.mark.filterwarnings("ignore:.*running the PyTorch reference")]


def _out_of_memory(*args):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("where", ["cpu", "record"])
def test_out_of_memory_in_the_reference_leaves_as_torchs_own_error(fresh_ops, recorded_tiny, where):
    make = fresh_ops if where == "cpu" else recorded_tiny
    ops = make(references={"add": _out_of_memory})
    x = torch.randn(8, dtype=torch.float64)  # fits no specialization: the record path falls back too
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 2.00 GiB") as e:
        ops.add(x, x)
    assert not isinstance(e.value, CallError)
    with pytest.raises(torch.OutOfMemoryError):
        ops.add.out(x, x, out=torch.empty(8, dtype=torch.float64))


def test_an_output_the_allocator_cannot_give_is_refused_naming_it(triton_examples_bundle, recorded, launches):
    ops = recorded(triton_examples_bundle, fallback=False)
    # Legal inputs of 128 bytes each (row stride 0) whose output is 2 TiB: more than this machine has.
    a = torch.randn(1, 64, dtype=torch.bfloat16).expand(1 << 20, 64)
    with pytest.raises(CallError, match=r"::gemm: allocating output 'c' of shape \[1048576, 1048576\] and dtype "
                                        r"bfloat16 \(2199023255552 bytes\) on cpu failed: .*DefaultCPUAllocator.*; "
                                        r"free memory or pass smaller inputs"):
        ops.gemm(a, a)
    assert launches() == []
