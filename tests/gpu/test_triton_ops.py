"""The Triton example bundle on a GPU, through flyship's loader: every op against its reference, the out
variant, streams, threads, torch.compile, CUDA graphs, the fallback and the refusals.

A result only counts when the kernel ran: every correctness check also reads the op's stats and
requires launches of the expected specialization and no fallback.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import random
import subprocess
import sys

import pytest
import torch

from ..conftest import ROOT
from .conftest import assert_on_the_current_stream, bundle_dir, counting, fallback_off

pytestmark = pytest.mark.gpu

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
HALF = {"bf16": torch.bfloat16, "f16": torch.float16}
GEMM_TOL = {torch.bfloat16: dict(atol=3e-2, rtol=3e-2), torch.float16: dict(atol=4e-3, rtol=4e-3)}


def cuda_randn(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def close(got: torch.Tensor, want: torch.Tensor, refs, **tol) -> None:
    torch.testing.assert_close(got, want, **(tol or refs.TOLERANCES[want.dtype]))


# ---------------------------------------------------------------------------------------------------
# Every op against its reference, over shapes that are and are not multiples of the tiles.

ADD_SHAPES = [(1, 1), (3, 5), (1000, 1000), (17, 4099), (1, 1048577), (2048, 1)]
ROW_SHAPES = {  # shape -> the BLOCK_N specialization it must run
    (1, 1): 1024, (7, 1000): 1024, (33, 1024): 1024, (5, 1025): 4096, (3, 4096): 4096, (2, 4097): 16384,
    (4, 16384): 16384, (300, 777): 1024,
}


@pytest.mark.parametrize("dt", DTYPES)
def test_add_matches_its_reference_on_every_shape(ops, refs, dt):
    torch.manual_seed(0)
    for shape in ADD_SHAPES:
        x, y = cuda_randn(*shape, dtype=DTYPES[dt]), cuda_randn(*shape, dtype=DTYPES[dt])
        with counting(ops.add) as c:
            out = ops.add(x, y)
        torch.cuda.synchronize()
        close(out, refs.add_ref(x, y), refs)
        assert c.launches == {dt: 1} and not c.fallbacks, (shape, c.launches, c.fallbacks)


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_matches_its_reference_and_picks_the_smallest_block(ops, refs, dt):
    torch.manual_seed(1)
    for shape, block in ROW_SHAPES.items():
        x = cuda_randn(*shape, dtype=DTYPES[dt], scale=3.0)
        with counting(ops.softmax) as c:
            out = ops.softmax(x)
        torch.cuda.synchronize()
        close(out, refs.softmax_ref(x), refs)
        assert c.launches == {f"{dt}_n{block}": 1} and not c.fallbacks, (shape, c.launches, c.fallbacks)
    # Rows with a stride of their own (a column slice of a wider tensor) are passed as such.
    wide = cuda_randn(64, 3000, dtype=DTYPES[dt])
    x = wide[:, :2000]
    with counting(ops.softmax) as c:
        out = ops.softmax(x)
    close(out, refs.softmax_ref(x), refs)
    assert c.launched == 1


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_trains_its_backward_kernel_matches_the_reference_gradient(ops, refs, dt):
    if ops.manifest.op("softmax").backward is None:
        pytest.skip("the bundle predates autograd pairs (rebuild it); this would run softmax_bwd in loss.backward()")
    torch.manual_seed(2)
    for shape, block in ROW_SHAPES.items():
        x = cuda_randn(*shape, dtype=DTYPES[dt], scale=3.0).requires_grad_()
        dy = cuda_randn(*shape, dtype=DTYPES[dt])
        with counting(ops.softmax_bwd) as c:
            (ops.softmax(x) * dy).sum().backward()
        torch.cuda.synchronize()
        want_x = x.detach().float().requires_grad_()
        (torch.softmax(want_x, dim=-1) * dy.float()).sum().backward()
        close(x.grad, want_x.grad.to(x.dtype), refs)
        assert c.launches == {f"{dt}_n{block}": 1} and not c.fallbacks, (shape, c.launches, c.fallbacks)


def test_softmax_backward_passes_gradcheck_and_opcheck_on_the_gpu(ops):
    if ops.manifest.op("softmax").backward is None:
        pytest.skip("the bundle predates autograd pairs (rebuild it); this would gradcheck softmax's kernels")
    x = torch.randn(8, 100, device="cuda", requires_grad=True)
    # float32 kernels: a loose gradcheck (finite differences in float32 need eps and tolerances to match).
    assert torch.autograd.gradcheck(lambda t: ops.softmax(t), (x,), eps=1e-3, atol=1e-3, rtol=1e-2)
    torch.library.opcheck(getattr(torch.ops, ops.namespace).softmax.default, (x,))


def test_softmax_forward_and_backward_compile_into_one_graph_each(ops):
    if ops.manifest.op("softmax").backward is None:
        pytest.skip("the bundle predates autograd pairs (rebuild it); this would torch.compile a training step")
    op = getattr(torch.ops, ops.namespace).softmax
    torch._dynamo.reset()
    step = torch.compile(lambda t, g: (op(t) * g).sum(), fullgraph=True)
    x = torch.randn(64, 1000, device="cuda", requires_grad=True)
    g = torch.randn(64, 1000, device="cuda")
    step(x, g).backward()
    want = x.detach().clone().requires_grad_()
    (torch.softmax(want, -1) * g).sum().backward()
    torch.testing.assert_close(x.grad, want.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dt", DTYPES)
def test_rmsnorm_matches_its_reference_for_several_eps(ops, refs, dt):
    torch.manual_seed(2)
    for (shape, block), eps in zip(ROW_SHAPES.items(), [1e-6, 1e-5, 1e-3, 0.5, 1e-6, 1e-6, 1e-2, 1e-6]):
        x = cuda_randn(*shape, dtype=DTYPES[dt])
        w = cuda_randn(shape[1], dtype=DTYPES[dt])
        with counting(ops.rmsnorm) as c:
            out = ops.rmsnorm(x, w, eps)
        torch.cuda.synchronize()
        close(out, refs.rmsnorm_ref(x, w, eps), refs)
        assert c.launches == {f"{dt}_n{block}": 1} and not c.fallbacks, (shape, c.launches, c.fallbacks)


# Model-shaped tensors: rmsnorm / softmax take (B, S, N) as the view (B*S, N) (Tensor(..., batch=True)).
BATCH_SHAPES = {(2, 3, 1000): 1024, (4, 1, 4096): 4096, (1, 7, 5000): 16384, (3, 2, 5, 300): 1024}


@pytest.mark.parametrize("dt", DTYPES)
def test_rmsnorm_on_model_shaped_tensors_runs_the_kernel_on_the_flattened_rows(ops, refs, dt):
    torch.manual_seed(7)
    for shape, block in BATCH_SHAPES.items():
        x = cuda_randn(*shape, dtype=DTYPES[dt])
        w = cuda_randn(shape[-1], dtype=DTYPES[dt])
        with counting(ops.rmsnorm) as c:
            out = ops.rmsnorm(x, w, 1e-5)
        torch.cuda.synchronize()
        assert out.shape == x.shape and out._base is None
        close(out, refs.rmsnorm_ref(x, w, 1e-5), refs)
        assert c.launches == {f"{dt}_n{block}": 1} and not c.fallbacks, (shape, c.launches, c.fallbacks)


def test_model_shaped_views_and_out_tensors_run_the_kernel_without_a_copy(ops, refs):
    torch.manual_seed(8)
    w = cuda_randn(1000, dtype=torch.float32)
    x = cuda_randn(2, 3, 1200, dtype=torch.float32)[:, :, :1000]  # rows of 1000 with a pitch of 1200
    out = torch.empty(2, 3, 1000, device="cuda")
    with counting(ops.rmsnorm) as c:
        ops.rmsnorm.out(x, w, 1e-6, out=out)
        y = ops.softmax(x)
    torch.cuda.synchronize()
    close(out, refs.rmsnorm_ref(x, w, 1e-6), refs)
    close(y, refs.softmax_ref(x), refs)
    assert c.launches == {"f32_n1024": 1} and not c.fallbacks


def test_a_model_shaped_layout_that_only_a_copy_flattens_falls_back_with_the_reason(ops, refs):
    x = cuda_randn(5, 3, 1000, dtype=torch.float32).transpose(0, 1)  # (3, 5, 1000): no (15, 1000) view
    w = cuda_randn(1000, dtype=torch.float32)
    with counting(ops.rmsnorm) as c:
        out = ops.rmsnorm(x, w, 1e-6)
    torch.cuda.synchronize()
    close(out, refs.rmsnorm_ref(x, w, 1e-6), refs)
    assert c.launched == 0 and c.fell_back == 1 and any(r.startswith("batch: 'x'") for r in c.fallbacks)
    with fallback_off(ops), pytest.raises(RuntimeError, match="batch: 'x' of shape \\[3, 5, 1000\\]"):
        ops.rmsnorm(x, w, 1e-6)


def test_softmax_trains_on_model_shaped_tensors_through_its_backward_kernel(ops):
    torch.manual_seed(9)
    x = cuda_randn(2, 3, 700, dtype=torch.float32).requires_grad_()
    g = cuda_randn(2, 3, 700, dtype=torch.float32)
    with counting(ops.softmax) as c, counting(ops.softmax_bwd) as cb:
        y = ops.softmax(x)
        (y * g).sum().backward()
    torch.cuda.synchronize()
    want = x.detach().clone().requires_grad_()
    (torch.softmax(want, -1) * g).sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape
    torch.testing.assert_close(y, torch.softmax(x.detach(), -1), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(x.grad, want.grad, atol=1e-5, rtol=1e-4)
    assert c.launches == {"f32_n1024": 1} and cb.launches == {"f32_n1024": 1} and not c.fallbacks and not cb.fallbacks


def test_torch_compile_traces_model_shaped_calls_with_dynamic_shapes(ops, refs):
    torch._dynamo.reset()
    w = cuda_randn(512, dtype=torch.float32)
    f = torch.compile(lambda x: ops.softmax(ops.rmsnorm(x, w, 1e-5)), fullgraph=True, dynamic=True)
    for b, s in [(2, 3), (4, 5)]:
        x = cuda_randn(b, s, 512, dtype=torch.float32)
        close(f(x), refs.softmax_ref(refs.rmsnorm_ref(x, w, 1e-5)), refs)


GEMM_SHAPES = [  # (M, N, K), aligned specialization expected?
    ((512, 256, 384), True), ((1024, 1024, 512), True), ((128, 48, 64), True), ((100, 60, 72), False),
    ((129, 257, 65), False), ((1, 1, 1), False), ((3, 1000, 130), False), ((250, 16, 2048), True),
]


@pytest.mark.parametrize("dt", HALF)
def test_gemm_matches_its_reference_on_aligned_and_ragged_shapes(ops, refs, dt):
    torch.manual_seed(3)
    for (m, n, k), aligned in GEMM_SHAPES:
        a = cuda_randn(m, k, dtype=HALF[dt], scale=k ** -0.25)
        b = cuda_randn(n, k, dtype=HALF[dt], scale=k ** -0.25)
        with counting(ops.gemm) as c:
            out = ops.gemm(a, b)
        torch.cuda.synchronize()
        close(out, refs.gemm_ref(a, b), refs, **GEMM_TOL[HALF[dt]])
        want = f"{dt}_aligned" if aligned else dt
        assert c.launches == {want: 1} and not c.fallbacks, ((m, n, k), c.launches, c.fallbacks)


@pytest.mark.parametrize("dt", HALF)
def test_gemm_tma_needs_and_gets_global_scratch(ops, refs, dt):
    torch.manual_seed(4)
    target = ops.device_target(torch.cuda.current_device())
    spec = next(s for s in ops.gemm_tma.manifest.specializations if s.name == dt)
    variant = next(v for v in spec.variants if v.target.startswith("sm_")) if target.startswith("sm_") else None
    if variant is not None:
        assert any(f.kind == "scratch" for f in variant.kernargs.fields), "the sm_90 TMA kernel should take scratch"
    for m, n, k in [(300, 200, 264), (128, 128, 64), (1, 8, 8), (257, 136, 72), (1024, 1024, 512), (4096, 8, 128)]:
        a = cuda_randn(m, k, dtype=HALF[dt], scale=k ** -0.25)
        b = cuda_randn(n, k, dtype=HALF[dt], scale=k ** -0.25)
        with counting(ops.gemm_tma) as c:
            out = ops.gemm_tma(a, b)
        torch.cuda.synchronize()
        close(out, refs.gemm_ref(a, b), refs, **GEMM_TOL[HALF[dt]])
        assert c.launches == {dt: 1} and not c.fallbacks, ((m, n, k), c.launches, c.fallbacks)


def test_empty_inputs_launch_nothing_and_return_empty_outputs(ops):
    x = torch.empty(0, 5, device="cuda")
    with counting(ops.add) as c:
        out = ops.add(x, x)
    assert out.shape == (0, 5) and c.empty == 1 and c.launched == 0 and not c.fallbacks


# ---------------------------------------------------------------------------------------------------
# The out variant.

def test_out_variant_writes_into_the_given_tensor_and_returns_it(ops, refs):
    torch.manual_seed(5)
    x, y = cuda_randn(300, 777, dtype=torch.bfloat16), cuda_randn(300, 777, dtype=torch.bfloat16)
    w = cuda_randn(777, dtype=torch.bfloat16)
    a, b = cuda_randn(256, 128, dtype=torch.float16), cuda_randn(64, 128, dtype=torch.float16)
    cases = [
        (ops.add, (x, y), refs.add_ref(x, y)),
        (ops.softmax, (x,), refs.softmax_ref(x)),
        (ops.rmsnorm, (x, w, 1e-5), refs.rmsnorm_ref(x, w, 1e-5)),
        (ops.gemm, (a, b), refs.gemm_ref(a, b)),
        (ops.gemm_tma, (a, b), refs.gemm_ref(a, b)),
    ]
    for op, args, want in cases:
        out = torch.full_like(want, float("nan"))
        with counting(op) as c:
            got = op.out(*args, out=out)
        torch.cuda.synchronize()
        assert got.data_ptr() == out.data_ptr(), op.name
        tol = GEMM_TOL[want.dtype] if op.name.startswith("gemm") else refs.TOLERANCES[want.dtype]
        torch.testing.assert_close(out, want, **tol)
        assert c.launched == 1 and not c.fallbacks, (op.name, c.launches, c.fallbacks)
    # The same through torch.ops directly.
    out = torch.empty_like(x)
    torch.ops.flyship_triton.add.out(x, y, out=out)
    close(out, refs.add_ref(x, y), refs)


def test_out_variant_into_a_row_strided_view_is_honoured(ops, refs):
    x = cuda_randn(64, 1000, dtype=torch.float32)
    big = torch.full((64, 1500), float("nan"), device="cuda")
    view = big[:, :1000]  # rows 1500 apart: the kernel takes out's row stride
    with counting(ops.softmax) as c:
        ops.softmax.out(x, out=view)
    close(view, refs.softmax_ref(x), refs)
    assert torch.isnan(big[:, 1000:]).all(), "the kernel wrote outside the out view"
    assert c.launched == 1


# ---------------------------------------------------------------------------------------------------
# Streams and threads.

SLEEP_CYCLES = 1_000_000_000  # about half a second of GPU clock


def test_ops_run_on_the_current_stream_not_the_default_one(ops, tmp_path):
    # The profiler's stream ids say where the kernel ran; no sleep whose length decides the verdict (issue 31).
    x, y = cuda_randn(4096, 256, dtype=torch.float32), cuda_randn(4096, 256, dtype=torch.float32)
    want = (x + y).cpu()
    out = torch.full_like(x, float("nan"))
    assert_on_the_current_stream(lambda: ops.add.out(x, y, out=out), tmp_path)
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ops.add.out(x, y, out=out)
        got = out.to("cpu", non_blocking=False)  # ordered after the op on the side stream
    assert torch.equal(got, want), "the op did not run on the side stream (or ran after the copy)"


def test_work_on_one_stream_stays_in_order(ops, refs, tmp_path):
    torch.manual_seed(6)
    s = torch.cuda.Stream()
    x, y = cuda_randn(512, 1024, dtype=torch.float16), cuda_randn(512, 1024, dtype=torch.float16)
    want = refs.softmax_ref(refs.add_ref(x * 2, y))
    # Every kernel of both ops runs on the current stream (profiler stream ids), so the stream orders them after
    # x2 and before the fill below; the sleep only makes a wrong order show in the result too, it decides nothing.
    assert_on_the_current_stream(lambda: ops.softmax(ops.add(x, y)), tmp_path)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES // 4)
        x2 = x * 2  # produced on s after the sleep: the op must wait for it
        h = ops.add(x2, y)
        out = ops.softmax(h)
        x2.fill_(float("nan"))  # after the ops in stream order: must not leak into them
    s.synchronize()
    close(out, want, refs)


def test_eight_threads_calling_ops_at_once_get_their_own_results(ops, refs):
    rounds = 25

    def work(seed: int) -> int:
        rng = random.Random(seed)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        stream = torch.cuda.Stream()
        done = 0
        with torch.cuda.stream(stream):
            for _ in range(rounds):
                m, n = rng.randint(1, 300), rng.randint(1, 5000)
                dt = rng.choice(list(DTYPES.values()))
                x = torch.randn(m, n, device="cuda", dtype=torch.float32, generator=gen).to(dt)
                which = rng.choice(["add", "softmax", "rmsnorm", "gemm"])
                if which == "add":
                    got, want = ops.add(x, x), refs.add_ref(x, x)
                elif which == "softmax":
                    got, want = ops.softmax(x), refs.softmax_ref(x)
                elif which == "rmsnorm":
                    w = torch.randn(n, device="cuda", generator=gen).to(dt)
                    got, want = ops.rmsnorm(x, w, 1e-6), refs.rmsnorm_ref(x, w, 1e-6)
                else:
                    a = x[:, : min(n, 256)].to(torch.bfloat16) * 0.25
                    b = torch.randn(rng.randint(1, 200), a.shape[1], device="cuda", generator=gen).to(torch.bfloat16)
                    got, want = ops.gemm(a, b), refs.gemm_ref(a, b)
                stream.synchronize()
                tol = GEMM_TOL[want.dtype] if which == "gemm" else refs.TOLERANCES[want.dtype]
                where = f"thread {seed} {which} {tuple(x.shape)}"
                torch.testing.assert_close(got, want, **tol, msg=lambda m, where=where: f"{where}: {m}")
                done += 1
        return done

    names = ("add", "softmax", "rmsnorm", "gemm")
    before = {n: ops[n].stats()["calls"] for n in names}
    with cf.ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(work, range(8))) == 8 * rounds
    after = {n: ops[n].stats()["calls"] for n in names}
    assert sum(after[n] - before[n] for n in names) == 8 * rounds  # every call counted once, none lost


# ---------------------------------------------------------------------------------------------------
# torch.compile and CUDA graphs.

def test_torch_compile_fullgraph_keeps_the_ops_in_one_graph(ops, refs):
    torch.manual_seed(7)
    from torch import _dynamo  # a plain `import torch._dynamo` here would make `torch` a local name

    def f(x, y, w):
        h = torch.ops.flyship_triton.add(x, y)
        h = torch.ops.flyship_triton.rmsnorm(h, w, 1e-5)
        return torch.ops.flyship_triton.softmax(h * 2.0)

    x, y = cuda_randn(64, 1000, dtype=torch.bfloat16), cuda_randn(64, 1000, dtype=torch.bfloat16)
    w = cuda_randn(1000, dtype=torch.bfloat16)
    explained = _dynamo.explain(f)(x, y, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    _dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    with counting(ops.softmax) as c:
        got = compiled(x, y, w)
        got2 = compiled(x, y, w)
    torch.cuda.synchronize()
    want = refs.softmax_ref(refs.rmsnorm_ref(refs.add_ref(x, y), w, 1e-5) * 2.0)
    close(got, want, refs)
    torch.testing.assert_close(got2, got, atol=0, rtol=0)
    assert c.launched == 2 and not c.fallbacks


def test_cuda_graph_capture_and_replay_reruns_the_kernels_on_new_data(ops, refs):
    torch.manual_seed(8)
    x, y = cuda_randn(256, 1000, dtype=torch.float16), cuda_randn(256, 1000, dtype=torch.float16)
    a = cuda_randn(300, 264, dtype=torch.bfloat16, scale=0.25)
    b = cuda_randn(200, 264, dtype=torch.bfloat16, scale=0.25)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: code objects loaded, allocator primed
        for _ in range(2):
            ops.softmax(ops.add(x, y))
            ops.gemm_tma(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with counting(ops.gemm_tma) as c:
        with torch.cuda.graph(graph):
            h = ops.add(x, y)
            out = ops.softmax(h)
            c_out = ops.gemm_tma(a, b)  # allocates its scratch inside the capture
    assert c.launched == 1
    for step in range(3):
        x.copy_(cuda_randn(256, 1000, dtype=torch.float16))
        a.copy_(cuda_randn(300, 264, dtype=torch.bfloat16, scale=0.25))
        graph.replay()
        torch.cuda.synchronize()
        close(h, refs.add_ref(x, y), refs)
        close(out, refs.softmax_ref(h), refs)
        close(c_out, refs.gemm_ref(a, b), refs, **GEMM_TOL[torch.bfloat16])


# ---------------------------------------------------------------------------------------------------
# Inputs that fit no specialization, and inputs that are wrong.

def misaligned(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor whose data pointer is one element past a 16-byte boundary."""
    flat = cuda_randn(math.prod(shape) + 1, dtype=dtype)
    return flat[1:].view(*shape)


