"""Issue 9 launcher patterns: examples/flydsl/patterns.py builds for gfx942 and gfx950, proven against FlyDSL's
own code object, and the spec mistakes the issue lists are refused at build time (run as a user would)."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.errors import CodeObjectError
from flyship.bundle.expr import evaluate_with_shapes

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile
I32_MAX = 2**31 - 1


def _passes(guard: M.Guard, shapes: dict, strides: dict | None = None) -> bool:
    return all(evaluate_with_shapes(c, shapes, {}, strides) for c in guard.constraints)


def test_a_launcher_whose_stream_has_no_default_builds_for_both_targets_proven_and_packed_per_metadata(
        patterns_bundle):
    m = M.read(patterns_bundle)
    for op in m.ops:
        for spec in op.specializations:
            assert sorted(v.target for v in spec.variants) == ["gfx942", "gfx950"], (op.name, spec.name)
            for t in (t for v in spec.variants for t in v.launches):  # every kernel a call launches
                data = (patterns_bundle / t.code_object.file).read_bytes()
                assert t.proof.method == "flydsl-binary" and t.proof.metadata == "equal"
                assert hashlib.sha256(data).hexdigest() == t.code_object.sha256
                rules.check_layout(t.kernargs, t.metadata, f"{op.name}.{spec.name}.{t.target}")
                assert CodeObjectFile(data).kernel_metadata(t.code_object.symbol) == t.metadata
    spec = m.op("scale").specializations[0]
    for v in spec.variants:
        data = (patterns_bundle / v.code_object.file).read_bytes()
        assert hashlib.sha256(data).hexdigest() == v.code_object.sha256
        assert v.proof.method == "flydsl-binary" and ".text" in v.proof.identical_sections
        assert v.proof.metadata == "equal"
        co = CodeObjectFile(data)
        assert co.kernel_metadata(v.code_object.symbol) == v.metadata
        rules.check_layout(v.kernargs, v.metadata, f"scale.{v.target}")
        got = [(f.kind, f.type, f.arg) for f in v.kernargs.fields]
        assert got == [("pointer", "ptr", "x"), ("shape", "i32", "x"), ("shape", "i32", "x"), ("stride", "i64", "x"),
                       ("pointer", "ptr", "out"), ("shape", "i32", "out"), ("shape", "i32", "out"),
                       ("stride", "i64", "out"), ("scalar", "f32", "alpha")]


def test_the_float32_scalar_is_a_float_in_the_schema_and_an_f32_kernel_argument(patterns_bundle):
    op = M.read(patterns_bundle).op("scale")
    assert [(a.name, a.kind) for a in op.args] == [("x", "tensor"), ("alpha", "float")]
    v = op.specializations[0].variants[0]
    assert [f.type for f in v.kernargs.fields if f.arg == "alpha"] == ["f32"]


def test_a_constraint_naming_a_constexpr_is_stored_with_its_value(patterns_bundle):
    guard = M.read(patterns_bundle).op("scale").specializations[0].guard
    assert "x.shape[1] >= 256" in guard.constraints
    assert not any("TILE_N" in c for c in guard.constraints)


def test_the_guard_admits_the_largest_grid_that_fits_in_i32_and_refuses_one_past_the_wrap(patterns_bundle):
    # The launcher computes M * ((N + 255) // 256) in i32.
    guard = M.read(patterns_bundle).op("scale").specializations[0].guard
    assert "x.shape[0] * ((x.shape[1] + 255) // 256) <= 2147483647" in guard.constraints
    assert "x.shape[1] + 255 <= 2147483647" in guard.constraints
    rows_max = I32_MAX // 4  # N = 1024: 4 tiles per row
    assert _passes(guard, {"x": (rows_max, 1024), "out": (rows_max, 1024)})
    assert not _passes(guard, {"x": (rows_max + 1, 1024), "out": (rows_max + 1, 1024)})
    # N + 255 itself wraps within 255 of 2**31: the last N that does not wrap passes, the next does not.
    assert _passes(guard, {"x": (1, I32_MAX - 255), "out": (1, I32_MAX - 255)})
    assert not _passes(guard, {"x": (1, I32_MAX - 254), "out": (1, I32_MAX - 254)})


def test_a_column_major_example_builds_code_guarded_for_column_major_inputs_only(patterns_bundle):
    op = M.read(patterns_bundle).op("scale")
    row, col = op.specializations
    assert col.name == "f32_colmajor" and col.example.strides == {"x": (1, 1000)}
    assert "x.stride[0] == 1" in col.guard.constraints and "x.stride[1] == 1" not in col.guard.constraints
    shapes = {"x": (1000, 512), "out": (1000, 512)}
    column_major = {"x": (1, 1000), "out": (512, 1)}
    row_major = {"x": (512, 1), "out": (512, 1)}
    assert _passes(col.guard, shapes, column_major) and not _passes(col.guard, shapes, row_major)
    assert _passes(row.guard, shapes, row_major) and not _passes(row.guard, shapes, column_major)
    # The kernel gets x's dynamic stride (dim 1), never a packed 1 for the folded dim 0.
    for v in col.variants:
        x_strides = [f.dim for f in v.kernargs.fields if f.arg == "x" and f.kind == "stride"]
        assert x_strides == [1]
    assert [f.dim for f in row.variants[0].kernargs.fields if f.arg == "x" and f.kind == "stride"] == [0]


def test_an_int32_launcher_parameter_is_bound_to_its_value_expression_and_guarded_to_fit(patterns_bundle):
    spec = M.read(patterns_bundle).op("add_one_rows").specializations[0]
    for v in spec.variants:
        assert [(f.kind, f.type, f.arg, f.expr) for f in v.kernargs.fields] == [
            ("pointer", "ptr", "x", None), ("pointer", "ptr", "out", None), ("expr", "i32", None, "x.shape[0]")]
        assert v.launch.grid == ("x.shape[0] * 4", "1", "1")
    # What the builder baked in (N = 1024, contiguous rows, ROWS_MAX rows) is in the guard, the constexpr
    # written in; the Value packed as i32 must fit.
    for c in ("x.shape[1] == 1024", "x.stride[0] == 1024", "x.stride[1] == 1", "x.shape[0] <= 65536",
              "x.shape[0] <= 2147483647"):
        assert c in spec.guard.constraints
    assert _passes(spec.guard, {"x": (300, 1024), "out": (300, 1024)})
    assert not _passes(spec.guard, {"x": (300, 512), "out": (300, 512)})


def test_an_entry_point_is_built_as_the_user_calls_it_and_a_by_hand_unwrap_fails_the_proof(patterns_bundle):
    from flyship.compiler.frontends.flydsl.proof import PROOF, prove

    m = M.read(patterns_bundle)
    ours = m.op("divide").specializations[0]
    unwrapped = m.op("divide_unwrapped").specializations[0]
    assert [(a.name, a.kind) for a in m.op("divide").args] == [("x", "tensor"), ("alpha", "float")]
    for v, u in zip(ours.variants, unwrapped.variants):
        assert v.target == u.target and v.code_object.symbol == u.code_object.symbol
        assert [(f.kind, f.arg) for f in v.kernargs.fields] == [(f.kind, f.arg) for f in u.kernargs.fields]
        entry_co = (patterns_bundle / v.code_object.file).read_bytes()  # proven equal to FlyDSL's own for the call
        by_hand = (patterns_bundle / u.code_object.file).read_bytes()
        prove(entry_co, entry_co, v.code_object.symbol)
        # The wrapper's fast-math hints change the machine code: the unwrapped launcher is not what FlyDSL
        # runs for the entry, and the proof against the entry's normal call says so.
        with pytest.raises(CodeObjectError, match="prove") as e:
            prove(by_hand, entry_co, v.code_object.symbol)
        assert e.value.kind == PROOF


def test_an_entry_that_passes_a_tensor_it_made_itself_is_refused_naming_the_parameter(tmp_path):
    spec = _spec(tmp_path, """
        from divide import launch_divide
        from flyship.compiler.spec import entry

        def divide_copy(x, out, alpha, stream=None):
            return launch_divide(x.clone(), out, alpha)

        op("d", kernel=entry(divide_copy), args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha")],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 300)}, scalars={"alpha": 3.0})])
    """)
    err = _refused(tmp_path, spec)
    assert "entry 'divide_copy' passes launcher parameter 'x' a tensor that is none of the op's arguments" in err


def test_an_entry_whose_undeclared_parameters_have_no_default_is_refused_before_compiling(tmp_path):
    spec = _spec(tmp_path, """
        from flyship.compiler.spec import entry

        def f(x, out, alpha, stream):
            pass

        op("d", kernel=entry(f), args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha")],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 300)}, scalars={"alpha": 3.0})])
    """)
    err = _refused(tmp_path, spec)
    assert "args= declares (x, out, alpha) and entry 'f' takes (x, out, alpha, stream)" in err
    assert "every later parameter needs a default, got stream without one" in err
    assert "those left out" not in err


def test_an_entry_whose_declared_parameters_are_not_its_leading_ones_is_refused_naming_the_leading_rule(tmp_path):
    spec = _spec(tmp_path, """
        from flyship.compiler.spec import entry

        def f(x, out, alpha=2.0, stream=None):
            pass

        op("d", kernel=entry(f), args=[Tensor("x", rank=2), Scalar("alpha"), Output("out", like="x")],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 300)}, scalars={"alpha": 3.0})])
    """)
    err = _refused(tmp_path, spec)
    # Every parameter after the declared ones has a default: the rule broken is the order of the leading ones.
    assert ("expected args= to declare the first 3 parameters of entry 'f' in its order (x, out, alpha), got "
            "(x, alpha, out)") in err
    assert "must have defaults" not in err


def test_a_launcher_with_the_stream_and_a_constexpr_before_runtime_parameters_builds_like_its_usual_twin(
        patterns_bundle):
    m = M.read(patterns_bundle)
    first, usual = m.op("scale_stream_first").specializations[0], m.op("scale").specializations[0]
    assert [(a.name, a.kind) for a in m.op("scale_stream_first").args] == [("x", "tensor"), ("alpha", "float")]
    assert sorted(v.target for v in first.variants) == ["gfx942", "gfx950"]
    for v, u in zip(first.variants, usual.variants):
        assert v.target == u.target and v.kernargs == u.kernargs and v.launch == u.launch
        assert v.proof.method == "flydsl-binary" and ".text" in v.proof.identical_sections
        text = [CodeObjectFile((patterns_bundle / t.code_object.file).read_bytes()).section_bytes(".text")
                for t in (v, u)]
        assert text[0] == text[1]


def test_an_entry_that_rewraps_its_tensors_with_dynamic_layouts_binds_the_tensors_they_wrap(patterns_bundle):
    m = M.read(patterns_bundle)
    spec = m.op("scale_rewrapped").specializations[0]
    assert [(a.name, a.kind) for a in m.op("scale_rewrapped").args] == [("x", "tensor"), ("alpha", "float")]
    assert sorted(v.target for v in spec.variants) == ["gfx942", "gfx950"]
    for v in spec.variants:
        assert _pointers(v) == [("pointer", "x"), ("pointer", "out")]
        assert [f.arg for f in v.kernargs.fields if f.kind in ("shape", "stride")] == ["x", "x", "x", "out", "out",
                                                                                         "out"]
        assert v.proof.method == "flydsl-binary" and v.proof.metadata == "equal"


def test_an_entry_that_passes_a_literal_builds_with_the_declared_constant_value(patterns_bundle):
    m = M.read(patterns_bundle)
    spec = m.op("add_one_64_rows").specializations[0]
    assert [(a.name, a.kind) for a in m.op("add_one_64_rows").args] == [("x", "tensor")]  # no schema argument
    for v in spec.variants:
        assert [(f.kind, f.type, f.arg, f.expr) for f in v.kernargs.fields] == [
            ("pointer", "ptr", "x", None), ("pointer", "ptr", "out", None), ("expr", "i32", None, "64")]
    assert spec.example.grid == (256, 1, 1)


def test_an_entry_that_passes_an_undeclared_literal_is_told_to_declare_it_as_a_constant_value(tmp_path):
    spec = _spec(tmp_path, """
        from rows import add_one_rows
        from flyship.compiler.spec import entry

        def f(x, out):
            return add_one_rows(x, out, 64, N=1024)

        op("r", kernel=entry(f), args=[Tensor("x", rank=2), Output("out", like="x")],
           specs=[Spec("r64", dtypes={"x": "float32"}, shapes={"x": (64, 1024)}, constraints=("x.shape[0] == 64",))])
    """)
    err = _refused(tmp_path, spec)
    assert "entry 'f' passes launcher parameter 'm' the value 64, which is none of the op's scalar arguments" in err
    # 64 is the example's row count: the shape expression comes first, the constant only after it
    shape = err.index("64 is the example's x.shape[0]: if the entry computes it from the tensor, take it as an entry "
                      "parameter instead and declare Value('m', 'x.shape[0]') in args=")
    assert shape < err.index("is declared Value('m', '64') in args=")
    assert err.count("passes launcher parameter 'm'") == 1


def test_an_int_equal_to_no_example_size_is_told_only_to_declare_a_constant(tmp_path):
    spec = _spec(tmp_path, """
        from rows import add_one_rows
        from flyship.compiler.spec import entry

        def f(x, out):
            return add_one_rows(x, out, 7, N=1024)

        op("r", kernel=entry(f), args=[Tensor("x", rank=2), Output("out", like="x")],
           specs=[Spec("r64", dtypes={"x": "float32"}, shapes={"x": (64, 1024)})])
    """)
    err = _refused(tmp_path, spec)
    assert "a constant the entry passes itself (a fixed size, pinned by a constraint if it equals an input's) is " \
           "declared Value('m', '7') in args=" in err
    assert "example's" not in err


def test_a_constant_value_equal_to_an_example_size_without_a_pinning_constraint_is_refused(tmp_path):
    # Value("m", "64") with x of 64 rows and no "x.shape[0] == 64": a 5000-row call would run the 64-row kernel
    spec = _spec(tmp_path, """
        from rows import add_one_rows
        from flyship.compiler.spec import Value, entry

        def f(x, out):
            return add_one_rows(x, out, x.shape[0], N=1024)

        op("r", kernel=entry(f), args=[Tensor("x", rank=2), Output("out", like="x"), Value("m", "64")],
           specs=[Spec("r64", dtypes={"x": "float32"}, shapes={"x": (64, 1024)}, constraints=("x.shape[1] == 1024",))])
    """)
    err = _refused(tmp_path, spec)
    assert ("constant Value('m', '64') equals the example's x.shape[0], expected a constraint pinning that size "
            "(e.g. constraints=('x.shape[0] == 64',)), got none") in err
    assert "make it an entry parameter declared Value('m', 'x.shape[0]') instead" in err


@pytest.mark.parametrize("cu_count, rows", [(304, 300), (80, 80)])
def test_a_value_reading_the_device_cu_count_is_evaluated_at_the_specs_cu_count(tmp_path, cu_count, rows):
    # The row count is min(rows, CUs): the example call reads device.cu_count at the spec's cu_count.
    spec = _spec(tmp_path, f"""
        from rows import add_one_rows
        from flyship.compiler.spec import Value

        op("r", kernel=add_one_rows,  # out = x + 1 for the first min(rows, CUs) rows: no reference claims more
           args=[Tensor("x", rank=2), Output("out", like="x"), Value("m", "min(x.shape[0], device.cu_count)"),
                 Constexpr("N")],
           specs=[Spec("cu", dtypes={{"x": "float32"}}, shapes={{"x": (300, 1024)}}, constexprs={{"N": 1024}},
                       cu_count={cu_count}, constraints=("x.shape[1] == N", "x.stride[0] == N", "x.stride[1] == 1"))])
    """)
    run_build(spec, tmp_path / "o", ["gfx942"])
    spec = M.read(tmp_path / "o").op("r").specializations[0]
    assert f"device.cu_count == {cu_count}" in spec.guard.constraints
    (v,) = spec.variants
    assert ("expr", "i32", "min(x.shape[0], device.cu_count)") in [(f.kind, f.type, f.expr) for f in v.kernargs.fields]
    assert v.launch.grid == ("min(x.shape[0], device.cu_count) * 4", "1", "1")
    assert spec.example.grid == (rows * 4, 1, 1)  # min(300 rows, cu_count) rows of 4 tiles each


def test_a_struct_constexpr_builds_like_its_plain_constexpr_twin(patterns_bundle):
    m = M.read(patterns_bundle)
    cfg, plain = m.op("scale_cfg").specializations[0], m.op("scale").specializations[0]
    assert [a.name for a in m.op("scale_cfg").args] == ["x", "alpha"]
    for v, p in zip(cfg.variants, plain.variants):
        assert v.kernargs == p.kernargs and v.launch == p.launch
        same = (patterns_bundle / v.code_object.file).read_bytes(), (patterns_bundle / p.code_object.file).read_bytes()
        text = [CodeObjectFile(d).elf.get_section_by_name(".text").data() for d in same]
        assert text[0] == text[1]


def test_a_struct_constexpr_left_out_is_named_as_a_constexpr_to_declare_not_a_runtime_parameter(tmp_path):
    spec = _spec(tmp_path, """
        from scale import scale_cfg
        op("s", kernel=scale_cfg, args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha")],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 300)}, scalars={"alpha": 3.0})])
    """)
    err = _refused(tmp_path, spec)
    assert "takes compile-time parameters cfg with no default; declare Constexpr('cfg')" in err
    assert "declare cfg (" not in err


def _spec(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "spec.py"
    p.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples' / 'flydsl')!r})
        from flyship.compiler.spec import Constexpr, Output, Scalar, Spec, Tensor, namespace, op, references
        from scale import scale
        namespace("t")
        references({str(ROOT / 'examples' / 'flydsl' / 'references.py')!r})
    """) + textwrap.dedent(body))
    return p


