"""Issue 9, pattern 8: specs per target. examples/flydsl/pertarget.py builds for gfx942 and gfx950 with a dtype
(fp8: float8_e4m3fnuz / float8_e4m3fn; float16 / bfloat16) and a constexpr that differ per target under one
spec name, every variant proven against FlyDSL's own code object and packed per its metadata; a spec over
gfx942's LDS ships for gfx950 with --keep-going, and the failure is reported by (op, spec, target) with a
next step and recorded in the manifest."""

from __future__ import annotations

import hashlib

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.codeobject import CodeObjectFile

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile
SPEC = ROOT / "examples" / "flydsl" / "pertarget.py"


def _specs(bundle, op="staged"):
    return {s.name: s for s in M.read(bundle).op(op).specializations}


def _check_proven(out, v, where):
    """The variant's code object is FlyDSL's own (binary proof) and its kernargs tile the metadata."""
    data = (out / v.code_object.file).read_bytes()
    assert hashlib.sha256(data).hexdigest() == v.code_object.sha256
    assert v.proof.method == "flydsl-binary" and ".text" in v.proof.identical_sections
    assert v.proof.metadata == "equal" and v.proof.differences == ()
    assert CodeObjectFile(data).kernel_metadata(v.code_object.symbol) == v.metadata
    rules.check_layout(v.kernargs, v.metadata, where)


def test_every_variant_is_proven_against_flydsl_and_its_kernargs_tile_the_metadata(pertarget_build):
    out, _ = pertarget_build
    for name, spec in _specs(out).items():
        for v in spec.variants:
            _check_proven(out, v, f"staged.{name}.{v.target}")
            assert [(f.kind, f.arg) for f in v.kernargs.fields][-1] == ("scalar", "alpha")


def test_a_dtype_that_differs_per_target_gives_each_target_its_own_guarded_specialization(pertarget_build):
    out, _ = pertarget_build
    specs = _specs(out)
    f16, bf16 = specs["half__gfx942"], specs["half__gfx950"]
    assert f16.guard.dtypes == {"x": "float16"} and [v.target for v in f16.variants] == ["gfx942"]
    assert bf16.guard.dtypes == {"x": "bfloat16"} and [v.target for v in bf16.variants] == ["gfx950"]
    assert "half" not in specs
    assert M.read(out).op("staged").args[0].dtypes == ("bfloat16", "float16", "float32")


def test_fp8_is_float8_e4m3fnuz_on_gfx942_and_float8_e4m3fn_on_gfx950_from_one_spec_each_proven(pertarget_build):
    out, _ = pertarget_build
    specs = _specs(out, "dequant_fp8")
    assert sorted(specs) == ["fp8__gfx942", "fp8__gfx950"]
    for target, dtype in (("gfx942", "float8_e4m3fnuz"), ("gfx950", "float8_e4m3fn")):
        spec = specs[f"fp8__{target}"]
        assert spec.guard.dtypes == {"x": dtype}
        (v,) = spec.variants
        assert v.target == target
        _check_proven(out, v, f"dequant_fp8.{spec.name}.{target}")
        fields = [(f.kind, f.arg, f.type) for f in v.kernargs.fields]
        assert ("pointer", "x", "ptr") in fields and ("pointer", "out", "ptr") in fields
        assert fields[-1] == ("scalar", "scale", "f32")
    m = M.read(out).op("dequant_fp8")
    assert m.args[0].dtypes == ("float8_e4m3fn", "float8_e4m3fnuz") and m.outputs[0].dtype == "float32"


def test_an_fp8_format_its_target_does_not_decode_fails_the_build_naming_the_one_it_needs(tmp_path):
    # The formats swapped: v_cvt_pk_f32_fp8 would read every byte wrong, so the launcher refuses at trace time.
    spec = tmp_path / "swapped.py"
    spec.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(SPEC.parent)!r})\n"
        "from dequant_fp8 import dequant_fp8\n"
        "from flyship.compiler.spec import Output, Scalar, Spec, Tensor, namespace, op\n"
        "namespace('flyship_swapped')\n"
        "op('dequant_fp8', kernel=dequant_fp8, args=[Tensor('x', rank=2),\n"
        "   Output('out', shape=('x.shape[0]', 'x.shape[1]'), dtype='float32'),\n"
        "   Scalar('scale', 'float', default=1.0)],\n"
        "   specs=[Spec('fp8', dtypes={'x': 'float8_e4m3fn'}, shapes={'x': (100, 1000)},\n"
        "               per_target={'gfx950': dict(dtypes={'x': 'float8_e4m3fnuz'})})])\n")
    out = tmp_path / "o"
    r = run_build(spec, out, ["gfx942", "gfx950"], check=False)
    assert r.returncode == 1 and not out.exists()
    assert "2 of 2 kernels failed" in r.stderr
    assert "dequant_fp8 on gfx942: expected x of Float8E4M3FNUZ" in r.stderr and "got Float8E4M3FN;" in r.stderr
    assert "dequant_fp8 on gfx950: expected x of Float8E4M3FN " in r.stderr and "got Float8E4M3FNUZ;" in r.stderr


def test_a_constexpr_that_differs_per_target_is_baked_into_each_targets_code_and_guard(pertarget_build):
    out, _ = pertarget_build
    specs = _specs(out)
    small, large = specs["f32__gfx942"], specs["f32__gfx950"]
    # 8 rows x 256 float32 of LDS on gfx942, 16 rows on gfx950; the grid divides the rows by ROWS.
    assert small.variants[0].metadata.group_segment_fixed_size == 8 * 256 * 4
    assert large.variants[0].metadata.group_segment_fixed_size == 16 * 256 * 4
    assert "+ 7) // 8" in small.variants[0].launch.grid[0] and "+ 15) // 16" in large.variants[0].launch.grid[0]
    assert small.guard.constraints != large.guard.constraints


def test_a_spec_over_gfx942s_lds_ships_for_gfx950_and_the_failure_is_recorded_with_its_reason(pertarget_build):
    out, r = pertarget_build
    m = M.read(out)
    assert m.schema_version == M.SCHEMA_VERSION == "1.5"
    assert [v.target for v in _specs(out)["f32_lds80k"].variants] == ["gfx950"]
    (f,) = m.failed
    assert (f.op, f.spec, f.target) == ("staged", "f32_lds80k", "gfx942")
    assert "81920 bytes of LDS" in f.reason and "65536-byte" in f.reason
    assert "staged.f32_lds80k on gfx942: ResourceError" in r.stderr
    assert "next step: the kernel is over gfx942's limits" in r.stderr and "per_target" in r.stderr
    assert "wrote" in r.stdout and "(partial)" in r.stdout


def test_without_keep_going_every_failure_is_listed_and_nothing_is_written(tmp_path):
    out = tmp_path / "o"
    r = run_build(SPEC, out, ["gfx942"], check=False)
    assert r.returncode == 1 and not out.exists()
    assert "1 of 4 kernels failed; nothing was written" in r.stderr
    assert "staged.f32_lds80k on gfx942" in r.stderr and "next step:" in r.stderr and "--keep-going" in r.stderr


def test_a_per_target_entry_for_an_arch_not_requested_is_named_not_dropped_silently():
    from flyship.bundle.targets import parse_target
    from flyship.compiler.pipeline import plan
    from flyship.compiler.worker import load_spec_file

    notes: list[str] = []
    tasks = plan(load_spec_file(str(SPEC)), [parse_target("gfx942")], notes.append)
    assert ("staged", "half", "gfx942") in tasks
    assert any("staged.half has a per_target entry for gfx950" in n and "not built" in n for n in notes)
