"""The fast eager entry (csrc/fast_call.cpp) on a GPU: ``ops.<op>(...)`` and ``ops.<op>.out(...)`` launch the
same kernels as ``torch.ops`` with equal results, take plain calls themselves and hand the rest (grad needed, a
TorchDispatchMode, a tensor subclass, CPU tensors, a fallback) to torch.ops; the bench's fast rows measure it.
"""

from __future__ import annotations

import pytest
import torch

from .conftest import counting

pytestmark = pytest.mark.gpu


def fast_counts(ops, handle) -> tuple[int, int]:
    c = ops._ext.fast_call_counts(handle)
    return c["fast"], c["dispatcher"]


def test_the_fast_entry_launches_the_kernel_and_equals_the_torch_op(ops, refs):
    x = torch.randn(37, 1000, device="cuda")
    y = torch.randn(37, 1000, device="cuda")
    before = fast_counts(ops, ops.add)
    with counting(ops.add) as c:
        got = ops.add(x, y)
        want = torch.ops.flyship_triton.add(x, y)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got, refs.add_ref(x, y))
    assert c.launches == {"f32": 2} and not c.fallbacks
    after = fast_counts(ops, ops.add)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)


def test_the_fast_out_variant_writes_the_out_tensor_on_the_current_stream(ops, refs):
    x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    out = torch.full_like(x, float("nan"))
    before = fast_counts(ops, ops.softmax.out)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        r = ops.softmax.out(x, out=out)
        got = out.to("cpu")
    assert r is out
    torch.testing.assert_close(got, refs.softmax_ref(x).cpu(), **refs.TOLERANCES[x.dtype])
    after = fast_counts(ops, ops.softmax.out)
    assert after[0] - before[0] == 1 and after[1] == before[1]


class _Seen(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_calls_the_fast_entry_must_not_take_go_through_torch_ops(ops, refs):
    x = torch.randn(8, 1024, device="cuda")
    before = fast_counts(ops, ops.add)
    with _Seen() as mode:  # a dispatch mode sees the op
        ops.add(x, x)
    assert "flyship_triton.add.default" in mode.seen
    g = x.clone().requires_grad_()
    y = ops.add(g, x)  # grad needed: autograd's kernel; backward raises torch's error
    assert y.requires_grad
    with pytest.raises(RuntimeError, match="derivative for flyship_triton::add is not implemented"):
        y.sum().backward()
    cpu = ops.add(x.cpu(), x.cpu())  # CPU tensors: the reference through the CPU kernel
    torch.testing.assert_close(cpu, (x + x).cpu())
    after = fast_counts(ops, ops.add)
    assert after[1] - before[1] == 3 and after[0] == before[0]


def test_torch_compile_traces_the_handles_into_one_graph_on_this_torch(ops, refs):
    from torch import _dynamo  # a plain `import torch._dynamo` here would make `torch` a local name

    def f(x, y, o):
        ops.add.out(x, y, out=o)
        return ops.softmax(ops.add(x, o))

    x, y = torch.randn(64, 1000, device="cuda"), torch.randn(64, 1000, device="cuda")
    explained = _dynamo.explain(f)(x, y, torch.empty_like(x))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    _dynamo.reset()
    got = torch.compile(f, fullgraph=True)(x, y, torch.empty_like(x))
    want = refs.softmax_ref(refs.add_ref(x, refs.add_ref(x, y)))
    torch.testing.assert_close(got, want, **refs.TOLERANCES[torch.float32])


# torch.ops.<ns>.<op>, .default and .out themselves through the fast entry (loader/torchops.py,
# csrc/torch_op_call.cpp): each skipif says what the test would prove on a GPU.
OWN_PACKET_CALL = torch._ops.OpOverloadPacket.__call__  # torch's own path through the same objects
OWN_CALL = torch._ops.OpOverload.__call__
NO_GPU = not torch.cuda.is_available()


@pytest.mark.skipif(NO_GPU, reason="needs a GPU: would prove that torch.ops.<ns>.add, .default and .out launch the "
                                   "kernel through the fast entry with results equal to torch's own __call__ and the "
                                   "reference, and that .out returns None as its schema says")
def test_torch_ops_calls_take_the_fast_entry_and_equal_torchs_own_call(ops, refs):
    op = torch.ops.flyship_triton.add
    x, y = torch.randn(37, 1000, device="cuda"), torch.randn(37, 1000, device="cuda")
    before = [fast_counts(ops, o) for o in (op, op.default, op.out)]
    got = [op(x, y), op.default(x, y)]
    out = torch.full_like(x, float("nan"))
    assert op.out(x, y, out=out) is None
    got.append(out)
    want = [OWN_PACKET_CALL(op, x, y), OWN_CALL(op.default, x, y)]
    own_out = torch.full_like(x, float("nan"))
    assert OWN_CALL(op.out, x, y, out=own_out) is None
    want.append(own_out)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
        torch.testing.assert_close(g, refs.add_ref(x, y))
    after = [fast_counts(ops, o) for o in (op, op.default, op.out)]
    assert [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before)] == [(1, 0), (1, 0), (1, 0)]


@pytest.mark.skipif(NO_GPU, reason="needs a GPU: would prove that torch.ops.<ns>.softmax.out through the fast entry "
                                   "writes its out tensor on torch's current (side) stream")
def test_torch_ops_out_writes_on_the_current_stream(ops, refs):
    op = torch.ops.flyship_triton.softmax
    x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    out = torch.full_like(x, float("nan"))
    before = fast_counts(ops, op.out)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert op.out(x, out=out) is None
        got = out.to("cpu")
    torch.testing.assert_close(got, refs.softmax_ref(x).cpu(), **refs.TOLERANCES[x.dtype])
    assert fast_counts(ops, op.out)[0] - before[0] == 1


@pytest.mark.skipif(NO_GPU, reason="needs a GPU: would prove that torch.ops calls needing a graph, a dispatch mode "
                                   "or CPU tensors take torch's own path on a GPU build, with torch's results")
def test_torch_ops_calls_the_fast_rule_refuses_take_torchs_path(ops, refs):
    op = torch.ops.flyship_triton.add
    x = torch.randn(8, 1024, device="cuda")
    before = fast_counts(ops, op.default)
    with _Seen() as mode:
        op.default(x, x)
    assert "flyship_triton.add.default" in mode.seen
    y = op.default(x.clone().requires_grad_(), x)
    assert y.requires_grad
    torch.testing.assert_close(op.default(x.cpu(), x.cpu()), (x + x).cpu())
    after = fast_counts(ops, op.default)
    # the mode's own func(...) call runs with the mode off the stack: the fast entry may take that one
    assert after[1] - before[1] == 3 and after[0] - before[0] <= 1