SCALE = """
    op("scale", kernel=scale, reference=REF,
       args=[Tensor("x", rank=2), Output("out", OUT), Scalar("alpha", TYPE, default=2.0), Constexpr("TILE_N")],
       specs=[SPECS])
"""
F32 = 'Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)}, constexprs={"TILE_N": 256}, OPTS)'


def _scale(tmp_path: Path, ref: str = '"scale_ref"', out: str = 'like="x"', type_: str = '"float"',
           specs: str = F32, opts: str = "") -> Path:
    body = (SCALE.replace("REF", ref).replace("OUT", out).replace("TYPE", type_).replace("SPECS", specs)
            .replace(", OPTS", opts))
    return _spec(tmp_path, body)


def _refused(tmp_path: Path, spec: Path) -> str:
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert not (tmp_path / "o").exists()
    return r.stderr


def test_an_int_scalar_against_a_float32_launcher_parameter_is_refused_before_compiling(tmp_path):
    spec = _scale(tmp_path, type_='"int"')
    spec.write_text(spec.read_text().replace("default=2.0", "default=2"))  # an int default: only the type disagrees
    err = _refused(tmp_path, spec)
    assert "Scalar('alpha', 'int') declares an int but launcher 'scale' annotates alpha as Float32 (float)" in err
    assert "kernels" not in err.split("error:")[0]  # refused while reading the declarations


