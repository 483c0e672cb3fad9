"""Spec mistakes flyc-build reports when it reads the spec file, before anything compiles: each one a user made
(a typo in a processor name, ...), run through the CLI as the user would."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flyship.bundle.errors import BundleError
from flyship.bundle.targets import check_known, limits
from flyship.compiler.spec import Spec
from flyship.errors import SpecError

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile


def _spec_file(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "spec.py"
    p.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples' / 'flydsl')!r})
        from flyship.compiler.spec import Output, Scalar, Spec, Tensor, namespace, op
        from elementwise import add
        namespace("t")
    """) + textwrap.dedent(body))
    return p


def _add(spec_kwargs: str) -> str:
    return f"""
        op("add", kernel=add, args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x")],
           specs=[Spec("f32", dtypes={{"x": "float32", "y": "float32"}}, shapes={{"x": (64, 70), "y": (64, 70)}},
                       {spec_kwargs})])
    """


# -- 1. processor names ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, near", [("gfx0942", "gfx942"), ("gfx95", "gfx950"), ("sm_900", "sm_90"),
                                        ("gfx942x:xnack-", None)])
def test_an_unknown_processor_is_refused_naming_the_nearest_known_one(text, near):
    with pytest.raises(BundleError) as e:
        check_known(text)
    if near:
        assert f"did you mean {near!r}?" in str(e.value) and "known: " in str(e.value)
    assert check_known("gfx942:sramecc+:xnack-").processor == "gfx942" and check_known("sm_90a").sm == 90
    with pytest.raises(BundleError, match="did you mean 'gfx942'"):  # limits() reads the same table
        limits("gfx0942")


def test_a_spec_limited_to_or_varying_for_a_mistyped_processor_is_refused_when_declared():
    with pytest.raises(SpecError, match=r"Spec 'f32': targets: target gfx0942: expected a known AMD processor, got "
                                        r"'gfx0942'; did you mean 'gfx942'\?"):
        Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8,)}, targets=("gfx0942",))
    with pytest.raises(SpecError, match=r"per_target\['gfx0942'\]: .*did you mean 'gfx942'\?"):
        Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8,)}, per_target={"gfx0942": dict(shapes={"x": (16,)})})


