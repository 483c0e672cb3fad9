"""Specs per target and --keep-going in the workload Python (examples/flydsl/pertarget.py, issue 9 pattern 8):
each target runs the specialization built for it (fp8: float8_e4m3fnuz on gfx942, float8_e4m3fn on gfx950),
packed where its code object's metadata says; a kernel that did not build falls back with the build's own
reason, in the warning at load, in dispatch and in stats()."""

from __future__ import annotations

import struct
import uuid
import warnings

import pytest
import torch

import flyship
from flyship.bundle import manifest as M
from flyship.bundle.codeobject import CodeObjectFile
from flyship.loader.selection import make_selector
from flyship.loader.tools.verify import example_inputs

pytestmark = pytest.mark.cpu
FMT = {"ptr": "<Q", "i32": "<i", "i64": "<q", "f32": "<f"}
LDS = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}


def test_each_target_launches_its_own_specializations_packed_per_its_code_objects_metadata(pertarget_build,
                                                                                            recorded, launches,
                                                                                            record_ext):
    out, _ = pertarget_build
    checked, launched = 0, set()
    for target, name in [(t, n) for t in ("gfx942", "gfx950") for n in ("staged", "dequant_fp8")]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ops = recorded(out, target=target)
        # The device as its target has it: gfx950 gives a workgroup 160 KiB of LDS (read at the first call).
        record_ext.set_recorded_device(0, target, max_shared_per_block=LDS[target])
        handle = getattr(ops, name)
        for spec in handle.manifest.specializations:
            v = next((v for v in spec.variants if v.target == target), None)
            if v is None:
                continue
            inputs = example_inputs(handle.manifest, spec, "cpu")
            assert handle.dispatch(*inputs, target=target).spec == spec.name, (spec.name, target)
            result = handle(*inputs)
            (launch,) = launches()
            launched.add((name, spec.name, target))
            assert launch["symbol"] == v.code_object.symbol and tuple(launch["grid"]) == spec.example.grid
            meta = CodeObjectFile((out / v.code_object.file).read_bytes()).kernel_metadata(v.code_object.symbol)
            explicit = [a for a in meta.args if not a.hidden]
            buf = launch["kernargs"]
            assert len(buf) == explicit[-1].offset + explicit[-1].size
            values = {"x": inputs[0], "out": result, {"staged": "alpha", "dequant_fp8": "scale"}[name]: inputs[1]}
            for f in v.kernargs.fields:
                t = values[f.arg]
                want = {"pointer": lambda: t.data_ptr(), "shape": lambda: t.shape[f.dim],
                        "stride": lambda: t.stride(f.dim), "scalar": lambda: t}[f.kind]()
                assert struct.unpack_from(FMT[f.type], buf, f.offset)[0] == pytest.approx(want), (spec.name, f)
                checked += 1
    assert checked >= 5 * 8 + 2 * 9
    assert {("dequant_fp8", "fp8__gfx942", "gfx942"), ("dequant_fp8", "fp8__gfx950", "gfx950")} <= launched


def test_a_float16_call_runs_on_gfx942_and_a_bfloat16_call_on_gfx950_under_one_spec_name(pertarget_build, ext):
    out, _ = pertarget_build
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops = flyship.load(out, namespace=f"flyship_pt{uuid.uuid4().hex[:8]}")
    half, bf16 = torch.empty(100, 1000, dtype=torch.float16), torch.empty(100, 1000, dtype=torch.bfloat16)
    assert ops.staged.dispatch(half, 2.0, target="gfx942").spec == "half__gfx942"
    assert ops.staged.dispatch(bf16, 2.0, target="gfx950").spec == "half__gfx950"
    assert ops.staged.dispatch(bf16, 2.0, target="gfx942").spec is None


FP8 = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}