def test_an_output_shape_rule_that_disagrees_with_the_reference_is_refused_before_compiling(tmp_path):
    err = _refused(tmp_path, _scale(tmp_path, out='shape=("x.shape[1]", "x.shape[0]")'))
    assert "op scale spec f32: output out: expected the reference's result to match the output rule" in err
    assert "[1000, 100]" in err and "got shape [100, 1000]" in err


def test_example_shapes_that_violate_the_specs_own_constraints_are_refused_before_compiling(tmp_path):
    err = _refused(tmp_path, _scale(tmp_path, opts=', constraints=("x.shape[1] <= 512",)'))
    assert "op scale spec f32: expected the example shapes {'x': (100, 1000)} to satisfy the spec's constraint " \
           "'x.shape[1] <= 512'" in err


def test_options_flydsl_does_not_read_are_refused_and_maxnreg_says_use_waves_per_eu(tmp_path):
    err = _refused(tmp_path, _scale(tmp_path, opts=', options={"maxnreg": 128}'))
    assert "options ['maxnreg'] are not read by the FlyDSL frontend" in err and "waves_per_eu" in err
    err = _refused(tmp_path, _scale(tmp_path, opts=', options={"num_warps": 4}'))
    assert "options ['num_warps'] are not read by the FlyDSL frontend" in err


