"""flyc-build end to end on the FlyDSL examples, and its error paths (run as a subprocess)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle import schema as S
from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.expr import evaluate_with_shapes, is_constant
from flyship.errors import CompileError

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile
LLVM22 = Path("/usr/lib/llvm-22/bin")


def test_the_manifest_validates_against_its_json_schema(example_bundle):
    jsonschema = pytest.importorskip("jsonschema")
    data = json.loads((example_bundle / "manifest.json").read_text())
    jsonschema.Draft202012Validator(S.load()).validate(data)


def test_the_committed_schema_is_the_generated_one():
    assert S.load() == json.loads(json.dumps(S.generate()))


def test_every_example_op_is_built_for_both_archs(example_bundle):
    m = M.read(example_bundle)
    assert {o.name for o in m.ops} == {"add", "softmax", "softmax_bwd", "rmsnorm", "gemm"}
    for op in m.ops:
        for s in op.specializations:
            assert sorted(v.target for v in s.variants) == ["gfx942", "gfx950"], (op.name, s.name)
    assert m.build.frontends["flydsl"] == "0.5.0"
    assert m.build.python.count(".") == 2


def test_the_example_softmax_declares_its_backward_op(example_bundle):
    b = M.read(example_bundle).op("softmax").backward
    assert b == M.Backward(op="softmax_bwd", inputs={"dy": "grad:out", "y": "out"}, grads={"x": "dx"})


def test_the_build_table_shows_the_occupancy_each_kernel_can_reach():
    from flyship.compiler.pipeline import Row
    from flyship.compiler.cli import format_table

    table = format_table([Row("gemm", "bf16", "gfx942", 127, 50, 16384, 64, 3.2, occupancy="4 waves/SIMD (VGPRs)")])
    head, _, row = table.splitlines()
    assert "occupancy" in head and "4 waves/SIMD (VGPRs)" in row


def test_every_code_object_was_proven_identical_to_flydsls_own(example_bundle):
    m = M.read(example_bundle)
    for op in m.ops:
        for s in op.specializations:
            for v in s.variants:
                data = (example_bundle / v.code_object.file).read_bytes()
                assert hashlib.sha256(data).hexdigest() == v.code_object.sha256
                assert v.proof.method == "flydsl-binary"
                assert ".text" in v.proof.identical_sections
                assert v.proof.kernel_descriptor in ("identical", "identical-but-entry-offset")
                assert v.proof.metadata == "equal"


def test_manifest_metadata_is_what_the_code_object_says(example_bundle):
    m = M.read(example_bundle)
    for op in m.ops:
        for s in op.specializations:
            for v in s.variants:
                co = CodeObjectFile((example_bundle / v.code_object.file).read_bytes())
                assert co.kernel_metadata(v.code_object.symbol) == v.metadata
                assert co.target.split(":")[0] == v.target
                assert co.code_object_version == v.code_object.code_object_version == 6
                assert co.undefined_symbols() == []


def test_kernarg_fields_tile_the_explicit_arguments_exactly(example_bundle):
    m = M.read(example_bundle)
    for op in m.ops:
        for s in op.specializations:
            for v in s.variants:
                rules.check_layout(v.kernargs, v.metadata, f"{op.name}.{s.name}.{v.target}")
                explicit = [a for a in v.metadata.args if not a.hidden]
                covered = sum(f.size for f in v.kernargs.fields)
                padding = sum(a.size for a in explicit) - covered
                assert 0 <= padding < 8 * len(explicit)
                # every tensor contributes its pointer; every runtime scalar its value
                ptrs = {f.arg for f in v.kernargs.fields if f.kind == "pointer"}
                assert ptrs == {a.name for a in op.args if a.kind == "tensor"} | {o.name for o in op.outputs}
                scalars = {f.arg for f in v.kernargs.fields if f.kind == "scalar"}
                assert scalars == {a.name for a in op.args if a.kind != "tensor"}


def test_rmsnorm_layout_binds_shapes_strides_and_eps_at_their_offsets(example_bundle):
    v = M.read(example_bundle).op("rmsnorm").specializations[0].variants[0]
    got = [(f.offset, f.kind, f.type, f.arg, f.dim) for f in v.kernargs.fields]
    assert got == [
        (0, "pointer", "ptr", "x", None), (8, "shape", "i32", "x", 0), (12, "shape", "i32", "x", 1),
        (16, "stride", "i64", "x", 0), (24, "pointer", "ptr", "w", None), (32, "shape", "i32", "w", 0),
        (40, "pointer", "ptr", "out", None), (48, "shape", "i32", "out", 0), (52, "shape", "i32", "out", 1),
        (56, "stride", "i64", "out", 0), (64, "scalar", "f32", "eps", None),
    ]
    assert v.kernargs.size == 68


def test_grids_are_expressions_that_reproduce_the_traced_grid(example_bundle):
    m = M.read(example_bundle)
    add = m.op("add").specializations[0]
    assert add.example.grid == (125, 8, 1)  # ceil(1000/8), ceil(1000/128) for f32 (VEC=4)
    for op in m.ops:
        for s in op.specializations:
            for v in s.variants:
                got = tuple(evaluate_with_shapes(g, s.example.shapes) for g in v.launch.grid)
                assert got == s.example.grid
                assert v.launch.block == v.metadata.reqd_workgroup_size or v.metadata.reqd_workgroup_size is None
    gemm = m.op("gemm").specializations[0].variants[0]
    assert evaluate_with_shapes(gemm.launch.grid[0], {"a": (1024, 64), "b": (256, 64)}) == 8


def test_layout_constraints_are_derived_from_the_lowering(example_bundle):
    guard = M.read(example_bundle).op("softmax").specializations[0].guard
    assert "x.stride[1] == 1" in guard.constraints  # FlyDSL's layout (?,?):(?{i64},1)
    assert "x.shape[1] <= 8192" in guard.constraints  # from the spec
    assert guard.dtypes == {"x": "float32"}


@pytest.mark.skipif(not (LLVM22 / "llvm-objdump").exists(), reason="needs Debian llvm-22's llvm-objdump")
def test_disassembly_shows_the_kernel_symbol_and_mfma(example_bundle):
    v = M.read(example_bundle).op("gemm").specializations[0].variants[0]
    out = subprocess.run([str(LLVM22 / "llvm-objdump"), "-d", f"--mcpu={v.target}",
                          str(example_bundle / v.code_object.file)], capture_output=True, text=True, check=True).stdout
    assert f"<{v.code_object.symbol}>:" in out
    assert "v_mfma" in out


def test_offload_bundle_holds_every_arch_uncompressed(example_bundle):
    m = M.read(example_bundle)
    assert set(m.offload_bundles) == {f"{o.name}.{s.name}" for o in m.ops for s in o.specializations}
    for f in m.offload_bundles.values():
        assert (example_bundle / f).read_bytes().startswith(b"__CLANG_OFFLOAD_BUNDLE__")


def test_keep_ir_writes_the_isa_that_was_assembled(example_bundle):
    v = M.read(example_bundle).op("add").specializations[0].variants[0]
    s = (example_bundle / v.code_object.file.replace(".hsaco", ".s")).read_text()
    assert ".amdgcn_target" in s and v.code_object.symbol in s


def _small_spec(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "spec.py"
    p.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples' / 'flydsl')!r})
        from flyship.compiler.spec import Output, Spec, Tensor, namespace, op, references
        namespace("t")
    """) + textwrap.dedent(body))
    return p


