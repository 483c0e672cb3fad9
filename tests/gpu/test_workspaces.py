"""RMSNorm backward with a ``(device.cu_count, N)`` workspace (issue 23, items 3 and 4) on a GPU, through flyship's
loader: aligned inputs run the specialization Triton's JIT would build (no hints in the spec), and its results
equal, bit for bit, those of the same two kernels launched by Triton's own JIT; misaligned inputs run the generic
one. ``bench/rmsnorm_bwd_workspace.py`` times the two launches against each other.

The bundle comes from ``FLYSHIP_GPU_WORKSPACES_BUNDLE`` (default ``artifacts/workspaces``), built without a GPU
by ``flyc-build examples/triton/workspaces.py -o artifacts/workspaces --arch sm_90``; when there is none and this
Python has Triton, the fixture builds it for this GPU first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ..conftest import ROOT
from .conftest import counting, example_bundle

pytestmark = pytest.mark.gpu

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture(scope="module")
def ws_bundle(gpu, tmp_path_factory) -> Path:
    return example_bundle("FLYSHIP_GPU_WORKSPACES_BUNDLE", "workspaces",
                          "that the device-sized workspace and the JIT variant run on this GPU", tmp_path_factory)


@pytest.fixture(scope="module")
def ws(ws_bundle) -> Any:
    import flyship

    return flyship.load(ws_bundle, fallback=True)


def triton_launch() -> Any:
    pytest.importorskip("triton", reason="compares with Triton's own JIT launch of the same kernels")
    sys.path.insert(0, str(ROOT / "examples" / "triton"))
    from tl_rmsnorm_bwd import launch_with_triton

    return launch_with_triton


@pytest.mark.parametrize("dt", DTYPES)
def test_aligned_inputs_run_the_jit_variant_and_equal_tritons_own_launch_bit_for_bit(ws, dt):
    launch_with_triton = triton_launch()
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    rows, n = cu * 32, 4096  # as the example: 32 rows per program (4096 rows on 132 SMs)
    torch.manual_seed(0)
    x = torch.randn(rows, n, device="cuda").to(DTYPES[dt])
    dy = torch.randn(rows, n, device="cuda").to(DTYPES[dt])
    w = torch.randn(n, device="cuda").to(DTYPES[dt])
    with counting(ws.rmsnorm_bwd) as c:
        dx, dw = ws.rmsnorm_bwd(dy, x, w, 1e-6)
    jdx, jdw = launch_with_triton(dy, x, w, 1e-6, cu, 4096, num_warps=8)
    torch.cuda.synchronize()
    assert not c.fallbacks and c.launched == 1
    (spec,) = c.variants
    assert not spec.endswith("__generic"), c.variants  # the JIT's variant, with no hint in the spec
    assert torch.equal(dx, jdx) and torch.equal(dw, jdw)
    rx, rw = ws.reference("rmsnorm_bwd")(dy, x, w, 1e-6)
    tol = {"f32": (1e-4, 1e-4), "bf16": (3e-2, 2e-2)}[dt]
    torch.testing.assert_close(dx.float(), rx.float(), atol=tol[0], rtol=tol[1])
    torch.testing.assert_close(dw.float(), rw.float(), atol=tol[0] * 100, rtol=tol[1])


def test_a_misaligned_input_runs_the_generic_specialization_with_the_same_results(ws):
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    rows, n = cu * 32, 4096
    torch.manual_seed(1)
    x = torch.randn(rows * n + 1, device="cuda")[1:].view(rows, n)  # 4 bytes past an aligned block
    dy, w = torch.randn(rows, n, device="cuda"), torch.randn(n, device="cuda")
    with counting(ws.rmsnorm_bwd) as c:
        dx, dw = ws.rmsnorm_bwd(dy, x, w, 1e-6)
    with counting(ws.rmsnorm_bwd) as c2:
        adx, adw = ws.rmsnorm_bwd(dy, x.clone(), w, 1e-6)
    torch.cuda.synchronize()
    assert list(c.variants) == ["f32_n4096__generic"] and not c.fallbacks
    assert c2.launched == 1 and not any(s.endswith("__generic") for s in c2.variants)
    torch.testing.assert_close(dx, adx, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dw, adw, atol=1e-2, rtol=1e-5)
