"""Ops that launch two kernels per call (issue 9, pattern 6) on a GPU, through flyship's loader: both phases run
in order through a per-call workspace, on torch's current stream, inside a CUDA graph capture and its replays.

The bundle comes from ``FLYSHIP_GPU_MULTILAUNCH_BUNDLE`` (default ``artifacts/multilaunch``), built without a GPU
by ``flyc-build examples/triton/multilaunch.py -o artifacts/multilaunch --arch sm_90 --arch gfx942``; when there
is none and this Python has Triton, the fixture builds it for this GPU with flyc-build first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from .conftest import assert_on_the_current_stream, counting, example_bundle

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1), (37, 1000), (64, 4096), (3, 70000), (300, 33), (2, 8)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


@pytest.fixture(scope="module")
def ml_bundle(gpu, tmp_path_factory) -> Path:
    return example_bundle("FLYSHIP_GPU_MULTILAUNCH_BUNDLE", "multilaunch",
                          "that both phases of a two-kernel op run in order on this GPU", tmp_path_factory)


@pytest.fixture(scope="module")
def ml(ml_bundle) -> Any:
    import flyship

    return flyship.load(ml_bundle, fallback=True)


def sums(x: torch.Tensor) -> torch.Tensor:
    return x.double().sum(dim=1).float()


def close(got: torch.Tensor, x: torch.Tensor) -> None:
    n = max(1, x.shape[1])
    torch.testing.assert_close(got.float(), sums(x), atol=1e-3 + 2e-5 * n, rtol=1e-4)


@pytest.mark.parametrize("dt", DTYPES)
def test_the_split_row_sum_runs_both_phases_and_matches_its_reference(ml, dt):
    torch.manual_seed(0)
    for shape in SHAPES:
        x = torch.randn(*shape, device="cuda").to(DTYPES[dt])
        with counting(ml.rowsum_split) as c:
            y = ml.rowsum_split(x)
        torch.cuda.synchronize()
        assert y.dtype == torch.float32 and y.shape == (shape[0],)
        close(y, x)
        assert c.launches == {dt: 1} and not c.fallbacks, (shape, c.launches, c.fallbacks)


def test_a_zeroed_workspace_is_fresh_zeros_on_every_call(ml):
    torch.manual_seed(1)
    x = torch.randn(513, 2000, device="cuda")
    for _ in range(4):  # the caching allocator hands back the last call's block: it must be zeroed again
        with counting(ml.rowsum_atomic) as c:
            y = ml.rowsum_atomic(x)
        torch.cuda.synchronize()
        close(y, x)
        assert c.launched == 1 and not c.fallbacks


def test_a_strided_input_uses_its_row_stride(ml):
    x = torch.randn(40, 3000, device="cuda")[:, 7:2007]
    with counting(ml.rowsum_split) as c:
        y = ml.rowsum_split(x)
    torch.cuda.synchronize()
    close(y, x)
    assert c.launched == 1 and not c.fallbacks


def test_both_launches_run_on_the_current_stream_not_the_default_one(ml, tmp_path):
    # Which stream ran each kernel is read from the profiler's stream ids, not inferred from how long a sleep lasts
    # (a sleep long enough on one card was too short on the next: issue 31).
    x = torch.randn(2048, 4096, device="cuda")
    want = sums(x).cpu()
    outs: list[torch.Tensor] = []

    def call() -> None:
        outs[:] = [ml.rowsum_split(x), ml.rowsum_atomic(x)]

    assert_on_the_current_stream(call, tmp_path)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        call()
        got_y, got_z = (o.to("cpu") for o in outs)  # ordered after both phases on the side stream
    torch.testing.assert_close(got_y, want, atol=5e-3, rtol=1e-4)
    torch.testing.assert_close(got_z, want, atol=5e-3, rtol=1e-4)


def test_a_cuda_graph_captures_both_launches_and_replays_them_on_new_data(ml):
    torch.manual_seed(2)
    x = torch.randn(300, 5000, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: code objects loaded, allocator primed
        for _ in range(2):
            ml.rowsum_split(x)
            ml.rowsum_atomic(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with counting(ml.rowsum_split) as c:
        with torch.cuda.graph(graph):
            y = ml.rowsum_split(x)  # allocates its workspace inside the capture
            z = ml.rowsum_atomic(x)  # and zero-fills its own
    assert c.launched == 1 and not c.fallbacks
    for step in range(3):
        x.copy_(torch.randn(300, 5000, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        close(y, x)
        close(z, x)