ADD_ONLY = """
    from elementwise import add
    op("add", kernel=add, args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x")],
       specs=[Spec("f32", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (64, 70), "y": (64, 70)})])
"""


def test_rebuilding_gives_byte_identical_code_objects_manifest_and_packed_file(tmp_path):
    spec = _small_spec(tmp_path, ADD_ONLY)
    r = run_build(spec, tmp_path / "a", ["gfx942"], "--pack")
    run_build(spec, tmp_path / "b", ["gfx942"], "--pack")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n
    assert f"and {tmp_path / 'a.flyship'}" in r.stdout
    assert (tmp_path / "a.flyship").read_bytes() == (tmp_path / "b.flyship").read_bytes()


def test_code_object_version_5_keeps_the_text_identical(tmp_path):
    spec = _small_spec(tmp_path, ADD_ONLY)
    run_build(spec, tmp_path / "v5", ["gfx942"], "--code-object-version", "5")
    v = M.read(tmp_path / "v5").op("add").specializations[0].variants[0]
    assert v.code_object.code_object_version == 5
    assert CodeObjectFile((tmp_path / "v5" / v.code_object.file).read_bytes()).code_object_version == 5
    assert ".text" in v.proof.identical_sections


def test_unknown_arch_is_refused_with_the_known_ones(tmp_path):
    r = run_build(_small_spec(tmp_path, ADD_ONLY), tmp_path / "o", ["gfx9999"], check=False)
    assert r.returncode == 1
    assert "unknown arch 'gfx9999'" in r.stderr and "gfx942" in r.stderr
    assert not (tmp_path / "o").exists()