def test_a_specialization_an_earlier_one_always_takes_first_is_refused(tmp_path):
    narrow = F32.replace('"f32"', '"narrow"').replace(", OPTS", ', constraints=("x.shape[1] <= 4096",)')
    err = _refused(tmp_path, _scale(tmp_path, specs=F32 + ", " + narrow))
    assert "op scale: expected every specialization to be reachable, got 'narrow' behind 'f32'" in err


def test_a_feature_target_id_builds_a_flydsl_op_whose_e_flags_carry_the_features_and_the_proof_names_why(tmp_path):
    import subprocess

    from flyship.compiler.offload import make_offload_bundle, read_offload_bundle
    from flyship.compiler.toolchain import find_toolchain

    archs = ["gfx942", "gfx942:sramecc+:xnack-", "gfx950:sramecc-:xnack+"]
    run_build(_scale(tmp_path), tmp_path / "o", archs)
    m = M.read(tmp_path / "o")
    (spec,) = m.op("scale").specializations
    by_target = {v.target: v for v in spec.variants}
    assert sorted(by_target) == sorted(archs)
    texts = {}
    for t, v in by_target.items():
        data = (tmp_path / "o" / v.code_object.file).read_bytes()
        co = CodeObjectFile(data)
        texts[t] = co.section_bytes(".text")
        rules.check_layout(v.kernargs, v.metadata, f"scale.{t}")
        assert co.kernel_metadata(v.code_object.symbol) == v.metadata
        assert v.proof.method == "flydsl-binary" and ".text" in v.proof.identical_sections
        if t == "gfx942":
            assert v.proof.differences == ()
            continue
        # What the features change, and nothing else: e_flags' xnack/sramecc fields and amdhsa.target.
        flags, target_line = v.proof.differences
        assert flags.startswith("e_flags 0x") and "as target ID " + t + " asks" in flags
        assert target_line.startswith("amdhsa.target ") and target_line.split(" -> ")[1].startswith(
            "amdgcn-amd-amdhsa-unknown-" + t)
        assert co.metadata["amdhsa.target"].endswith(t)
        readelf = "/usr/lib/llvm-22/bin/llvm-readelf"
        if Path(readelf).exists():  # LLVM's own reading of the ELF header
            header = subprocess.run([readelf, "-h", str(tmp_path / "o" / v.code_object.file)], capture_output=True,
                                    text=True, check=True).stdout
            want = {"gfx942:sramecc+:xnack-": "xnack-, sramecc+", "gfx950:sramecc-:xnack+": "xnack+, sramecc-"}[t]
            assert want in header, header
    assert texts["gfx942"] == texts["gfx942:sramecc+:xnack-"]  # the same instructions, only declared
    assert "sramecc any -> on" in by_target["gfx942:sramecc+:xnack-"].proof.differences[0]
    assert "xnack any -> off" in by_target["gfx942:sramecc+:xnack-"].proof.differences[0]
    # An offload bundle takes one target ID per processor (clang-offload-bundler refuses gfx942 beside
    # gfx942:sramecc+:xnack-; flyc-build --offload-bundle says so before compiling).
    features = {t: (tmp_path / "o" / v.code_object.file).read_bytes() for t, v in by_target.items() if ":" in t}
    path = make_offload_bundle(features, find_toolchain(), tmp_path / "features.offload")
    entries = read_offload_bundle(path.read_bytes())
    assert entries["hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"] == (
        tmp_path / "o" / by_target["gfx942:sramecc+:xnack-"].code_object.file).read_bytes()
    assert "hipv4-amdgcn-amd-amdhsa--gfx950:sramecc-:xnack+" in entries
    r = run_build(_scale(tmp_path), tmp_path / "o2", archs[:2], "--offload-bundle", check=False)
    assert r.returncode == 1 and "expected one target ID per processor, got gfx942 and gfx942:sramecc+:xnack-" \
        in r.stderr and not (tmp_path / "o2").exists()