def test_inputs_fitting_no_specialization_fall_back_to_the_reference_and_are_counted(ops, refs):
    torch.manual_seed(9)
    x64 = torch.randn(100, 100, device="cuda", dtype=torch.float64)
    xa = misaligned(300, 500, dtype=torch.float32)
    ya = cuda_randn(300, 500, dtype=torch.float32)
    wide = cuda_randn(4, 20000, dtype=torch.float32)
    cols = cuda_randn(700, 300, dtype=torch.float32).t()  # stride[1] != 1
    a12, b12 = cuda_randn(64, 12, dtype=torch.bfloat16), cuda_randn(64, 12, dtype=torch.bfloat16)
    cases = [
        (ops.add, (x64, x64), refs.add_ref(x64, x64), "dtype"),
        (ops.add, (xa, ya), refs.add_ref(xa, ya), "align"),
        (ops.softmax, (wide,), refs.softmax_ref(wide), "x.shape[1] <= 16384"),
        (ops.softmax, (cols,), refs.softmax_ref(cols), "stride"),
        (ops.gemm_tma, (a12, b12), refs.gemm_ref(a12, b12), "% 8 == 0"),
    ]
    for op, args, want, reason in cases:
        with counting(op) as c:
            got = op(*args)
        torch.testing.assert_close(got, want)
        assert c.launched == 0 and c.fell_back == 1, (op.name, reason, c.launches, c.fallbacks)
        assert any(reason in r for r in c.fallbacks), (op.name, reason, c.fallbacks)


