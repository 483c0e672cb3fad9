"""A reference that fails because the inputs do not fit together is blamed on the argument, in the same words on
every call path: loader/blame.py owns the rule; the CPU kernel (loader/cpu.py) and the C++ core's fallback
(``OpState::call_reference``, csrc/python_calls.cpp, on the recording driver here) both ask it."""

from __future__ import annotations

import re

import pytest
import torch

from flyship.errors import CallError

pytestmark = [pytest.mark.cpu, pytest.mark.filterwarnings("ignore:.*running the PyTorch reference")]

# accumulate(acc, x, alpha): acc += alpha * x in place; its guards relate x.shape[0] == acc.shape[0].
MISFIT = (r"flyship {ns}::accumulate: input 'x' does not fit the others: expected x.shape\[0\] == acc.shape\[0\], "
          r"got x.shape\[0\] = 7, acc.shape\[0\] = 10 \(acc of shape \[10\], x of shape \[7\]\), and the reference "
          r"\(fallback\) raised RuntimeError: (?P<torch>.+); pass 'x' of a shape that fits the others as the "
          r"constraint says")


def _misfit_message(ops) -> str:
    with pytest.raises(CallError) as e:
        ops.accumulate(torch.zeros(10), torch.ones(7), 2.0)
    return str(e.value)


def ops_free(message: str, namespace: str) -> str:
    """The message with the op's namespace (each load's own) as ``<ns>``."""
    return message.replace(namespace, "<ns>")


def test_a_misfit_call_is_blamed_on_the_argument_on_every_call_path(call_path):
    ops, _ = call_path
    got = _misfit_message(ops)
    m = re.fullmatch(MISFIT.format(ns=ops.namespace), got)
    assert m is not None, got
    assert "(10)" in m["torch"] and "(7)" in m["torch"]  # torch's own words about the sizes, kept


def test_the_cpu_path_and_the_cpp_fallback_give_the_same_message_for_a_misfit(triton_examples_bundle, ext, recorded):
    import uuid

    import flyship

    cpu = flyship.load(triton_examples_bundle, namespace=f"flyship_b{uuid.uuid4().hex[:8]}")
    record = recorded(triton_examples_bundle)
    assert ops_free(_misfit_message(cpu), cpu.namespace) == ops_free(_misfit_message(record), record.namespace)


def test_the_tiny_bundles_misfit_reads_the_same_on_the_cpu_and_the_cpp_path(fresh_ops, recorded_tiny):
    messages = []
    for ops in (fresh_ops(), recorded_tiny()):
        with pytest.raises(CallError) as e:
            ops.add(torch.randn(8), torch.randn(5))
        messages.append(ops_free(str(e.value), ops.namespace))
    assert messages[0] == messages[1]
    assert "input 'y' does not fit the others: expected x.shape[0] == y.shape[0], got x.shape[0] = 8, " in messages[1]


def test_a_blame_that_fails_is_said_beside_the_references_failure_on_the_cpp_path(recorded_tiny, monkeypatch):
    from flyship.loader import blame as _blame

    ops = recorded_tiny()

    def broken(*args):
        raise ValueError("boom")

    monkeypatch.setattr(_blame, "blame", broken)
    with pytest.raises(CallError, match=r"::add: the reference \(fallback\) raised RuntimeError: .*; fix the "
                                        r"reference \(flyship could not check the inputs for the cause: ValueError: "
                                        r"boom\)$"):
        ops.add(torch.randn(8), torch.randn(5))