def test_pointer_launcher_parameters_are_bound_to_the_tensors_data_pointers_and_guarded(patterns_bundle):
    spec = M.read(patterns_bundle).op("add_one_ptr").specializations[0]
    assert spec.guard.dtypes == {"x": "float32"} and spec.guard.alignment == {"x": 4}
    for c in ("x.shape[1] == 1024", "x.stride[0] == 1024", "x.stride[1] == 1", "x.shape[0] <= 65536"):
        assert c in spec.guard.constraints
    assert sorted(v.target for v in spec.variants) == ["gfx942", "gfx950"]
    for v in spec.variants:
        assert v.tensor_abi == {"out": "pointer", "x": "pointer"}
        # Each pointer is a whole 8-byte kernel argument of its own: no shape or stride follows it.
        assert [(f.kind, f.type, f.arg, f.offset) for f in v.kernargs.fields] == [
            ("pointer", "ptr", "x", 0), ("pointer", "ptr", "out", 8), ("expr", "i32", None, 16)]
        assert [(a.offset, a.size) for a in v.metadata.args if not a.hidden][:3] == [(0, 8), (8, 8), (16, 4)]
        assert v.proof.method == "flydsl-binary" and v.proof.differences == ()


def test_a_launcher_that_launches_two_kernels_builds_both_in_order_proven_with_the_workspace_bound(patterns_bundle):
    spec = M.read(patterns_bundle).op("scale_add_one").specializations[0]
    for v in spec.variants:
        assert [t.code_object.symbol.rsplit("_", 1)[0] for t in v.launches] == ["scale_phase", "add_one_phase"]
        assert v.then[0].code_object.file == v.code_object.file  # FlyDSL puts both kernels in one code object
        assert all(t.proof.kernel_descriptor == "identical" and ".text" in t.proof.identical_sections
                   for t in v.launches)
        assert v.workspaces == (M.Workspace("tmp", ("x.shape[0]", "x.shape[1]"), "float32"),)
        first = [(f.kind, f.arg or f.expr) for f in v.kernargs.fields]
        assert first == [("pointer", "x"), ("shape", "x"), ("shape", "x"), ("stride", "x"), ("workspace", "tmp"),
                         ("expr", "x.shape[0]"), ("expr", "x.shape[1]"), ("expr", "x.shape[1]"), ("scalar", "alpha")]
        second = [(f.kind, f.arg or f.expr) for f in v.then[0].kernargs.fields]
        assert second[:4] == [("workspace", "tmp"), ("expr", "x.shape[0]"), ("expr", "x.shape[1]"),
                              ("expr", "x.shape[1]")]
        assert v.launch.grid == v.then[0].launch.grid == ("x.shape[0] * ((x.shape[1] + 255) // 256)", "1", "1")
    assert spec.example.grid == (400, 1, 1)


