"""Training ops on a GPU (examples/triton/training.py): the real cubins of each autograd pair, whose backward writes
gradients in place, the pairs whose forward writes its input in place (rope_inplace, ce_fwd_inplace: schema 5.0),
and the composites that make each training op one op, against torch's own autograd.

The bundle comes from ``FLYSHIP_GPU_TRAINING_BUNDLE`` (default ``artifacts/training``), built without a GPU by
``flyc-build examples/triton/training.py -o artifacts/training --arch sm_90``; when there is none and this Python
has Triton, the fixture builds it for this GPU first. The ops are loaded with the fallback off, so every call here
runs a kernel (an input no specialization takes raises instead of quietly running the reference).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from .conftest import counting, example_bundle

pytestmark = pytest.mark.gpu

DTYPES = {"f32": (torch.float32, 1e-5), "bf16": (torch.bfloat16, 2e-2)}  # dtype, tolerance relative to max |ref|


@pytest.fixture(scope="module")
def tr_bundle(gpu, tmp_path_factory) -> Path:
    return example_bundle("FLYSHIP_GPU_TRAINING_BUNDLE", "training",
                          "that the training ops' kernels give torch's gradients on this GPU", tmp_path_factory)


@pytest.fixture(scope="module")
def tr(tr_bundle) -> Any:
    import flyship
    from flyship.bundle import targets

    o = flyship.load(tr_bundle, fallback=False, namespace=f"flyship_gtr{uuid.uuid4().hex[:8]}")
    device = o.device_target(torch.cuda.current_device())
    if targets.select(list(o.targets), device) is None:
        pytest.skip(f"the bundle at {tr_bundle} has code objects for {', '.join(o.targets)}, none of which runs on "
                    f"this GPU ({device}); rebuild it with --arch for this device")
    return o


def close(got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """The largest error at most ``tol`` times the largest magnitude of ``ref`` (gradients of a mean loss are tiny:
    an absolute tolerance would pass anything)."""
    err = (got.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    assert err <= tol * scale, f"max error {err:.3g} > {tol} x max |ref| {scale:.3g}"


def leaf(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)


def twin(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("rows, vocab", [(64, 5000), (256, 32000), (7, 128256)])
def test_cross_entropy_kernels_give_torchs_loss_and_gradient(tr, dt, rows, vocab):
    dtype, tol = DTYPES[dt]
    torch.manual_seed(0)
    logits = leaf(rows, vocab, dtype=dtype)
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::5] = -100
    with counting(tr.ce_fwd) as fwd, counting(tr.ce_bwd) as bwd:
        loss = tr.cross_entropy(logits, target)
        loss.backward()
    assert (fwd.launched, bwd.launched, fwd.fell_back + bwd.fell_back) == (1, 1, 0)
    ref_logits = twin(logits)
    ref = F.cross_entropy(ref_logits.float(), target, ignore_index=-100)
    ref.backward()
    close(loss, ref, 1e-5)
    close(logits.grad, ref_logits.grad, tol)
    assert logits.grad[::5].abs().max() == 0  # ignored rows: every element written, as zero


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("held", [True, False])
def test_swiglu_backward_writes_da_db_into_dropped_inputs_and_leaves_held_ones_alone(tr, dt, held):
    dtype, tol = DTYPES[dt]
    torch.manual_seed(1)
    x = leaf(4, 512, 1024, dtype=dtype)  # (B, S, H): batched, flattened to a view by the loader
    a, b = x * 1.5, x - 0.25
    a0, b0, ptr = a.detach().clone(), b.detach().clone(), a.data_ptr()
    seen = []
    a.register_hook(lambda g: seen.append(g.data_ptr()))
    dc = torch.randn_like(a0)
    with counting(tr.swiglu_fwd) as fwd, counting(tr.swiglu_bwd) as bwd:
        c = tr.swiglu(a, b)
        keep = (a, b) if held else ()
        del a, b
        (c * dc).sum().backward()
    assert (fwd.launched, bwd.launched) == (1, 1)
    assert (seen[0] == ptr) is (not held)  # consumed in place only when nobody holds it
    if held:
        assert torch.equal(keep[0], a0) and torch.equal(keep[1], b0)
    x2 = twin(x)
    (F.silu((x2 * 1.5).float()) * (x2 - 0.25).float() * dc.float()).sum().backward()
    close(x.grad, x2.grad, tol)


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_kernels_rotate_and_the_backward_rotates_the_gradient_back_in_place(tr, dt, head_dim):
    dtype, tol = DTYPES[dt]
    torch.manual_seed(2)
    tokens, heads = 300, 8
    q, k = leaf(tokens, heads, head_dim, dtype=dtype), leaf(tokens, 2, head_dim, dtype=dtype)
    ang = torch.rand(tokens, head_dim // 2, device="cuda") * 6.28
    cos, sin = ang.cos(), ang.sin()
    gq, gk = torch.randn(tokens, heads, head_dim, device="cuda", dtype=dtype), torch.randn_like(k)
    with counting(tr.rope_fwd) as fwd, counting(tr.rope_bwd) as bwd:
        q2, k2 = tr.rope(q, k, cos, sin)
        ((q2 * gq).sum() + (k2 * gk).sum()).backward()
    assert (fwd.launched, bwd.launched) == (2, 2)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h].float(), x[..., h:].float()
        return torch.cat([x1 * cos[:, None] - x2 * sin[:, None], x2 * cos[:, None] + x1 * sin[:, None]], -1)

    rq, rk = twin(q), twin(k)
    ((rotate(rq) * gq.float()).sum() + (rotate(rk) * gk.float()).sum()).backward()
    close(q2, rotate(q.detach()), tol)
    close(q.grad, rq.grad, tol)
    close(k.grad, rk.grad, tol)


@pytest.mark.parametrize("dt", sorted(DTYPES))
def test_a_backward_ending_with_a_host_reduction_gives_torchs_weight_gradient(tr, dt):
    dtype, tol = DTYPES[dt]
    torch.manual_seed(3)
    x, w = leaf(4096, 1000, dtype=dtype), leaf(1000, dtype=dtype)
    g = torch.randn(4096, 1000, device="cuda", dtype=dtype)
    with counting(tr.scale) as fwd, counting(tr.scale_bwd_partial) as bwd:
        (tr.scale(x, w) * g).sum().backward()
    assert (fwd.launched, bwd.launched) == (1, 1)
    x2, w2 = twin(x), twin(w)
    (x2.float() * w2.float() * g.float()).sum().backward()
    close(x.grad, x2.grad, tol)
    close(w.grad, w2.grad, tol * 10)  # 4096 rows summed in another order


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_trains_through_every_training_op_on_the_gpu(tr, backend):
    torch.manual_seed(4)
    f32 = torch.float32
    args = [leaf(64, 5000, dtype=f32), torch.randint(0, 5000, (64,), device="cuda"), leaf(8, 1024, dtype=f32),
            leaf(8, 1024, dtype=f32), leaf(64, 8, 128, dtype=f32), leaf(64, 2, 128, dtype=f32),
            torch.rand(64, 64, device="cuda"), torch.rand(64, 64, device="cuda"), leaf(300, 1000, dtype=f32),
            leaf(1000, dtype=f32)]

    def step(logits, target, a, b, q, k, cos, sin, x, w):
        q2, k2 = tr.rope(q, k, cos, sin)
        return (tr.cross_entropy(logits, target) + tr.swiglu(a, b).square().mean() + q2.square().mean() + k2.mean()
                + tr.scale(x, w).mean())

    eager = step(*args)
    eager.backward()
    copies = [twin(t) for t in args]
    torch._dynamo.reset()
    out = torch.compile(step, backend=backend, fullgraph=True)(*copies)
    out.backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for x, y in zip(args, copies):
        if x.requires_grad:
            torch.testing.assert_close(y.grad, x.grad, rtol=1e-4, atol=1e-5)


# -- in-place forwards (schema 5.0): the pair's forward writes its input, as ctx.mark_dirty allows -------------------
@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_in_place_rotates_the_callers_tensor_and_gives_torchs_gradient(tr, dt, head_dim):
    dtype, tol = DTYPES[dt]
    torch.manual_seed(5)
    tokens, heads = 300, 8
    w = leaf(tokens, heads, head_dim, dtype=dtype)
    ang = torch.rand(tokens, head_dim // 2, device="cuda") * 6.28
    cos, sin = ang.cos(), ang.sin()
    g = torch.randn(tokens, heads, head_dim, device="cuda", dtype=dtype)
    q = w * 1
    ptr, version = q.data_ptr(), q._version
    held = q * q  # mul saved q: its backward must be refused, never read the rotated values
    with counting(tr.rope_inplace) as fwd, counting(tr.rope_bwd) as bwd:
        tr.rope_inplace(q, cos, sin)
        assert q.data_ptr() == ptr and q._version > version
        (q * g).sum().backward()
    assert (fwd.launched, bwd.launched, fwd.fell_back + bwd.fell_back) == (1, 1, 0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        held.sum().backward()

    def rotate(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h].float(), x[..., h:].float()
        return torch.cat([x1 * cos[:, None] - x2 * sin[:, None], x2 * cos[:, None] + x1 * sin[:, None]], -1)

    w2 = twin(w)
    (rotate(w2) * g.float()).sum().backward()
    close(q.detach(), rotate(w.detach()), tol)
    close(w.grad, w2.grad, tol)


@pytest.mark.parametrize("dt", sorted(DTYPES))
def test_cross_entropy_in_place_writes_the_gradient_over_the_logits_and_gives_torchs_gradient(tr, dt):
    dtype, tol = DTYPES[dt]
    torch.manual_seed(6)
    rows, vocab = 256, 32000
    w = leaf(rows, vocab, dtype=dtype)
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::5] = -100
    with counting(tr.ce_fwd_inplace) as fwd, counting(tr.ce_bwd) as bwd:
        loss = tr.ce_fwd_inplace(w * 1, target)  # the logits are dropped: the backward scales them in place
        mean = loss.sum() / (target != -100).sum()
        mean.backward()
    assert (fwd.launched, bwd.launched, fwd.fell_back + bwd.fell_back) == (1, 1, 0)
    w2 = twin(w)
    ref = F.cross_entropy(w2.float(), target, ignore_index=-100)
    ref.backward()
    close(mean, ref, 1e-5)
    close(w.grad, w2.grad, tol)
    assert w.grad[::5].abs().max() == 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_trains_through_the_in_place_pairs_on_the_gpu(tr, backend):
    torch.manual_seed(7)
    f32 = torch.float32
    w, x0 = leaf(64, 8, 128, dtype=f32), leaf(64, 5000, dtype=f32)
    ang = torch.rand(64, 64, device="cuda")
    cos, sin, target = ang.cos(), ang.sin(), torch.randint(0, 5000, (64,), device="cuda")

    def step(w, x0):
        q, logits = w * 2, x0 * 1
        tr.rope_inplace(q, cos, sin)
        return q.square().mean() + tr.ce_fwd_inplace(logits, target).mean()

    eager = step(w, x0)
    eager.backward()
    w2, x2 = twin(w), twin(x0)
    torch._dynamo.reset()
    out = torch.compile(step, backend=backend, fullgraph=True)(w2, x2)
    out.backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w2.grad, w.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(x2.grad, x0.grad, rtol=1e-4, atol=1e-5)
