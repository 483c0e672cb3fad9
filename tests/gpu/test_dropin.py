"""Drop-in on a GPU: bench/dropin_block.py's transformer block with RMSNorm and softmax patched with the
Triton example ops. A patched call counts only when the kernel launched (the ops' own counters)."""

from __future__ import annotations

import pytest
import torch

from ..conftest import ROOT

pytestmark = pytest.mark.gpu


@pytest.fixture
def block_module(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import dropin_block

    return dropin_block


def launches(op) -> int:
    return sum(op.stats()["launches"].values())


def test_the_patched_block_launches_the_kernels_and_matches_the_baseline(ops, block_module):
    torch.manual_seed(0)
    model = block_module.Block(1024, 16).to("cuda", torch.bfloat16).eval()
    x = torch.randn(2, 128, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        patches = block_module.make_patches(ops)
        try:
            n_norm, n_soft = launches(ops.rmsnorm), launches(ops.softmax)
            got = model(x)
            torch.cuda.synchronize()
        finally:
            for p in patches:
                p.undo()
    torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)
    assert launches(ops.rmsnorm) - n_norm == 2 and launches(ops.softmax) - n_soft == 1
    assert [(p.stats()["to_op"], p.stats()["to_original"]) for p in patches] == [(2, {}), (1, {})]


def test_rows_longer_than_every_specialization_run_the_original_with_the_reason(ops, block_module):
    norm = block_module.RMSNorm(20000).to("cuda")
    x = torch.randn(4, 20000, device="cuda")
    patches = block_module.make_patches(ops)
    try:
        n = launches(ops.rmsnorm)
        with torch.no_grad():
            torch.testing.assert_close(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    finally:
        for p in patches:
            p.undo()
    s = patches[0].stats()
    assert s["to_op"] == 0 and launches(ops.rmsnorm) == n
    assert any("16384" in r for r in s["to_original"]), s["to_original"]


def test_the_compiled_patched_block_is_one_graph_that_launches_the_kernels(ops, block_module):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(0)
    model = block_module.Block(512, 8).to("cuda", torch.bfloat16).eval()
    x = torch.randn(2, 64, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        patches = block_module.make_patches(ops)
        try:
            torch._dynamo.reset()
            counter = CompileCounterWithBackend("inductor")
            compiled = torch.compile(model, backend=counter, fullgraph=True)
            compiled(x)
            n_norm, n_soft = launches(ops.rmsnorm), launches(ops.softmax)
            got = compiled(x)
            torch.cuda.synchronize()
        finally:
            for p in patches:
                p.undo()
    torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)
    assert counter.frame_count == 1
    assert launches(ops.rmsnorm) - n_norm == 2 and launches(ops.softmax) - n_soft == 1