def test_an_entry_that_allocates_its_workspace_builds_with_the_buffer_bound_as_that_workspace(tmp_path):
    spec = _spec(tmp_path, """
        import torch
        from twophase import scale_add_one
        from flyship.compiler.spec import Workspace, entry

        def scale_add_one_entry(x, out, alpha):
            tmp = torch.empty_like(x)  # the entry's own buffer: flyship allocates it per call instead
            return scale_add_one(x, tmp, out, alpha, TILE_N=256)

        op("s", kernel=entry(scale_add_one_entry), reference="scale_add_one_ref",
           args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha"),
                 Workspace("tmp", shape=("x.shape[0]", "x.shape[1]"))],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 300)}, scalars={"alpha": 3.0})])
    """)
    run_build(spec, tmp_path / "o", ["gfx942"])
    (v,) = M.read(tmp_path / "o").op("s").specializations[0].variants
    assert [(f.kind, f.arg) for f in v.kernargs.fields if f.kind in ("pointer", "workspace")] == \
        [("pointer", "x"), ("workspace", "tmp")]
    assert [(f.kind, f.arg) for f in v.then[0].kernargs.fields if f.kind in ("pointer", "workspace")] == \
        [("workspace", "tmp"), ("pointer", "out")]


def test_a_constexpr_key_the_launcher_does_not_take_is_refused_and_a_defaulted_one_needs_no_declaration(tmp_path):
    body = """
        from softmax import softmax
        op("sm", kernel=softmax, args=[Tensor("x", rank=2), Output("out", like="x")], reference="softmax_ref",
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 300)}, constexprs={"MAX_N": 1024},
                       targets=("gfx942", "gfx950"), per_target={"gfx950": dict(constexprs={KEYS})})])
    """
    err = _refused(tmp_path, _spec(tmp_path, body.replace("KEYS", '"MAX_N": 2048, "VECC": 4')))
    assert ("op sm spec f32 (per_target gfx950): constexprs= gives ['VECC'], which launcher 'softmax' does not take "
            "as a compile-time parameter (it takes ['MAX_N', 'VEC']); fix the name or remove the key") in err
    ok = _spec(tmp_path, body.replace("KEYS", '"MAX_N": 2048, "VEC": 4'))  # defaulted: overridden, not declared
    r = run_build(ok, tmp_path / "ok", ["gfx942"], check=False)
    assert r.returncode == 0, r.stderr


def _pointers(t: M.Variant) -> list[tuple[str, str]]:
    return [(f.kind, f.arg) for f in t.kernargs.fields if f.kind in ("pointer", "workspace")]


def test_an_entry_that_calls_two_launchers_builds_one_code_object_per_call_with_the_workspace_in_both(
        patterns_bundle):
    m = M.read(patterns_bundle)
    spec = m.op("scale_add_one_split").specializations[0]
    assert sorted(v.target for v in spec.variants) == ["gfx942", "gfx950"]
    for v in spec.variants:
        assert [t.code_object.symbol.rsplit("_", 1)[0] for t in v.launches] == ["scale_phase", "add_one_phase"]
        # Two FlyDSL compiles: two code objects, each proved against FlyDSL's own from its own call.
        first, second = (patterns_bundle / t.code_object.file for t in v.launches)
        assert first != second and first.read_bytes() != second.read_bytes()
        for t in v.launches:
            assert t.proof.method == "flydsl-binary" and t.proof.kernel_descriptor == "identical"
            assert CodeObjectFile((patterns_bundle / t.code_object.file).read_bytes()).kernel_metadata(
                t.code_object.symbol) == t.metadata
            rules.check_layout(t.kernargs, t.metadata, f"scale_add_one_split.{t.target}.{t.code_object.symbol}")
        assert v.workspaces == (M.Workspace("tmp", ("x.shape[0]", "x.shape[1]"), "float32"),)
        assert _pointers(v) == [("pointer", "x"), ("workspace", "tmp")]
        assert _pointers(v.then[0]) == [("workspace", "tmp"), ("pointer", "out")]
        assert [f.arg for f in v.kernargs.fields if f.kind == "scalar"] == ["alpha"]
        # Launcher 2 sizes its grid from the workspace: written over the inputs, in the grid and in the guard.
        assert v.launch.grid == v.then[0].launch.grid == ("x.shape[0] * ((x.shape[1] + 255) // 256)", "1", "1")
    assert not any("tmp" in c for c in spec.guard.constraints)
    assert "x.shape[1] + 255 <= 2147483647" in spec.guard.constraints
    assert spec.example.grid == (400, 1, 1)