def test_wrong_device_rank_and_out_shape_are_refused_before_any_launch(ops):
    x = cuda_randn(8, 8, dtype=torch.float32)
    cases = [
        (lambda: ops.add(x, x.cpu()), "device"),
        (lambda: ops.add.out(x.cpu(), x.cpu(), out=torch.empty(8, 8, device="cuda")), "device"),
        (lambda: ops.add(x[0], x[0]), "rank"),
        (lambda: ops.softmax(x, x), "argument"),
        (lambda: ops.add.out(x, x, out=torch.empty(4, 4, device="cuda")), "shape"),
        (lambda: ops.add.out(x, x, out=torch.empty(8, 8, device="cuda", dtype=torch.float16)), "dtype"),
    ]
    for call, words in cases:
        with counting(ops.add) as c, counting(ops.softmax) as c2:
            with pytest.raises((RuntimeError, TypeError, ValueError), match=words):
                call()
        assert c.launched == c2.launched == 0 and not c.fallbacks and not c2.fallbacks, words


def test_with_the_fallback_off_unfit_inputs_raise_saying_why(ops):
    x = cuda_randn(100, 100, dtype=torch.float32)
    cases = [
        (ops.add, (x.double(), x.double()), "dtype"),
        (ops.add, (misaligned(100, 100, dtype=torch.float32), x), "align"),
        (ops.softmax, (x.t(),), "stride"),
        (ops.rmsnorm, (x, cuda_randn(99, dtype=torch.float32), 1e-6), "w.shape[0] == x.shape[1]"),
    ]
    with fallback_off(ops):
        for op, args, words in cases:
            with counting(op) as c:
                with pytest.raises(RuntimeError, match="no specialization fits") as e:
                    op(*args)
            assert words in str(e.value), (op.name, str(e.value))
            assert c.launched == 0 and not c.fallbacks


def test_a_fresh_process_loads_the_bundle_with_the_fallback_off(bundle):
    # The other half of the handoff, end to end in a clean Python: load, run, refuse.
    code = (
        "import torch, flyship\n"
        f"ops = flyship.load({str(bundle_dir())!r}, fallback=False)\n"
        "x = torch.randn(1000, 1000, device='cuda')\n"
        "torch.testing.assert_close(ops.add(x, x), x + x)\n"
        "try:\n"
        "    ops.add(x.double(), x.double())\n"
        "except RuntimeError as e:\n"
        "    assert 'no specialization fits' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('float64 inputs were not refused')\n"
        "print('ok', ops.add.stats())\n"
    )
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
