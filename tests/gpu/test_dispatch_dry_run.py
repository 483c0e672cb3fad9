"""A dry run of the GPU tests' expectations without a GPU: the loader's own dispatch (``OpHandle.dispatch``
binds CPU tensors as stand-ins) and the real call path on the recording driver must pick, for every shape
the GPU tests use, the specialization those tests require, and give the fallback reasons they look for.

Runs in the workload venv (torch + ninja; the loader builds its extension once) on the Triton bundle at
``FLYSHIP_GPU_BUNDLE`` / ``artifacts/triton``; skips when there is none.
"""

from __future__ import annotations

import importlib.util
import struct
import uuid
from pathlib import Path

import pytest
import torch

from flyship.bundle.targets import is_compatible

from ..conftest import ROOT, flydsl_python, run_build
from .conftest import bundle_dir
from .test_triton_ops import ADD_SHAPES, DTYPES, GEMM_SHAPES, HALF, ROW_SHAPES

pytestmark = pytest.mark.cpu
NV = "sm_90"  # the device target; Triton records its cubins as sm_90a, which runs there


@pytest.fixture(scope="module")
def triton_bundle(tmp_path_factory) -> Path:
    """The Triton example bundle the GPU tests use: the built one (artifacts/triton, or FLYSHIP_GPU_BUNDLE), else
    built here through flyc-build (sm_90 + gfx942, as `make bundles` does), so a fresh clone runs these tests."""
    d = bundle_dir()
    if (d / "manifest.json").is_file():
        return d
    if flydsl_python() is None:
        pytest.skip(f"no Triton bundle at {d} and no build Python to make one; these tests dry-run the GPU tests' "
                    "dispatch and launches on the recording driver")
    out = tmp_path_factory.mktemp("triton") / "triton"
    run_build(ROOT / "examples/triton/ops.py", out, ["sm_90", "gfx942"], "-j", "2")
    return out


@pytest.fixture(scope="module")
def ops(triton_bundle):
    import flyship

    return flyship.load(triton_bundle)


def randn(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def declared(spec: str) -> str:
    """The declared spec a specialization comes from: a Triton spec's generic specialization (``<spec>__generic``,
    after the JIT's variant for aligned inputs: docs/triton.md) is its spec's."""
    return spec[:-len("__generic")] if spec and spec.endswith("__generic") else spec


@pytest.mark.parametrize("target", [NV, "gfx942"])
def test_every_gpu_test_shape_dispatches_to_the_specialization_it_expects(ops, target):
    for dt, dtype in DTYPES.items():
        for shape in ADD_SHAPES:
            x = randn(*shape, dtype=dtype)
            assert declared(ops.add.dispatch(x, x, target=target).spec) == dt, shape
        for shape, block in ROW_SHAPES.items():
            x = randn(*shape, dtype=dtype)
            w = randn(shape[1], dtype=dtype)
            assert declared(ops.softmax.dispatch(x, target=target).spec) == f"{dt}_n{block}", shape
            assert declared(ops.rmsnorm.dispatch(x, w, 1e-6, target=target).spec) == f"{dt}_n{block}", shape
    for dt, dtype in HALF.items():
        for (m, n, k), aligned in GEMM_SHAPES:
            a, b = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype)
            assert declared(ops.gemm.dispatch(a, b, target=target).spec) == (f"{dt}_aligned" if aligned else dt), (m, n, k)
        for m, n, k in [(300, 200, 264), (128, 128, 64), (1, 8, 8), (257, 136, 72), (1024, 1024, 512), (4096, 8, 128)]:
            a, b = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype)
            assert declared(ops.gemm_tma.dispatch(a, b, target=target).spec) == dt, (m, n, k)


def test_unfit_inputs_give_the_reasons_the_gpu_tests_look_for(ops):
    flat = torch.randn(300 * 500 + 1)
    misaligned = flat[1:].view(300, 500)
    assert misaligned.data_ptr() % 16 != 0
    x = torch.randn(100, 100)
    cases = [
        (ops.add, (x.double(), x.double()), "dtype"),
        (ops.add, (misaligned, torch.randn(300, 500)), "align"),
        (ops.softmax, (torch.randn(4, 20000),), "x.shape[1] <= 16384"),
        (ops.softmax, (torch.randn(700, 300).t(),), "stride"),
        (ops.gemm_tma, (randn(64, 12, dtype=torch.bfloat16), randn(64, 12, dtype=torch.bfloat16)), "% 8 == 0"),
        (ops.rmsnorm, (x, torch.randn(99), 1e-6), "w.shape[0] == x.shape[1]"),
    ]
    for op, args, words in cases:
        d = op.dispatch(*args, target=NV)
        assert d.spec is None and words in d.reason, (op.name, d)