def test_a_declared_output_of_the_first_launcher_is_the_second_launchers_input(patterns_bundle):
    op = M.read(patterns_bundle).op("scale_and_add_one")
    assert [o.name for o in op.outputs] == ["scaled", "out"]
    for v in op.specializations[0].variants:
        assert v.workspaces == ()
        assert _pointers(v) == [("pointer", "x"), ("pointer", "scaled")]
        assert _pointers(v.then[0]) == [("pointer", "scaled"), ("pointer", "out")]
        assert v.code_object.file != v.then[0].code_object.file


THREE_CALLS = """
    import torch
    from twolaunchers import add_one_launcher, scale_launcher
    from flyship.compiler.spec import Workspace, entry

    def scale_add_two(x, out, alpha):
        t1, t2 = torch.empty_like(x), torch.empty_like(x)  # two buffers of one shape: told apart by identity
        scale_launcher(x, t1, alpha)
        add_one_launcher(t1, t2)
        add_one_launcher(t2, out)  # the same launcher again, same types: compiled for this call too

    op("s", kernel=entry(scale_add_two),
       args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha"),
             Workspace("t1", shape=("x.shape[0]", "x.shape[1]")), Workspace("t2", shape=("x.shape[0]", "x.shape[1]"))],
       specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 300)}, scalars={"alpha": 3.0})])
"""


def test_a_buffer_the_entry_passes_to_several_launchers_is_the_same_workspace_in_each(tmp_path):
    run_build(_spec(tmp_path, THREE_CALLS), tmp_path / "o", ["gfx942"])
    (v,) = M.read(tmp_path / "o").op("s").specializations[0].variants
    assert [_pointers(t) for t in v.launches] == [[("pointer", "x"), ("workspace", "t1")],
                                                  [("workspace", "t1"), ("workspace", "t2")],
                                                  [("workspace", "t2"), ("pointer", "out")]]
    # The second and third calls compile to the same bytes: one file for both.
    assert v.then[0].code_object.file == v.then[1].code_object.file != v.code_object.file
    assert sorted(p.name for p in (tmp_path / "o").glob("*.hsaco")) == ["s.f32.gfx942.2.hsaco", "s.f32.gfx942.hsaco"]


@pytest.mark.parametrize("body, message", [
    # an argument the entry computes itself cannot be bound to the op's
    ("add_one_launcher(tmp * 2, out)", "launcher 2 (add_one_launcher): entry 'f' passes launcher parameter 'src' a "
                                       "tensor that is none of the op's arguments"),
    ("add_one_launcher(torch.empty_like(x), out)", "launcher 2 (add_one_launcher): entry 'f' passes launcher "
                                                   "parameter 'src' a tensor that is none of the op's arguments"),
    ("scale_launcher(x, tmp, alpha * 2.0)", "launcher 2 (scale_launcher): entry 'f' passes launcher parameter "
                                            "'alpha' the value 6.0, which is none of the op's scalar arguments"),
    ("add_one_launcher(tmp, out)", "entry 'f' passes its launchers no tensor for ['t2']; declare only the "
                                   "workspaces the entry allocates"),
])
def test_what_an_entry_with_two_launchers_cannot_bind_is_refused_naming_the_launcher_call(tmp_path, body, message):
    spec = _spec(tmp_path, f"""
        import torch
        from twolaunchers import add_one_launcher, scale_launcher
        from flyship.compiler.spec import Workspace, entry

        def f(x, out, alpha):
            tmp = torch.empty_like(x)
            scale_launcher(x, tmp, alpha)
            {body}

        op("s", kernel=entry(f),
           args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha"),
                 Workspace("t1", shape=("x.shape[0]", "x.shape[1]")), Workspace("t2", shape=("x.shape[0]",))],
           specs=[Spec("f32", dtypes={{"x": "float32"}}, shapes={{"x": (8, 300)}}, scalars={{"alpha": 3.0}})])
    """)
    assert message in _refused(tmp_path, spec)


def test_an_entry_that_calls_no_launcher_is_refused(tmp_path):
    spec = _spec(tmp_path, """
        from flyship.compiler.spec import entry

        def f(x, out, alpha):
            return None

        op("s", kernel=entry(f), args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha")],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 300)}, scalars={"alpha": 3.0})])
    """)
    assert "expected entry 'f' to call a @flyc.jit launcher, got no call" in _refused(tmp_path, spec)


def test_an_entry_refused_by_flyships_own_check_is_not_retried_in_a_fresh_process(tmp_path):
    spec = _spec(tmp_path, """
        from divide import launch_divide
        from flyship.compiler.spec import entry

        def divide_copy(x, out, alpha, stream=None):
            return launch_divide(x.clone(), out, alpha)

        op("d", kernel=entry(divide_copy), args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha")],
           specs=[Spec(name, dtypes={"x": "float32"}, shapes={"x": shape}, scalars={"alpha": 3.0})
                  for name, shape in (("wide", (8, 300)), ("tall", (300, 8)))])
    """)
    # One worker: the second spec runs in a reused process, where a DSL's own failure would be retried.
    r = run_build(spec, tmp_path / "o", ["gfx942"], "-j", "1", check=False)
    assert r.returncode == 1, r.stderr
    assert "retried in a fresh process" not in r.stderr and "in a reused worker" not in r.stderr
    assert r.stderr.count("a tensor that is none of the op's arguments") == 2  # once per spec, never twice


