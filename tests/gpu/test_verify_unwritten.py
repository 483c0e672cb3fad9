"""``verify`` on a GPU finds an output a kernel leaves partly unwritten (issue 23, item 7a): a Triton kernel that
returns before its stores on rows with a negative label (the cross-entropy pattern), declared once without
``zero=True`` (verify must name the output, count exactly the skipped rows' elements and give the fix) and once
with it (verify passes). The bundle comes from ``FLYSHIP_GPU_EARLY_RETURN_BUNDLE`` (default
``artifacts/early_return``), built on a machine without a GPU by ``flyc-build tests/gpu/data/early_return_spec.py
-o artifacts/early_return --arch sm_90``; where there is none and a build Python is at hand, it is built here.
"""

from __future__ import annotations

from pathlib import Path

import os

import pytest

from ..conftest import ROOT, flydsl_python, run_build

pytestmark = pytest.mark.gpu

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def early_ops(gpu, tmp_path_factory):
    import flyship

    arch = "gfx942" if gpu.version.hip else "sm_90"
    if not gpu.version.hip and gpu.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"needs an sm_90 GPU (the bundle is built for sm_90), got {gpu.cuda.get_device_name()}; it "
                    "would prove verify reports the rows an early-returning Triton kernel leaves unwritten")
    out = Path(os.environ.get("FLYSHIP_GPU_EARLY_RETURN_BUNDLE") or ROOT / "artifacts" / "early_return")
    if not (out / "manifest.json").is_file():
        if flydsl_python() is None:
            pytest.skip(f"no bundle at {out} and no build Python to make one (flyc-build "
                        f"tests/gpu/data/early_return_spec.py -o {out} --arch {arch}); it would prove verify reports "
                        "the rows an early-returning Triton kernel leaves unwritten")
        out = tmp_path_factory.mktemp("early_return") / "bundle"
        run_build(DATA / "early_return_spec.py", out, [arch])
    return flyship.load(out)


def test_verify_counts_the_elements_an_early_returning_kernel_leaves_unwritten_and_names_zero_true(gpu, early_ops):
    from flyship.loader.tools.verify import example_inputs

    report = early_ops.verify()
    rows = {r.op: r for r in report.rows}
    handle = early_ops["skip_rows"]
    spec = handle.manifest.specializations[0]
    x, t = example_inputs(handle.manifest, spec, gpu.device("cuda"))
    skipped = int((t < 0).sum()) * x.shape[1]
    assert 0 < skipped < x.numel()  # the example has both kinds of rows
    bad = rows["skip_rows"]
    assert not bad.ok, report.table()
    assert f"the kernel left {skipped} of {x.numel()} elements of output 'out' unwritten" in bad.note, report.table()
    assert "declare Output('out', ..., zero=True)" in bad.note
    good = rows["skip_rows_zeroed"]
    assert good.ok and not good.note, report.table()


def test_the_zeroed_op_matches_its_reference_on_the_skipped_rows(gpu, early_ops):
    gpu.manual_seed(3)
    x = gpu.randn(33, 77, device="cuda")
    t = gpu.randint(-5, 5, (33,), device="cuda", dtype=gpu.int32)
    got = early_ops.skip_rows_zeroed(x, t)
    want = gpu.where((t < 0)[:, None], gpu.zeros_like(x), x * 2)
    gpu.testing.assert_close(got, want)
