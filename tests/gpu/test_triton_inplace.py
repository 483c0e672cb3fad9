"""Ops that write an input in place (issue 9, pattern 7) on a GPU: the Triton example ops ``fused_add_rmsnorm``
(``residual += x`` in place, a fresh normed output) and ``accumulate`` (``acc += alpha * x``, no output) against
their references, the in-place effect visible to the caller, torch.compile, opcheck on CUDA tensors, the fallback
writing in place too, and CUDA graph replay.

A result only counts when the kernel ran: each check also reads the op's stats (launches of the expected
specialization, no fallback).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from .conftest import counting

pytestmark = pytest.mark.gpu

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
ROWS = {(1, 1): 1024, (7, 1000): 1024, (33, 1024): 1024, (5, 1025): 8192, (3, 8192): 8192, (300, 777): 1024}


def cuda_randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.float32).to(dtype)


@pytest.fixture(scope="module")
def lib(ops):
    if "fused_add_rmsnorm" not in ops:
        pytest.skip(f"the bundle at {ops.path} predates the in-place ops; rebuild it (make bundles) to run them")
    return getattr(torch.ops, ops.namespace)


@pytest.mark.parametrize("dt", DTYPES)
def test_fused_add_rmsnorm_writes_the_residual_in_place_and_matches_its_reference(ops, refs, lib, dt):
    torch.manual_seed(11)
    dtype = DTYPES[dt]
    for (m, n), block in ROWS.items():
        x, r, w = cuda_randn(m, n, dtype=dtype), cuda_randn(m, n, dtype=dtype), cuda_randn(n, dtype=dtype)
        r_ref = r.clone()
        ptr, version = r.data_ptr(), r._version
        with counting(ops.fused_add_rmsnorm) as c:
            out = ops.fused_add_rmsnorm(x, r, w, 1e-5)
        want = refs.fused_add_rmsnorm_ref(x, r_ref, w, 1e-5)
        torch.cuda.synchronize()
        assert c.launches == {f"{dt}_n{block}": 1} and not c.fallbacks, (m, n)
        assert r.data_ptr() == ptr and r._version > version  # the caller's own tensor, written in place
        torch.testing.assert_close(r, r_ref, **refs.TOLERANCES[dtype])
        torch.testing.assert_close(out, want, **refs.TOLERANCES[dtype])


def test_accumulate_returns_nothing_and_adds_into_the_callers_tensor(ops, refs, lib):
    torch.manual_seed(12)
    for n in (1, 1000, 1024, 5000, 1 << 20):
        acc, x = cuda_randn(n), cuda_randn(n)
        want = acc.clone()
        refs.accumulate_ref(want, x, 0.25)
        with counting(ops.accumulate) as c:
            assert ops.accumulate(acc, x, 0.25) is None
        torch.cuda.synchronize()
        assert c.launches == {"f32": 1} and not c.fallbacks
        torch.testing.assert_close(acc, want)


def test_the_out_variant_writes_both_the_residual_and_the_given_out_tensor(ops, refs, lib):
    x, r, w = cuda_randn(16, 1000), cuda_randn(16, 1000), cuda_randn(1000)
    r_ref = r.clone()
    out = torch.empty(16, 1000, device="cuda")
    with counting(ops.fused_add_rmsnorm) as c:
        got = ops.fused_add_rmsnorm.out(x, r, w, 1e-6, out=out)
    want = refs.fused_add_rmsnorm_ref(x, r_ref, w, 1e-6)
    torch.cuda.synchronize()
    assert got is out and c.launched == 1 and not c.fallbacks
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(r, r_ref)


def test_a_residual_the_kernel_cannot_take_falls_back_and_the_reference_writes_it_in_place(ops, refs, lib):
    x, w = cuda_randn(8, 300), cuda_randn(300)
    base = cuda_randn(300, 8)
    r = base.t()  # a column-major view: the guard wants residual.stride[1] == 1
    r_ref = r.clone()
    with counting(ops.fused_add_rmsnorm) as c, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warning shows once per reason; the stats count each call
        out = ops.fused_add_rmsnorm(x, r, w, 1e-6)
    want = refs.fused_add_rmsnorm_ref(x, r_ref, w, 1e-6)
    torch.cuda.synchronize()
    assert c.fell_back == 1 and not c.launches
    torch.testing.assert_close(r, r_ref)  # the view's own memory was written, through the view
    torch.testing.assert_close(base.t(), r_ref)
    torch.testing.assert_close(out, want)


def test_torch_compile_fullgraph_keeps_the_write_for_code_that_reads_it_afterwards(ops, refs, lib):
    from torch import _dynamo

    def block(x, r, w, acc):
        out = lib.fused_add_rmsnorm(x, r, w, 1e-6)
        lib.accumulate(acc, out.flatten(), 0.5)
        return out * 2 + r, acc.sum()

    x, r, w, acc = cuda_randn(32, 512), cuda_randn(32, 512), cuda_randn(512), cuda_randn(32 * 512)
    eager = (x, r.clone(), w, acc.clone())
    compiled_in = (x, r.clone(), w, acc.clone())
    want = block(*eager)
    explained = _dynamo.explain(block)(x, r.clone(), w, acc.clone())
    assert explained.graph_break_count == 0, explained.break_reasons
    _dynamo.reset()
    with counting(ops.fused_add_rmsnorm) as c:
        got = torch.compile(block, fullgraph=True)(*compiled_in)
    torch.cuda.synchronize()
    assert c.launched == 1 and not c.fallbacks
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(compiled_in[1], eager[1])  # the copy-back into the caller's residual
    torch.testing.assert_close(compiled_in[3], eager[3])


def test_opcheck_passes_for_the_in_place_ops_on_cuda_tensors(ops, lib):
    x, r, w = cuda_randn(8, 1000), cuda_randn(8, 1000), cuda_randn(1000)
    for overload, args, kwargs in ((lib.fused_add_rmsnorm.default, (x, r, w, 1e-5), {}),
                                   (lib.fused_add_rmsnorm.out, (x, r, w, 1e-5), {"out": torch.empty_like(x)}),
                                   (lib.accumulate.default, (cuda_randn(5000), cuda_randn(5000), 0.5), {})):
        result = torch.library.opcheck(overload, args, kwargs)
        assert set(result.values()) == {"SUCCESS"} and len(result) == 4, (overload, result)


def test_cuda_graph_replay_rewrites_the_residual_on_each_replay(ops, lib):
    x, w = cuda_randn(16, 1000), cuda_randn(1000)
    r = cuda_randn(16, 1000)
    ops.fused_add_rmsnorm(x, r.clone(), w)  # load the code object before capture
    torch.cuda.synchronize()
    start = r.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.fused_add_rmsnorm(x, r, w)
    r.copy_(start)
    for k in range(1, 4):
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(r, start + k * x, atol=1e-4, rtol=1e-4)
    h = start + 3 * x
    torch.testing.assert_close(out, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w, atol=1e-4,
                               rtol=1e-4)


def _atomic_rowsum(ops):
    if "rowsum_atomic_out" not in ops:
        pytest.skip(f"the bundle at {ops.path} predates zero-filled outputs; rebuild it (make bundles)")
    return ops.rowsum_atomic_out


def test_an_atomically_accumulated_output_starts_from_zeros_on_every_call(ops, refs):
    # The kernel's 4 programs per row atomic_add into acc: only an output the loader zero-fills gives the row sums.
    # Memory the caching allocator hands back after a garbage-filled tensor is freed is where an at::empty output
    # would land, so each call follows one.
    op = _atomic_rowsum(ops)
    torch.manual_seed(13)
    for m, n in ((1, 1), (64, 4096), (300, 777), (1000, 5000)):
        x = cuda_randn(m, n)
        for _ in range(3):
            junk = torch.full((m,), 1e6, device="cuda")
            del junk
            with counting(op) as c:
                got = op(x)
            assert c.launches == {"f32": 1} and not c.fallbacks, (m, n)
            torch.testing.assert_close(got, refs.rowsum_ref(x), atol=1e-3 * max(1, n ** 0.5), rtol=1e-4)


def test_an_out_tensor_of_an_atomically_accumulated_output_is_zeroed_before_the_kernel_adds(ops, refs):
    op = _atomic_rowsum(ops)
    x = cuda_randn(300, 777)
    out = torch.full((300,), 7.0, device="cuda")
    with counting(op) as c:
        op.out(x, out=out)
    assert c.launches == {"f32": 1} and not c.fallbacks
    torch.testing.assert_close(out, refs.rowsum_ref(x), atol=1e-3 * 777 ** 0.5, rtol=1e-4)


def test_cuda_graph_replay_of_an_atomically_accumulated_output_zeroes_it_on_each_replay(ops):
    op = _atomic_rowsum(ops)
    x = cuda_randn(64, 4096)
    op(x)  # load the code object before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        acc = op(x)
    want = x.sum(dim=1)
    for _ in range(3):  # a zeroing outside the graph would leave replay 2 with twice the sums
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(acc, want, atol=1e-3 * 64, rtol=1e-4)