def test_an_entry_that_passes_a_view_is_told_what_to_declare_instead(tmp_path):
    spec = _spec(tmp_path, """
        from rows import add_one_rows
        from flyship.compiler.spec import Value, entry

        def f(x, out, m):
            return add_one_rows(x.view(-1, 1024), out, m, N=1024)

        op("r", kernel=entry(f), args=[Tensor("x", rank=2), Output("out", like="x"), Value("m", "x.shape[0]")],
           specs=[Spec("r64", dtypes={"x": "float32"}, shapes={"x": (64, 1024)}, constraints=("x.shape[1] == 1024",))])
    """)
    err = _refused(tmp_path, spec)
    assert "passes launcher parameter 'x' a tensor that is none of the op's arguments" in err
    assert ("for a view (t.view(-1), t.view(torch.int8), t.reshape(...)), pass the tensor itself and let the launcher "
            "index it, or declare the op's tensor as the launcher sees it (a flat 1-D Tensor with rules on its numel, "
            "or the dtype the launcher reads) so the entry passes it unchanged") in err


def test_a_float_literal_an_entry_passes_is_declared_a_float_value_and_packed_as_an_f32_constant(tmp_path):
    body = """
        from scale import scale
        from flyship.compiler.spec import Value, entry

        def f(x, out):
            import flydsl.expr as fx
            return scale(x, out, 2.5, TILE_N=256, stream=fx.Stream(None))

        op("s", kernel=entry(f), args=[Tensor("x", rank=2), Output("out", like="x")DECL],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 256)},
                       constraints=("x.shape[1] == 256", "x.stride[0] == 256", "x.stride[1] == 1"))])
    """
    err = _refused(tmp_path, _spec(tmp_path, body.replace("DECL", "")))
    assert "a float constant the entry passes itself is declared Value('alpha', '2.5', type='f32') in args=" in err
    spec = _spec(tmp_path, body.replace("DECL", ", Value('alpha', '2.5', type='f32')"))
    run_build(spec, tmp_path / "o", ["gfx942"])
    (v,) = M.read(tmp_path / "o").op("s").specializations[0].variants
    assert ("constant", "f32", 2.5) in [(f.kind, f.type, f.value) for f in v.kernargs.fields]
    assert [a.name for a in M.read(tmp_path / "o").op("s").args] == ["x"]  # a constant is not in the schema


def test_a_float_value_must_be_a_literal():
    from flyship.compiler.spec import Value
    from flyship.errors import SpecError

    with pytest.raises(SpecError, match="expected a float literal"):
        Value("eps", "x.shape[0] * 0.5", type="f32")


def test_a_builders_returned_wrapper_is_accepted_as_the_user_calls_it(tmp_path):
    # The shape of FlyDSL's RoPE + KV cache / attention builders: a plain function closing over the launcher.
    spec = _spec(tmp_path, """
        from rows import add_one_rows
        from flyship.compiler.spec import Value

        def build_add_one(n):
            launcher = add_one_rows

            def run(x, out, m):
                return launcher(x, out, m, N=n)
            return run

        op("r", kernel=build_add_one(1024), args=[Tensor("x", rank=2), Output("out", like="x"),
                                                  Value("m", "x.shape[0]")],
           specs=[Spec("r64", dtypes={"x": "float32"}, shapes={"x": (64, 1024)},
                       constraints=("x.shape[1] == 1024", "x.stride[0] == 1024", "x.stride[1] == 1"))])
    """)
    run_build(spec, tmp_path / "o", ["gfx942"])
    (v,) = M.read(tmp_path / "o").op("r").specializations[0].variants
    assert ("expr", "i32", "x.shape[0]") in [(f.kind, f.type, f.expr) for f in v.kernargs.fields]


def test_a_plain_function_that_reaches_no_launcher_is_refused_naming_the_op_and_entry(tmp_path):
    spec = _spec(tmp_path, """
        import rows

        def run(x, out):
            return getattr(rows, "add_one_rows")(x, out, 64, N=1024)

        op("r", kernel=run, args=[Tensor("x", rank=2), Output("out", like="x")],
           specs=[Spec("r64", dtypes={"x": "float32"}, shapes={"x": (64, 1024)})])
    """)
    err = _refused(tmp_path, spec)
    assert "op r: kernel= is the plain Python function 'run', expected a DSL launcher or entry(...)" in err
    assert "declare kernel=entry(run)" in err


def test_a_spec_that_needs_a_newer_flydsl_is_refused_naming_both_versions_before_its_kernels_are_imported(tmp_path):
    from flyship.compiler.frontends.flydsl.versions import installed_version_without_import

    spec = _spec(tmp_path, """
        from flyship.compiler.frontends.flydsl import requires
        requires("999.1", "fx.future_thing")
        import no_such_kernel_module  # never reached: the version is refused first
    """)
    err = _refused(tmp_path, spec)
    assert f"expected FlyDSL >= 999.1 (for fx.future_thing), got {installed_version_without_import()}" in err
    assert "no_such_kernel_module" not in err
    spec = _spec(tmp_path, """
        from flyship.compiler.frontends.flydsl import requires
        requires("0.1.5")
        import no_such_kernel_module
    """)
    assert "no_such_kernel_module" in _refused(tmp_path, spec)  # an older minimum passes on to the imports