def test_a_typo_in_targets_fails_the_build_instead_of_writing_an_empty_op(tmp_path):
    r = run_build(_spec_file(tmp_path, _add('targets=("gfx0942",)')), tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1 and "did you mean 'gfx942'?" in r.stderr
    assert not (tmp_path / "o").exists()


def test_an_op_with_no_specialization_for_any_requested_arch_is_an_error_naming_its_targets(tmp_path):
    r = run_build(_spec_file(tmp_path, _add('targets=("gfx950",)')), tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert "op add: expected a specialization for some --arch (gfx942), got none" in r.stderr
    assert "(add.f32: gfx950)" in r.stderr
    assert not (tmp_path / "o").exists()


# -- 2. expressions and op names, reported when the spec file is read ---------------------------------------------

def _triton_file(tmp_path: Path, grid: str, constraint: str = "x.numel >= 1") -> Path:
    p = tmp_path / "tspec.py"
    p.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples' / 'triton')!r})
        from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op
        from tl_elementwise import add_kernel
        namespace("t")
        op("add", kernel=add_kernel, grid=({grid!r},),
           args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x"), Value("n_elements", "x.numel"),
                 Constexpr("BLOCK")],
           specs=[Spec("f32", dtypes={{"x": "float32", "y": "float32"}}, shapes={{"x": (64, 70), "y": (64, 70)}},
                       constexprs={{"BLOCK": 1024}}, constraints=({constraint!r},))])
    """))
    return p


def _decl(grid=("cdiv(x.numel, BLOCK)",), values=("x.numel",), constraints=(), kernel=None, constexprs=None):
    from flyship.compiler.spec import Constexpr, OpDecl, Output, Tensor, Value

    return OpDecl(name="k", kernel=kernel, args=(Tensor("x", rank=2), Output("out", like="x"),
                                                 *(Value(f"v{i}", e) for i, e in enumerate(values)),
                                                 Constexpr("BLOCK")),
                  specs=(Spec("f", dtypes={"x": "float32"}, shapes={"x": (8, 8)},
                              constexprs=constexprs or {"BLOCK": 64}, constraints=constraints),),
                  reference=None, doc="", grid=grid, frontend="triton")


def test_a_grid_expression_naming_an_unknown_name_fails_the_build_before_any_compile(tmp_path):
    r = run_build(_triton_file(tmp_path, "cdiv(x.numel, BLOK)"), tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert ("op add: grid expression 'cdiv(x.numel, BLOK)' (spec f32): expression 'cdiv(x.numel, BLOK)': unknown "
            "name 'BLOK'") in r.stderr and "int constexprs (BLOCK)" in r.stderr
    assert "kernels (" not in r.stderr  # planning never started


@pytest.mark.parametrize("decl, message", [
    (dict(grid=("cdiv(x.numel, BLOCK",)), r"op k: grid expression 'cdiv\(x.numel, BLOCK' \(spec f\): .*not valid "
                                         r"syntax"),
    (dict(grid=("x.shape[2]",)), r"op k: grid expression 'x.shape\[2\]'.*out of range"),
    (dict(values=("x.numel", "x.nmel")), r"op k: Value v1 expression 'x.nmel' \(spec f\)"),
    # BLOCK is written in only when it is an int: a str constexpr leaves a name the loader cannot read
    (dict(constexprs={"BLOCK": "64"}), r"op k: grid expression 'cdiv\(x.numel, BLOCK\)' \(spec f\): .*unknown name "
                                       r"'BLOCK'"),
    (dict(constraints=("x.shape[0] <= v0",)), r"op k spec f: constraint 'x.shape\[0\] <= v0': .*unknown name 'v0'.*"
                                              r"a guard cannot read a Value, write its expression \(v0 is 'x.numel'\)"),
])
def test_a_bad_grid_value_or_guard_expression_is_refused_naming_the_op_and_the_expression(decl, message):
    from flyship.compiler.spec import validate

    validate(_decl())
    with pytest.raises(SpecError, match=message):
        validate(_decl(**decl))


def test_a_multi_launch_grid_is_checked_per_launch():
    import dataclasses

    from flyship.compiler.spec import Launch, validate

    base = _decl(grid=None)
    ok = dataclasses.replace(base, kernel=[Launch(None, ("x", "out", "v0"), ("cdiv(x.numel, BLOCK)",)),
                                           Launch(None, ("out",), ("out.shape[0]",))])
    bad = dataclasses.replace(ok, kernel=[ok.kernel[0], Launch(None, ("out",), ("out.shape[0] + y.numel",))])
    validate(ok)
    with pytest.raises(SpecError, match=r"op k: Launch 2 grid expression 'out.shape\[0\] \+ y.numel'.*unknown "
                                        r"name 'y'"):
        validate(bad)


def test_two_ops_of_one_name_are_refused_when_the_spec_file_is_read(tmp_path):
    r = run_build(_spec_file(tmp_path, _add("") + _add("")), tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert "op add: declared twice in spec file" in r.stderr and "torch.ops.t.add" in r.stderr
    assert "kernels (" not in r.stderr and not (tmp_path / "o").exists()


# -- 3. scalar defaults and example values -----------------------------------------------------------------------

def _scalar_decl(scalar, **spec):
    from flyship.compiler.spec import OpDecl, Output, Tensor

    return OpDecl(name="k", kernel=None, args=(Tensor("x", rank=2), Output("out", like="x"), scalar),
                  specs=(Spec("f", dtypes={"x": "float32"}, shapes={"x": (8, 8)}, **spec),), reference=None, doc="",
                  grid=("x.numel",), frontend="triton")


@pytest.mark.parametrize("scalar, spec, message", [
    (("n", "int", "4"), {}, r"op k: Scalar\('n', 'int', default='4'\): expected a value of scalar type int, got '4' "
                            r"\(str\); give an int"),
    (("n", "int", 1.5), {}, r"Scalar\('n', 'int', default=1.5\): .*got 1.5 \(float\); give an int"),
    (("eps", "float", "1e-6"), {}, r"Scalar\('eps', 'float', default='1e-6'\): .*\(str\); give a number"),
    (("flag", "bool", 1), {}, r"Scalar\('flag', 'bool', default=1\): .*give True or False"),
    (("n", "int", None), {"scalars": {"n": 2.0}}, r"op k spec f: scalars\['n'\]: expected a value of scalar type int"),
    (("n", "int", None), {"scalars": {"m": 2}}, r"op k spec f: scalars key 'm' names no Scalar of the op; its "
                                                r"scalars are n"),
])
def test_a_scalar_value_of_the_wrong_type_is_refused_when_declared(scalar, spec, message):
    from flyship.compiler.spec import Scalar, validate

    validate(_scalar_decl(Scalar("n", "int", 4)))
    validate(_scalar_decl(Scalar("eps", "float", 1)))  # an int is a number
    with pytest.raises(SpecError, match=message):
        validate(_scalar_decl(Scalar(*scalar), **spec))


def test_a_str_default_is_blamed_on_the_scalar_not_the_reference(tmp_path):
    refs = ROOT / "examples" / "flydsl" / "references.py"
    spec = _spec_file(tmp_path, f"""
        from flyship.compiler.spec import references
        from rmsnorm import rmsnorm
        references({str(refs)!r})
        op("rmsnorm", kernel=rmsnorm, reference="rmsnorm_ref",
           args=[Tensor("x", rank=2), Tensor("w", rank=1), Output("out", like="x"), Scalar("eps", "float", default="1e-6")],
           specs=[Spec("f32", dtypes={{"x": "float32", "w": "float32"}}, shapes={{"x": (256, 4096), "w": (4096,)}},
                       constexprs={{"MAX_N": 8192}})])
    """)
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert "op rmsnorm: Scalar('eps', 'float', default='1e-6'): expected a value of scalar type float" in r.stderr
    assert "rmsnorm_ref" not in r.stderr


# -- 4. Triton and target features -----------------------------------------------------------------------------

def test_triton_with_a_feature_target_id_is_refused_before_compiling_saying_what_works(tmp_path):
    r = run_build(_triton_file(tmp_path, "cdiv(x.numel, BLOCK)"), tmp_path / "o", ["gfx942:sramecc+:xnack-"],
                  check=False)
    assert r.returncode == 1
    assert ("op add (Triton kernel): --arch gfx942:sramecc+:xnack-: Triton compiles for a processor, not for target "
            "features (sramecc+, xnack-)") in r.stderr
    assert "use --arch gfx942" in r.stderr and "kernels (" not in r.stderr and not (tmp_path / "o").exists()


# -- 5. a Triton kernel that rebinds a local to a parameter -----------------------------------------------------

REBIND = '''
import triton
import triton.language as tl


@triton.jit
def pick_kernel(x, out, n_elements, flag, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    src = out
    if flag > 0:
        src = x  # Triton prints x's and out's TTIR arguments as %src and %src_0
    tl.store(out + offs, tl.load(src + offs, mask=mask) + 1, mask=mask)
'''


def test_a_triton_kernel_rebinding_a_local_to_a_parameter_in_an_if_builds_with_the_right_binding(tmp_path):
    from flyship.bundle import manifest as M

    (tmp_path / "tl_rebind.py").write_text(REBIND)
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent("""
        from flyship.compiler.spec import Constexpr, Output, Scalar, Spec, Tensor, Value, namespace, op
        from tl_rebind import pick_kernel
        namespace("t")
        op("pick", kernel=pick_kernel, grid=("cdiv(x.numel, BLOCK)",),
           args=[Tensor("x", rank=1), Output("out", like="x"), Value("n_elements", "x.numel"),
                 Scalar("flag", "int", default=1), Constexpr("BLOCK")],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (4096,)}, constexprs={"BLOCK": 1024})])
    """))
    run_build(spec, tmp_path / "o", ["gfx942"])
    # the generic specialization: the JIT's variant before it compiles flag == 1 (the example) as a constant
    v = next(s for s in M.read(tmp_path / "o").op("pick").specializations if s.name == "f32__generic").variants[0]
    assert [(f.kernel_arg, f.kind, f.arg or f.expr) for f in v.kernargs.fields[:4]] == [
        ("x", "pointer", "x"), ("out", "pointer", "out"), ("n_elements", "expr", "x.numel"), ("flag", "scalar", "flag")]


# -- 6. the write check follows pointers chosen by scf.if ----------------------------------------------------------

CHOOSE = '''
import triton
import triton.language as tl


@triton.jit
def choose_kernel(x, out, n_elements, flag, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    v = tl.load(x + offs, mask=mask)
    if flag > 0:  # enough work in each branch that Triton keeps an scf.if yielding the pointer
        dst = x + offs
        v = v * 2
    else:
        dst = out + offs
        v = v + 1
    tl.store(dst, v, mask=mask)
'''


def test_a_triton_store_through_either_x_or_out_names_x_when_x_is_not_mutable(tmp_path):
    (tmp_path / "tl_choose.py").write_text(CHOOSE)
    spec = tmp_path / "spec.py"
    decl = textwrap.dedent("""
        from flyship.compiler.spec import Constexpr, Output, Scalar, Spec, Tensor, Value, namespace, op
        from tl_choose import choose_kernel
        namespace("t")
        op("choose", kernel=choose_kernel, grid=("cdiv(x.numel, BLOCK)",),
           args=[Tensor("x", rank=1MUT), Output("out", like="x"), Value("n_elements", "x.numel"),
                 Scalar("flag", "int", default=1), Constexpr("BLOCK")],
           specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (4096,)}, constexprs={"BLOCK": 1024})])
    """)
    spec.write_text(decl.replace("MUT", ""))
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1
    assert "the kernel stores through parameter 0 (x, offset 0), bound to input tensor 'x'" in r.stderr
    spec.write_text(decl.replace("MUT", ", mutable=True"))  # declared: the same kernel builds
    run_build(spec, tmp_path / "o2", ["gfx942"])


@pytest.mark.parametrize("stop, shown", [
    ("import pytest\npytest.skip('needs a GPU')", "Skipped('needs a GPU')"),
    ("import sys\nsys.exit(3)", "SystemExit('3')"),
])
def test_a_spec_file_stopped_by_a_base_exception_at_import_is_one_line_naming_the_file(tmp_path, stop, shown):
    spec = _spec_file(tmp_path, _add(""))
    spec.write_text(spec.read_text() + "\n" + stop + "\n")  # after the declarations: only the exception is wrong
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1 and not (tmp_path / "o").exists()
    assert "Traceback" not in r.stderr, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert f"spec file {spec}" in line and shown in line and "raised at import" in line


def test_a_refused_declaration_is_reported_once_for_all_targets_with_fix_the_spec():
    from flyship.compiler.pipeline import failure_report
    from flyship.compiler.worker import TaskResult

    msg = "FrontendError: op r spec s on {t}: entry 'f' passes launcher parameter 'm' the value 64, ..."
    refused = [TaskResult("r", "s", t, None, msg.format(t=t), deterministic=True) for t in ("gfx942", "gfx950")]
    dsl = [TaskResult("k", "s", t, None, f"DSLError: on {t}: the DSL failed") for t in ("gfx942", "gfx950")]
    report = failure_report(refused + dsl)
    assert report.count("r.s on") == 1 and "r.s on gfx942, gfx950: FrontendError: op r spec s on gfx942:" in report
    refusal = report.split("k.s on")[0]
    assert "next step: fix the spec (or the entry) as the error above says" in refusal
    assert "ship the rest with --keep-going" not in refusal and "limit the spec to the targets" not in refusal
    # the DSL's own failure may depend on the target: one block per target, as before
    assert report.count("k.s on gfx942:") == 1 and report.count("k.s on gfx950:") == 1
    assert report.count("next step: fix the kernel or the spec for gfx9") == 2


def test_a_refusal_that_reads_the_same_for_a_spec_and_its_jit_twin_is_reported_once():
    # A trial user's Launch(options={"num_warp": 8}) was refused twice, for f32 and the auto-made f32__generic.
    from flyship.compiler.pipeline import failure_report
    from flyship.compiler.worker import TaskResult

    msg = "FrontendError: op r spec {s} target {t} launch 1 (k): options ['num_warp'] are not Triton cuda options"
    refused = [TaskResult("r", s, t, None, msg.format(s=s, t=t), deterministic=True)
               for s in ("f32", "f32__generic") for t in ("sm_90", "sm_80")]
    report = failure_report(refused)
    assert report.count("next step") == 1 and "r.f32, f32__generic on sm_90, sm_80: FrontendError: op r spec f32 " \
        "target sm_90" in report, report
    other = TaskResult("r", "bf16", "sm_90", None, "FrontendError: op r spec bf16: something else", deterministic=True)
    assert failure_report([*refused, other]).count("next step") == 2  # a different refusal keeps its own block