def test_row_strided_inputs_and_out_views_still_run_the_kernel(ops):
    x = torch.randn(64, 1000)
    view = torch.empty(64, 1500)[:, :1000]
    assert ops.softmax.dispatch(x, target=NV, out=(view,)).spec == "f32_n1024"
    assert ops.softmax.dispatch(torch.randn(64, 3000)[:, :2000], target=NV).spec == "f32_n4096"
    a = torch.randn(100, 200).to(torch.bfloat16)[:, :72]
    assert ops.gemm.dispatch(a, torch.randn(60, 72).to(torch.bfloat16), target=NV).spec == "bf16"


@pytest.mark.parametrize("target", [NV, "gfx942"])
def test_model_shaped_gpu_test_inputs_dispatch_as_their_flattened_rows(ops, target):
    from .test_triton_ops import BATCH_SHAPES

    for shape, block in BATCH_SHAPES.items():
        x = torch.randn(*shape)
        w = torch.randn(shape[-1])
        assert ops.rmsnorm.dispatch(x, w, 1e-5, target=target).spec == f"f32_n{block}", shape
        assert ops.softmax.dispatch(x, target=target).spec == f"f32_n{block}", shape
    x = torch.randn(5, 3, 1000).transpose(0, 1)
    assert ops.rmsnorm.dispatch(x, torch.randn(1000), 1e-6, target=target).reason.startswith("batch: 'x'")


@pytest.fixture
def recorded(monkeypatch, triton_bundle):
    """``recorded(target)``: the Triton bundle on the recording driver (``FLYSHIP_FLAVOR=record``) as a device
    of ``target`` runs it, and a function returning the launches recorded since the last call."""
    from flyship.loader import extension

    try:
        ext = extension.extension("record")
    except extension.ExtensionBuildError as e:
        pytest.skip(f"the recording extension cannot be built here: {e}")
    import flyship

    def make(target: str):
        # The device's shared-memory limit per block as the runtime reports it: CUDA's opt-in limit on sm_90
        # (227 KiB, cudaDevAttrMaxSharedMemoryPerBlockOptin), 64 KiB of LDS on gfx942.
        ext.set_recorded_device(0, target, max_shared_per_block=232448 if target.startswith("sm_") else 65536)
        with monkeypatch.context() as m:
            m.setenv("FLYSHIP_FLAVOR", "record")
            ops = flyship.load(triton_bundle, namespace=f"flyship_r{uuid.uuid4().hex[:10]}")
        ext.recorded_launches(clear=True)
        return ops, lambda: ext.recorded_launches(clear=True)

    return make


def test_the_benchs_raw_kernarg_packing_equals_the_loaders(ops, recorded):
    spec = importlib.util.spec_from_file_location("launch_overhead", ROOT / "bench" / "launch_overhead.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    x, y, o = torch.randn(4, 1024), torch.randn(4, 1024), torch.empty(4, 1024)
    variant = next(v for v in next(s for s in ops.add.manifest.specializations if s.name == "f32").variants
                   if is_compatible(v.target, NV))
    ours = bench.pack(variant, {"x": x, "y": y, "out": o})
    nv, launches = recorded(NV)
    nv.add.out(x, y, out=o)
    (launch,) = launches()
    assert ours == launch["kernargs"]
    assert struct.unpack_from("<QQQi", ours) == (x.data_ptr(), y.data_ptr(), o.data_ptr(), 4096)


def test_the_tma_gemm_gets_one_scratch_slice_per_program_on_sm90_only(ops, recorded):
    a, b = randn(300, 264, dtype=torch.bfloat16), randn(200, 264, dtype=torch.bfloat16)
    nv_ops, launches = recorded(NV)
    nv_ops.gemm_tma(a, b)
    (nv,) = launches()
    field = next(f for f in next(v for v in ops.gemm_tma.manifest.specializations[0].variants
                                 if is_compatible(v.target, NV)).kernargs.fields if f.kind == "scratch")
    assert nv["grid"] == (3, 2, 1)
    ptr = struct.unpack_from("<Q", nv["kernargs"], field.offset)[0]
    assert ptr != 0 and ptr % field.align == 0
    amd_ops, launches = recorded("gfx942")
    amd_ops.gemm_tma(a, b)
    (amd,) = launches()
    assert struct.unpack_from("<QQ", amd["kernargs"], len(amd["kernargs"]) - 16) == (0, 0)