def test_missing_llvm_tools_say_which_package_provides_them(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_build(_small_spec(tmp_path, ADD_ONLY), tmp_path / "o", ["gfx942"], "--llvm-bin", str(empty), check=False)
    assert r.returncode == 1
    assert "llvm-mc" in r.stderr and "llvm-22" in r.stderr and str(empty) in r.stderr
    assert not (tmp_path / "o").exists()


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = run_build(_small_spec(tmp_path, ADD_ONLY), out, ["gfx942"], check=False)
    assert r.returncode == 1 and "--force" in r.stderr
    assert (out / "keep.txt").read_text() == "mine"


def test_a_spec_file_that_does_not_import_is_reported(tmp_path):
    spec = _small_spec(tmp_path, "import no_such_module_here\n")
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert "failed to import" in r.stderr and "no_such_module_here" in r.stderr


def test_a_flydsl_trace_error_names_kernel_spec_and_the_dsl_message(tmp_path):
    (tmp_path / "broken.py").write_text(textwrap.dedent("""
        import flydsl.compiler as flyc
        import flydsl.expr as fx

        @flyc.kernel
        def broken_kernel(x: fx.Tensor):
            fx.this_function_does_not_exist(x)

        @flyc.jit
        def broken(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
            broken_kernel(x).launch(grid=(1, 1, 1), block=(64, 1, 1), stream=stream)
    """))
    spec = _small_spec(tmp_path, """
        sys.path.insert(0, __file__.rsplit('/', 1)[0])
        from broken import broken
        op("broken", kernel=broken, args=[Tensor("x", rank=1), Output("out", like="x")],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64,)})])
    """)
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert "op broken spec f32 target gfx942" in r.stderr
    assert "this_function_does_not_exist" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_spec_that_omits_a_launcher_parameter_is_refused(tmp_path):
    spec = _small_spec(tmp_path, """
        from elementwise import add
        op("add", kernel=add, args=[Tensor("x", rank=2), Output("out", like="x")],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 70)})])
    """)
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert "op add: args= declares the runtime parameters (x, out) but launcher 'add' takes (x, y, out)" in r.stderr


def test_lds_over_the_target_limit_fails_naming_the_kernel(example_bundle):
    import dataclasses

    from flyship.compiler.frontends import FrontendError
    from flyship.compiler.frontends.tail import check_resources
    from flyship.compiler.spec import Spec

    v = M.read(example_bundle).op("gemm").specializations[0].variants[0]
    meta = dataclasses.replace(v.metadata, group_segment_fixed_size=96 * 1024)
    spec, block = Spec(name="bf16", dtypes={}, shapes={}), v.launch.block
    with pytest.raises(FrontendError, match=r"gemm_kernel_0 uses 98304 bytes of LDS / shared memory \(0 dynamic "
                                            r"\+ 98304 static\), over the target's 65536"):
        check_resources(meta, block, 0, "gfx942", spec, v.code_object.symbol, "op gemm")
    check_resources(meta, block, 0, "gfx950", spec, v.code_object.symbol, "op gemm")  # fits gfx950's 160 KiB
    spill = dataclasses.replace(v.metadata, private_segment_fixed_size=64)
    with pytest.raises(FrontendError, match="spills to scratch"):
        check_resources(spill, block, 0, "gfx942", spec, v.code_object.symbol, "op gemm")
    allowed = Spec(name="bf16", dtypes={}, shapes={}, allow_scratch=True)
    check_resources(spill, block, 0, "gfx942", allowed, v.code_object.symbol, "op gemm")


def test_args_in_another_order_than_the_launchers_are_refused_before_compiling(tmp_path):
    spec = _small_spec(tmp_path, """
        from elementwise import add
        op("add", kernel=add, args=[Tensor("x", rank=2), Output("out", like="x"), Tensor("y", rank=2)],
           specs=[Spec("f32", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (64, 70), "y": (64, 70)})])
    """)
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert "args= declares the runtime parameters (x, out, y) but launcher 'add' takes (x, y, out)" in r.stderr
    assert "kernels" not in r.stderr.split("error:")[0]  # nothing was compiled


def test_a_reference_that_does_not_exist_or_imports_beyond_torch_is_refused_before_compiling(tmp_path):
    (tmp_path / "refs.py").write_text("import torch\n\ndef add_ref(x, y):\n    return x + y\n")
    spec = _small_spec(tmp_path, "references('refs.py')\n" + textwrap.dedent(ADD_ONLY).replace(
        'specs=[', 'reference="add_reff", specs=['))
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1 and "reference='add_reff' is not defined" in r.stderr and "add_ref" in r.stderr
    (tmp_path / "refs.py").write_text("import numpy\nfrom . import helper\n\ndef add_ref(x, y):\n    return x + y\n")
    spec = _small_spec(tmp_path, "references('refs.py')\n" + textwrap.dedent(ADD_ONLY).replace('specs=[', 'reference="add_ref", specs=['))
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1 and "imports 'numpy'" in r.stderr


def test_a_constraint_given_as_a_bare_string_or_naming_a_bad_dim_is_refused_with_the_spec(tmp_path):
    spec = _small_spec(tmp_path, ADD_ONLY.replace('shapes={"x": (64, 70), "y": (64, 70)})',
                                                  'shapes={"x": (64, 70), "y": (64, 70)}, constraints=("x.shape[1] <= 8"))'))
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1 and "note the comma" in r.stderr
    spec = _small_spec(tmp_path, ADD_ONLY.replace('shapes={"x": (64, 70), "y": (64, 70)})',
                                                  'shapes={"x": (64, 70), "y": (64, 70)}, constraints=("x.shape[2] == 1",))'))
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1 and "op add spec f32: constraint 'x.shape[2] == 1'" in r.stderr and "out of range" in r.stderr


def test_a_kernel_that_crashes_its_worker_is_named_and_the_others_still_build(tmp_path):
    (tmp_path / "crash.py").write_text(textwrap.dedent("""
        import os
        import flydsl.compiler as flyc
        import flydsl.expr as fx

        @flyc.jit
        def crash(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
            os.write(2, b"LLVM ERROR: the native code's own words\\n")
            os.abort()  # what an assertion in the DSL's native code does to the process
    """))
    spec = _small_spec(tmp_path, textwrap.dedent(ADD_ONLY) + """
sys.path.insert(0, __file__.rsplit('/', 1)[0])
from crash import crash
op("crash", kernel=crash, args=[Tensor("x", rank=1), Output("out", like="x")],
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64,)})])
""")
    r = run_build(spec, tmp_path / "o", ["gfx942"], "-j", "1", check=False)
    assert r.returncode == 1
    assert "1 of 2 kernels failed" in r.stderr
    assert "crash.f32 on gfx942: the worker process died while compiling this kernel" in r.stderr
    report = r.stderr[r.stderr.index("crash.f32 on gfx942: the worker process died"):]
    assert "it printed:\nLLVM ERROR: the native code's own words" in report  # quoted in the error, not lost
    assert "add.f32:" not in r.stderr.split("failed; nothing was written")[1]


def test_the_bundle_folder_is_readable_by_other_users(tmp_path):
    import os
    import stat

    spec = _small_spec(tmp_path, ADD_ONLY)
    run_build(spec, tmp_path / "perm", ["gfx942"])
    mode = stat.S_IMODE(os.stat(tmp_path / "perm").st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o777 & ~umask


def test_constant_guard_constraints_are_decided_at_build_true_ones_dropped_false_ones_refused():
    """A constant Value feeding launcher arithmetic gave guards like '1024 <= 2147483647': constant constraints
    read nothing of the call, so the build decides them."""
    from flyship.compiler import pipeline

    kept = pipeline.guard_constraints("op o spec s on gfx942",
                                   ("1024 <= 2147483647", "0 <= 2147483647", "x.shape[0] <= 8", "2 > 1"))
    assert kept == ("x.shape[0] <= 8",)
    with pytest.raises(CompileError) as e:
        pipeline.guard_constraints("op o spec s on gfx942", ("x.shape[0] <= 8", "4096 <= 1024"))
    assert str(e.value).startswith("op o spec s on gfx942: expected every guard constraint to hold for some call, "
                                   "got '4096 <= 1024', which reads nothing of the call and is false")


def test_a_constant_true_spec_constraint_is_not_written_into_the_guard(tmp_path):
    pytest.importorskip("triton", reason="needs triton (the FlyDSL venv); it builds a Triton kernel for sm_90")
    spec = tmp_path / "const_spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "examples" / "triton")!r})
        from tl_rmsnorm import rmsnorm_kernel
        from flyship.compiler.spec import *
        namespace("const_guard")
        op("rmsnorm", kernel=rmsnorm_kernel,
           args=[Tensor("x", rank=2), Tensor("w", rank=1), Output("out", like="x"),
                 Value("x_row_stride", "x.stride[0]"), Value("out_row_stride", "out.stride[0]"),
                 Value("n_cols", "x.shape[1]"), Scalar("eps", "float", 1e-6), Constexpr("BLOCK_N")],
           grid=("x.shape[0]",),
           specs=[Spec("f16", dtypes={{"x": "float16", "w": "float16"}}, shapes={{"x": (8, 1000), "w": (1000,)}},
                       constexprs={{"BLOCK_N": 1024}},
                       constraints=("x.shape[1] <= BLOCK_N", "w.shape[0] == x.shape[1]", "2 > 1"))])
    """))
    run_build(spec, tmp_path / "b", ["sm_90"])
    s, generic = M.read(tmp_path / "b").op("rmsnorm").specializations  # the JIT's variant, then the generic one
    assert generic.name == "f16__generic"
    assert "x.shape[1] <= 1024" in s.guard.constraints
    assert not any(is_constant(c) for c in s.guard.constraints), s.guard.constraints
