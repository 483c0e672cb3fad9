"""Autograd pairs whose forward writes an input in place (schema 5.0, examples/triton/training.py: ``rope_inplace``
and ``ce_fwd_inplace``), on the CPU: autograd's rules as ``torch.autograd.Function`` + ``ctx.mark_dirty`` give them.

The CPU path runs each op's reference (the bundle's references.py), so gradients are real numbers checked against
torch's own; the recording driver runs the real C++ path (no data is written there, so only flyship's count of the
write can bump the version). The GPU proof is tests/gpu/test_training.py, the cost bench/inplace_pair.py.
"""

from __future__ import annotations

import struct
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from flyship.errors import CallError

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def ops(training_bundle: Path, ext: Any) -> Any:
    import flyship

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fallback warning per op: CPU calls run the references
        return flyship.load(training_bundle, namespace=f"flyship_ti{uuid.uuid4().hex[:8]}")


@pytest.fixture(autouse=True)
def quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def leaf(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half) in torch ops: the yardstick."""
    h = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x[..., :h] * c - x[..., h:] * s, x[..., h:] * c + x[..., :h] * s], dim=-1)


def angles(t: int, half: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    theta = torch.randn(t, half, dtype=dtype)
    return theta.cos(), theta.sin()


def test_rope_in_place_passes_gradcheck_and_writes_the_callers_tensor(ops):
    torch.manual_seed(0)
    cos, sin = angles(4, 3, torch.float64)

    def fn(w: torch.Tensor) -> torch.Tensor:
        q = w * 1.0  # a tensor of its own, written in place by the op
        assert ops.rope_inplace(q, cos, sin) is None  # the op returns its outputs (none): q itself is the result
        return q

    w = leaf(4, 2, 6, dtype=torch.float64)
    assert torch.autograd.gradcheck(fn, (w,))
    q = w.detach().clone()
    ops.rope_inplace(q, cos, sin)
    torch.testing.assert_close(q, rotate(w.detach(), cos, sin))


def test_rope_in_place_gives_torchs_gradient_through_later_ops_and_bumps_the_version(ops):
    torch.manual_seed(1)
    cos, sin = angles(5, 4)
    w = leaf(5, 2, 8)
    q = w * 2
    before = q._version
    ops.rope_inplace(q, cos, sin)
    assert q._version > before and type(q.grad_fn).__name__ == "flyship_rope_inplaceBackward"
    g = torch.randn(5, 2, 8)
    (q.square() * g).sum().backward()
    w2 = w.detach().clone().requires_grad_()
    (rotate(w2 * 2, cos, sin).square() * g).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)


def test_cross_entropy_in_place_gives_torchs_loss_and_gradient_and_leaves_the_gradient_in_the_logits(ops):
    torch.manual_seed(2)
    x0 = leaf(12, 300)
    target = torch.randint(0, 300, (12,))
    target[[2, 7]] = -100
    logits = x0 * 1.5
    loss = ops.ce_fwd_inplace(logits, target)
    mean = loss.sum() / (target != -100).sum()
    x1 = x0.detach().clone().requires_grad_()
    ref = F.cross_entropy(x1 * 1.5, target, ignore_index=-100)
    torch.testing.assert_close(mean, ref)
    # the forward wrote softmax - onehot over the logits (zero rows where ignored)
    expect = torch.softmax(x1.detach() * 1.5, -1) - F.one_hot(target.clamp(min=0), 300)
    expect[[2, 7]] = 0
    torch.testing.assert_close(logits.detach(), expect)
    mean.backward()
    ref.backward()
    torch.testing.assert_close(x0.grad, x1.grad)


def test_a_view_of_a_tensor_computed_from_a_leaf_is_written_and_its_base_gets_the_gradient(ops):
    # as torch rebases an in-place write on a view: the base's history gets a CopySlices node
    torch.manual_seed(3)
    cos, sin = angles(4, 4)
    w = leaf(4, 3, 8)
    base = w * 1
    ops.rope_inplace(base[:, 1:], cos, sin)
    assert type(base.grad_fn).__name__ == "CopySlices"
    g = torch.randn(4, 3, 8)
    (base * g).sum().backward()
    w2 = w.detach().clone().requires_grad_()
    b2 = w2 * 1
    ref = torch.cat([b2[:, :1], rotate(b2[:, 1:], cos, sin)], dim=1)
    (ref * g).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)


def _refusals(w: torch.Tensor) -> dict[str, tuple[torch.Tensor, str]]:
    base = w * 1
    return {
        "leaf": (w, r"expected 'q' that is not a leaf tensor requiring grad"),
        "view of a leaf": (w[:, :1], r"expected 'q' that is not a view of a leaf tensor that requires grad"),
        "chunk": (base.chunk(2, dim=1)[0], r"got an output of a function that returns several views"),
    }


@pytest.mark.parametrize("case", ["leaf", "view of a leaf", "chunk"])
def test_what_autograd_refuses_to_write_in_place_is_refused_before_the_kernel_writes(ops, case):
    cos, sin = angles(4, 4)
    w = leaf(4, 2, 8)
    q, message = _refusals(w)[case]
    before = q.detach().clone()
    with pytest.raises(CallError, match=rf"flyship {ops.namespace}::rope_inplace: .*{message}"):
        ops.rope_inplace(q, cos, sin)
    assert torch.equal(q.detach(), before)  # refused before the kernel ran: nothing changed
    with torch.no_grad():  # as for torch's in-place ops, an update under no_grad is the caller's to make
        ops.rope_inplace(q, cos, sin)
    torch.testing.assert_close(q.detach(), rotate(before, cos, sin))


def test_a_view_made_in_no_grad_mode_is_refused_as_torch_refuses_it(ops):
    cos, sin = angles(4, 4)
    base = leaf(4, 2, 8) * 1
    with torch.no_grad():
        v = base[:, :1]
    with pytest.raises(CallError, match=r"got a view made in no-grad mode"):
        ops.rope_inplace(v, cos, sin)


def test_a_tensor_another_op_saved_is_never_read_stale_autograd_refuses_the_backward(ops):
    cos, sin = angles(4, 4)
    w = leaf(4, 2, 8)
    q = w * 1
    held = q * q  # mul saves q for its backward
    ops.rope_inplace(q, cos, sin)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation.*output 0 of flyship_rope_inplace"):
        held.sum().backward()
    x0 = leaf(6, 20)
    x = x0 * 1
    p = x.sigmoid()  # sigmoid saves its output, not x: x may be written
    loss = ops.ce_fwd_inplace(x, torch.randint(0, 20, (6,)))
    (loss.sum() + p.sum()).backward()  # p's saved tensor was not written: no refusal
    assert x0.grad is not None


def test_a_gradient_into_logits_after_cross_entropy_wrote_them_raises_instead_of_being_dropped(ops):
    x = leaf(6, 20) * 1
    loss = ops.ce_fwd_inplace(x, torch.randint(0, 20, (6,)))
    with pytest.raises(RuntimeError, match=r"a gradient flows into 'logits' after the op wrote it in place, but its "
                                           r"backward op ce_bwd does not read that gradient"):
        (loss.sum() + x.sum()).backward()


def test_under_torch_compile_a_gradient_into_written_logits_passed_in_raises_when_the_graph_runs(ops):
    # AOTAutograd hands a written graph input a tangent that is zero unless the new value is used after the graph:
    # the check runs in the compiled backward
    target = torch.randint(0, 20, (6,))
    torch._dynamo.reset()
    fn = torch.compile(lambda x: ops.ce_fwd_inplace(x, target).mean(), backend="aot_eager", fullgraph=True)
    w = leaf(6, 20)
    fn(w * 1).backward()
    assert w.grad.abs().sum() > 0
    x = leaf(6, 20) * 1
    out = fn(x)
    with pytest.raises(RuntimeError, match=r"a gradient flows into 'logits' after the op wrote it in place"):
        (out + x.sum()).backward()


def test_the_logits_the_caller_still_holds_are_copied_for_the_backward_not_overwritten(ops):
    # the backward scales the gradient buffer in place only when nothing else holds it (docs/training.md)
    x = leaf(6, 20) * 1
    loss = ops.ce_fwd_inplace(x, torch.randint(0, 20, (6,)))
    written = x.detach().clone()
    (loss * 3).sum().backward()
    assert torch.equal(x.detach(), written)


OPCHECK_ARGS = {
    "rope_inplace": lambda: (leaf(5, 2, 8) * 1, *angles(5, 4)),
    "ce_fwd_inplace": lambda: (leaf(8, 50) * 1, torch.randint(0, 50, (8,)), -100),
}


@pytest.mark.parametrize("name", sorted(OPCHECK_ARGS))
def test_opcheck_passes_for_the_in_place_forwards(ops, name):
    torch.manual_seed(6)
    packet = getattr(getattr(torch.ops, ops.namespace), name)
    result = torch.library.opcheck(packet.default, OPCHECK_ARGS[name]())
    assert set(result.values()) == {"SUCCESS"}, result


def _step(ops: Any, q: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, cos: torch.Tensor,
          sin: torch.Tensor) -> torch.Tensor:
    ops.rope_inplace(q, cos, sin)
    loss = ops.ce_fwd_inplace(logits, target)
    return (q * q).sum() + loss.mean()


@pytest.mark.parametrize("written", ["inside", "inputs"])
def test_torch_compile_runs_the_in_place_pairs_without_graph_breaks_and_gives_eagers_gradients(ops, written):
    # inside: the written tensors are made in the graph; inputs: the graph writes tensors the caller passed
    # (AOTAutograd then replays the write on the caller's tensor with its gradient)
    torch.manual_seed(7)
    cos, sin = angles(5, 4)
    target = torch.randint(0, 50, (8,))
    w, x0 = leaf(5, 2, 8), leaf(8, 50)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if written == "inside":
            a, b = a * 2, b * 1
        return _step(ops, a, b, target, cos, sin)

    def args() -> tuple[torch.Tensor, torch.Tensor]:
        return (w, x0) if written == "inside" else (w * 2, x0 * 1)

    fn(*args()).backward()
    eager = (w.grad.clone(), x0.grad.clone())
    w.grad = x0.grad = None
    torch._dynamo.reset()
    a, b = args()
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(a, b)
    out.backward()
    torch.testing.assert_close(w.grad, eager[0])
    torch.testing.assert_close(x0.grad, eager[1])
    if written == "inputs":  # the caller's tensors hold what the ops wrote
        torch.testing.assert_close(a.detach(), rotate(w.detach() * 2, cos, sin))
    assert torch._dynamo.explain(fn)(*args()).graph_break_count == 0


def _pointers(kernargs: bytes) -> set[int]:
    return {struct.unpack_from("<Q", kernargs, o)[0] for o in range(0, len(kernargs) - 7, 8)}


def test_on_the_recording_driver_the_forward_writes_the_callers_buffer_and_the_write_is_counted(
        training_bundle, recorded, launches):
    # The recording driver writes no data, so torch sees no write: the version bump is flyship's count alone, and
    # autograd's saved-tensor check depends on it.
    ops = recorded(training_bundle, target="sm_90")
    cos, sin = angles(64, 32)
    w = leaf(64, 8, 64)
    q = w * 1
    held = q * q
    ptr, before = q.data_ptr(), q._version
    ops.rope_inplace(q, cos, sin)
    (fwd,) = launches()
    assert fwd["symbol"] == "rope_inplace_kernel" and ptr in _pointers(fwd["kernargs"])  # no copy: q itself
    assert q._version > before  # counted by flyship: the recording driver wrote nothing torch could see
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        held.sum().backward()
    q.sum().backward()
    (bwd,) = launches()
    assert bwd["symbol"] == "rope_bwd_kernel"
    with torch.no_grad():  # the plain in-place op: one launch, one count
        before = q._version
        ops.rope_inplace(q, cos, sin)
    assert q._version == before + 1 and len(launches()) == 1


# The backward's rope_bwd rotates its incoming gradient in place: it gets autograd's own tensor when nothing else holds
# it (no copy: the GPU bench's RoPE step lost a DtoD copy of the gradient per step to that), and a copy when a Python
# holder keeps the same tensor object (loader/autograd_owners.py), both on torch's generated path (rope_fwd) and on the
# mark_dirty Function's (rope_inplace).
@pytest.mark.parametrize("op", ["rope_fwd", "rope_inplace"])
@pytest.mark.parametrize("keep", [False, True])
def test_the_backward_takes_the_incoming_gradient_only_when_no_python_holder_keeps_it(
        training_bundle, recorded, launches, op, keep):
    ops = recorded(training_bundle, target="sm_90")
    cos, sin = angles(64, 32)
    w = leaf(64, 8, 64)
    c = torch.randn(64, 8, 64)
    q = w * 1
    out = getattr(ops, op)(q, cos, sin)
    out = q if op == "rope_inplace" else out
    seen, kept = [], []
    out.register_hook(lambda g: seen.append(g.data_ptr()) or (kept.append(g) if keep else None))
    launches()
    (out * c).sum().backward()
    (bwd,) = launches()
    assert bwd["symbol"] == "rope_bwd_kernel" and len(seen) == 1
    assert (seen[0] in _pointers(bwd["kernargs"])) is not keep  # kept: a copy; else autograd's own buffer


def test_a_gradient_the_caller_passes_and_holds_is_copied_before_the_backward_writes_it(
        training_bundle, recorded, launches):
    ops = recorded(training_bundle, target="sm_90")
    cos, sin = angles(64, 32)
    out = ops.rope_fwd(leaf(64, 8, 64) * 1, cos, sin)
    g = torch.randn(64, 8, 64)
    launches()
    out.backward(g)
    (bwd,) = launches()
    assert g.data_ptr() not in _pointers(bwd["kernargs"])


def test_the_reference_count_baselines_are_measured_on_both_paths():
    from flyship.loader import autograd_owners as owners

    for kind in ("generated", "function"):
        base = owners.baseline(kind)
        assert isinstance(base, tuple) and len(base) == 3 and min(base) >= 1, (kind, base)
        more = [tuple(b + (i == k) for i, b in enumerate(base)) for k in range(3)]
        assert owners.held((base, *more, None), kind) == frozenset({1, 2, 3, 4})


@pytest.mark.parametrize("op", ["rope_fwd", "rope_inplace"])
def test_an_incoming_gradient_nobody_touched_is_judged_private_and_handed_over(
        training_bundle, recorded, launches, monkeypatch, op):
    # No hook: the gradient (MulBackward's fresh tensor) reaches the backward as autograd made it. Its pointer cannot
    # be read without holding it, so the verdict of the one judge (autograd._private) is read instead.
    from flyship.loader import autograd as ag

    real, verdicts = ag._private, []
    monkeypatch.setattr(ag, "_private", lambda t, grad: verdicts.append((grad, r := real(t, grad))) or r)
    ops = recorded(training_bundle, target="sm_90")
    cos, sin = angles(64, 32)
    q = leaf(64, 8, 64) * 1
    out = getattr(ops, op)(q, cos, sin)
    ((q if op == "rope_inplace" else out) * torch.randn(64, 8, 64)).sum().backward()
    assert verdicts == [(True, True)]


def test_a_gradient_that_also_feeds_another_node_is_not_handed_over(training_bundle, recorded, launches, monkeypatch):
    # out + b: AddBackward hands one tensor to both sides; b's node reads it after (or before) ours, so it must not
    # change: a C++ owner more than the probe's gradient had.
    from flyship.loader import autograd as ag

    real, verdicts = ag._private, []
    monkeypatch.setattr(ag, "_private", lambda t, grad: verdicts.append((grad, r := real(t, grad))) or r)
    ops = recorded(training_bundle, target="sm_90")
    cos, sin = angles(64, 32)
    b = leaf(64, 8, 64) * 2  # made first: autograd runs later nodes first, so ours runs while b's still waits
    out = ops.rope_fwd(leaf(64, 8, 64) * 1, cos, sin)
    ((out + b) * torch.randn(64, 8, 64)).sum().backward()
    assert (True, True) not in verdicts


def test_loading_a_bundle_whose_backward_consumes_gradients_measures_both_paths_first(training_bundle, ext):
    # Measured at load, in plain eager mode: a first backward inside torch.compile's trace (fake tensors) or inside
    # another backward must not be where the probe runs (it would give no baseline: every gradient copied).
    import subprocess
    import sys

    code = ("import warnings, sys; warnings.simplefilter('ignore'); import flyship; "
            "from flyship.loader import autograd_owners as o; assert not o._BASELINE; "
            f"flyship.load({str(training_bundle)!r}, namespace='flyship_tiprobe'); "
            "print(sorted((k, v is not None) for k, v in o._BASELINE.items()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[('function', True), ('generated', True)]", r.stdout