def test_an_fp8_call_runs_the_kernel_of_its_targets_own_format_and_the_other_format_falls_back(pertarget_build,
                                                                                                ext):
    out, _ = pertarget_build
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops = flyship.load(out, namespace=f"flyship_pt{uuid.uuid4().hex[:8]}")
    for target, other in (("gfx942", "gfx950"), ("gfx950", "gfx942")):
        mine, theirs = torch.zeros(100, 1000, dtype=FP8[target]), torch.zeros(100, 1000, dtype=FP8[other])
        assert ops.dequant_fp8.dispatch(mine, 0.5, target=target).spec == f"fp8__{target}"
        d = ops.dequant_fp8.dispatch(theirs, 0.5, target=target)
        assert d.spec is None and f"fp8__{target}: dtype x={str(FP8[other]).removeprefix('torch.')}" in d.reason


def test_on_a_device_an_fp8_tensor_of_the_other_format_runs_the_reference_and_launches_nothing(pertarget_build,
                                                                                               recorded, launches):
    out, _ = pertarget_build
    for target, other in (("gfx942", "gfx950"), ("gfx950", "gfx942")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ops = recorded(out, target=target)
        x = torch.randn(100, 1000, generator=torch.Generator().manual_seed(1))
        with pytest.warns(UserWarning, match=f"fp8__{target}: dtype x={str(FP8[other])[6:]}"):
            y = ops.dequant_fp8(x.to(FP8[other]), 0.5)
        assert launches() == [] and torch.equal(y, x.to(FP8[other]).float() * 0.5)
        ops.dequant_fp8(x.to(FP8[target]), 0.5)
        spec = {s.name: s for s in ops.dequant_fp8.manifest.specializations}[f"fp8__{target}"]
        assert [launch["symbol"] for launch in launches()] == [spec.variants[0].code_object.symbol]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e4m3fn], ids=str)
def test_an_fp8_call_on_cpu_tensors_runs_the_reference_decoding_its_own_format(pertarget_build, ext, dtype):
    out, _ = pertarget_build
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops = flyship.load(out, namespace=f"flyship_pt{uuid.uuid4().hex[:8]}")
    x = (torch.randn(37, 300, generator=torch.Generator().manual_seed(0)) * 8).to(dtype)
    y = ops.dequant_fp8(x, 0.25)
    assert y.dtype == torch.float32 and y.shape == x.shape
    torch.testing.assert_close(y, x.float() * 0.25, atol=0, rtol=0)
    # 0x40 is 2.0 in OCP E4M3FN and 1.0 in E4M3FNUZ (exponent bias 7 vs 8): the bytes decode as x's dtype says.
    one_byte = torch.full((1, 4), 0x40, dtype=torch.uint8).view(dtype)
    assert ops.dequant_fp8(one_byte, 1.0).tolist() == [[2.0 if dtype == torch.float8_e4m3fn else 1.0] * 4]
    assert ops.dequant_fp8.stats()["fallbacks"] == {"cpu": 2}


def test_a_kernel_that_did_not_build_is_skipped_on_its_target_with_the_builds_reason(pertarget_build, ext):
    out, _ = pertarget_build
    m = M.read(out)
    reasons = dict(zip([s.name for s in m.op("staged").specializations], make_selector(m)("gfx942")[0]))
    index, why = reasons["f32_lds80k"]
    assert index == -1 and "staged.f32_lds80k did not build for gfx942 (flyc-build --keep-going)" in why
    assert "81920 bytes of LDS" in why
    assert reasons["f32_lds80k"] != make_selector(m)("gfx950")[0][1] and make_selector(m)("gfx950")[0][2][0] == 0
    with pytest.warns(UserWarning, match=r"built with --keep-going and 1 kernel\(s\) did not build.*"
                                         r"staged\.f32_lds80k on gfx942"):
        ops = flyship.load(out, namespace=f"flyship_pt{uuid.uuid4().hex[:8]}")
    x = torch.empty(8192, 256)
    assert ops.staged.dispatch(x, 2.0, target="gfx950").spec == "f32_lds80k"
    assert ops.staged.dispatch(x, 2.0, target="gfx942").spec == "f32__gfx942"  # the next one runs
    d = ops.staged.dispatch(x.double(), 2.0, target="gfx942")
    assert d.spec is None and "staged.f32_lds80k did not build for gfx942" in d.reason
    assert "81920 bytes of LDS" in ops.staged.stats()["not_built"]["f32_lds80k gfx942"]
