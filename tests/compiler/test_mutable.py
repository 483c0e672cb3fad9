"""Inputs a kernel writes in place (issue 9, pattern 7) at build time: the manifest marks them, the FlyDSL fused
add + RMSNorm builds for both targets with its proof, and flyc-build refuses a kernel that stores through an input
the spec did not declare (FlyDSL: read from the LLVM IR; Triton: from the TTIR), and a reference that returns the
new value instead of writing it in place."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.codeobject import CodeObjectFile
from flyship.errors import CompileError

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile


def test_the_flydsl_fused_add_rmsnorm_marks_the_residual_mutable_and_makes_no_output_for_it(patterns_bundle):
    op = M.read(patterns_bundle).op("fused_add_rmsnorm")
    assert [(a.name, a.mutable) for a in op.args] == [("x", False), ("residual", True), ("w", False),
                                                       ("eps", False)]
    assert op.mutable == ("residual",) and [o.name for o in op.outputs] == ["out"]
    (spec,) = op.specializations
    assert sorted(v.target for v in spec.variants) == ["gfx942", "gfx950"]
    for v in spec.variants:
        data = (patterns_bundle / v.code_object.file).read_bytes()
        assert hashlib.sha256(data).hexdigest() == v.code_object.sha256
        assert v.proof.method == "flydsl-binary" and ".text" in v.proof.identical_sections
        assert CodeObjectFile(data).kernel_metadata(v.code_object.symbol) == v.metadata
        rules.check_layout(v.kernargs, v.metadata, f"fused_add_rmsnorm.{v.target}")
        # The kernel gets the residual's own pointer (written in place) and the fresh output's.
        assert [f.arg for f in v.kernargs.fields if f.kind == "pointer"] == ["x", "residual", "w", "out"]


def _spec(tmp_path: Path, folder: str, body: str) -> Path:
    p = tmp_path / "spec.py"
    p.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples' / folder)!r})
        from flyship.compiler.spec import Constexpr, Output, Scalar, Spec, Tensor, Value, namespace, op, references
        namespace("t")
    """) + textwrap.dedent(body))
    return p


def _refused(tmp_path: Path, spec: Path, arch: str) -> str:
    r = run_build(spec, tmp_path / "o", [arch], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert not (tmp_path / "o").exists()
    return r.stderr


ADD_INTO = """
    from fused_add_rmsnorm import add_into
    op("add_into", kernel=add_into,
       args=[Tensor("x", rank=2), Tensor("y", rank=2, mutable=MUT), Output("out", like="x")],
       specs=[Spec("f32", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (8, 300), "y": (8, 300)})])
"""


def test_a_flydsl_kernel_that_writes_an_input_it_did_not_declare_fails_naming_it(tmp_path):
    err = _refused(tmp_path, _spec(tmp_path, "flydsl", ADD_INTO.replace("MUT", "False")), "gfx942")
    assert "the kernel stores through parameter" in err and "bound to input tensor 'y'" in err
    assert "Tensor('y', ..., mutable=True)" in err
    # Declared, the same kernel builds, and the manifest says so.
    run_build(_spec(tmp_path, "flydsl", ADD_INTO.replace("MUT", "True")), tmp_path / "ok", ["gfx942"])
    assert M.read(tmp_path / "ok").op("add_into").mutable == ("y",)
    assert "op(..., mutable=['y'])" in err


def test_op_mutable_declares_every_written_input_at_once_as_the_refusal_says(tmp_path):
    # Issue 34 item 4: upstream's KV-cache writers write two caches; the refusal names the one-line fix for both.
    # mutable=True: the inputs the write check finds the kernel storing through (y, not x) are the mutable ones.
    one = ADD_INTO.replace("MUT", "False")
    body = one.replace('op("add_into", kernel=add_into,', 'op("listed", kernel=add_into, mutable=["y"],') + \
        one.split("\n", 2)[2].replace('op("add_into", kernel=add_into,', 'op("found", kernel=add_into, mutable=True,')
    run_build(_spec(tmp_path, "flydsl", body), tmp_path / "ok", ["gfx942"])
    for name in ("listed", "found"):
        op = M.read(tmp_path / "ok").op(name)
        assert op.mutable == ("y",) and [a.name for a in op.args if a.mutable] == ["y"], name


@pytest.mark.parametrize("value, says", [('["out"]', "expected names of the op's input Tensors (x, y), got 'out'"),
                                         ('"y"', "expected a list of the input tensors the kernel writes in place "
                                                 '(mutable=["KeyCache", "ValueCache"]) or True')])
def test_op_mutable_naming_no_input_tensor_is_refused_before_compiling(tmp_path, value, says):
    body = ADD_INTO.replace("MUT", "False").replace('op("add_into", kernel=add_into,',
                                                    f'op("add_into", kernel=add_into, mutable={value},')
    err = _refused(tmp_path, _spec(tmp_path, "flydsl", body), "gfx942")
    assert "op add_into: mutable" in err and says in err, err


FUSED_TRITON = """
    from tl_inplace import fused_add_rmsnorm_kernel
    references({refs!r})
    op("fused_add_rmsnorm", kernel=fused_add_rmsnorm_kernel, reference=REF,
       args=[Tensor("x", rank=2), Tensor("residual", rank=2, mutable=MUT), Tensor("w", rank=1), Output("out", like="x"),
             Value("x_row_stride", "x.stride[0]"), Value("r_row_stride", "residual.stride[0]"),
             Value("out_row_stride", "out.stride[0]"), Value("n_cols", "x.shape[1]"), Scalar("eps", "float", 1e-6),
             Constexpr("BLOCK_N")],
       grid=("x.shape[0]",),
       specs=[Spec("f32", dtypes={{"x": "float32", "residual": "float32", "w": "float32"}},
                   shapes={{"x": (4, 100), "residual": (4, 100), "w": (100,)}}, constexprs={{"BLOCK_N": 128}},
                   constraints=("x.shape[1] <= 128",))])
"""


def _fused_triton(tmp_path: Path, mutable: bool, ref: str, references: str) -> Path:
    (tmp_path / "refs.py").write_text(textwrap.dedent(references))
    body = FUSED_TRITON.format(refs=str(tmp_path / "refs.py")).replace("MUT", str(mutable)).replace("REF", repr(ref))
    return _spec(tmp_path, "triton", body)


GOOD_REF = """
    import torch
    def good(x, residual, w, eps=1e-6):
        residual.add_(x)
        return residual * w
    def returns_new(x, residual, w, eps=1e-6):
        return residual + x, (residual + x) * w
    def writes_nothing(x, residual, w, eps=1e-6):
        return (residual + x) * w
"""


def test_a_triton_kernel_that_writes_an_input_it_did_not_declare_fails_naming_it(tmp_path):
    err = _refused(tmp_path, _fused_triton(tmp_path, False, "writes_nothing", GOOD_REF), "sm_90")
    assert "the kernel stores through parameter 1 (residual" in err and "bound to input tensor 'residual'" in err


def test_a_reference_that_returns_the_new_value_instead_of_writing_it_in_place_is_refused(tmp_path):
    err = _refused(tmp_path, _fused_triton(tmp_path, True, "returns_new", GOOD_REF), "sm_90")
    assert "to return 1 tensor(s) (out), got 2" in err and "must write it in place" in err
    err = _refused(tmp_path, _fused_triton(tmp_path, True, "writes_nothing", GOOD_REF), "sm_90")
    assert "expected reference writes_nothing() to write residual in place" in err
    run_build(_fused_triton(tmp_path, True, "good", GOOD_REF), tmp_path / "ok", ["sm_90"])
    op = M.read(tmp_path / "ok").op("fused_add_rmsnorm")
    assert op.mutable == ("residual",)


def test_a_pair_whose_forward_writes_an_input_reads_grad_only_of_what_it_writes(tmp_path):
    # Since schema 5.0 an op that writes an input may declare a backward (docs/training.md); "grad:x" of an input it
    # does not write is refused by the rule book while the spec is read, naming what does get a gradient.
    body = FUSED_TRITON.format(refs=str(tmp_path / "refs.py")).replace("MUT", "True").replace("REF", "'good'")
    body = body.replace('grid=("x.shape[0]",),', 'grid=("x.shape[0]",), backward=Backward("fused_add_rmsnorm", '
                                                 'inputs={"x": "grad:x", "residual": "grad:residual", "w": "w"}, '
                                                 'grads={"x": "out"}),')
    (tmp_path / "refs.py").write_text(textwrap.dedent(GOOD_REF))
    spec = _spec(tmp_path, "triton", body.replace("from tl_inplace", "from flyship.compiler.spec import Backward\n"
                                                                      "    from tl_inplace"))
    err = _refused(tmp_path, spec, "sm_90")
    assert ("input x = 'grad:x': expected 'grad:' of an output or of an input fused_add_rmsnorm writes in place "
            "(out, residual)") in err


CLEAR_COUNTS = """
    import triton
    import triton.language as tl
    from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op, references

    @triton.jit
    def clear_kernel(x, counts, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m), mask=m)
        tl.store(counts + offs, tl.zeros([BLOCK], tl.int32), mask=m)

    namespace("t")
    references("refs.py")
    op("clear_counts", kernel=clear_kernel, reference="clear_counts",
       args=[Tensor("x", rank=1), Tensor("counts", rank=1, mutable=True), Output("out", like="x"),
             Value("n", "x.numel"), Constexpr("BLOCK")], grid=("cdiv(x.numel, BLOCK)",),
       specs=[Spec("f32", dtypes={"x": "float32", "counts": "DTYPE"}, shapes={"x": (64,), "counts": (64,)},
                   constexprs={"BLOCK": 64})])
"""


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "bool"])
def test_a_reference_that_zeroes_a_mutable_integer_tensor_passes_the_written_in_place_check(tmp_path, dtype):
    """Integer example tensors used to be all zeros, so a reference that zeroes a mutable int tensor left it
    "unchanged" and the build refused it; the written one now starts from seeded non-zero values."""
    from flyship.compiler import pipeline

    (tmp_path / "refs.py").write_text("def clear_counts(x, counts):\n    counts.zero_()\n    return x.clone()\n"
                                      "def keep_counts(x, counts):\n    return x.clone()\n")
    (tmp_path / "spec.py").write_text(textwrap.dedent(CLEAR_COUNTS).replace("DTYPE", dtype))
    sf = pipeline.load_spec_file(str(tmp_path / "spec.py"))
    pipeline.check_reference_outputs(sf, tmp_path / "refs.py")  # no CompileError: the zeroing shows
    # A reference that does not write it is still caught, with integers as with floats.
    (tmp_path / "spec.py").write_text(textwrap.dedent(CLEAR_COUNTS).replace("DTYPE", dtype)
                                      .replace('reference="clear_counts"', 'reference="keep_counts"'))
    with pytest.raises(CompileError, match="expected reference keep_counts\\(\\) to write counts in place"):
        pipeline.check_reference_outputs(pipeline.load_spec_file(str(tmp_path / "spec.py")), tmp_path / "refs.py")


def test_non_written_integer_examples_stay_zero_so_they_index_safely():
    import torch

    from flyship.compiler import pipeline

    idx = pipeline._example_tensor(torch, (16,), "int64", random=True)
    assert not idx.any()
    w = pipeline._example_tensor(torch, (1000,), "int32", random=True, written=True)
    assert int(w.min()) >= 2 and int(w.max()) < 100
    assert torch.equal(w, pipeline._example_tensor(torch, (1000,), "int32", random=True, written=True))  # seeded


def test_a_reference_returning_none_for_an_op_with_outputs_says_none_and_gives_no_in_place_hint(tmp_path):
    """An op with a mutable input and a declared output whose reference returns None: the message says "got
    None" and asks for the outputs; the in-place hint (meant for ops without outputs) is left out."""
    from flyship.compiler import pipeline

    (tmp_path / "refs.py").write_text("def none_back(x, counts):\n    counts.zero_()\n")
    (tmp_path / "spec.py").write_text(textwrap.dedent(CLEAR_COUNTS).replace("DTYPE", "int32")
                                      .replace('reference="clear_counts"', 'reference="none_back"'))
    with pytest.raises(CompileError) as e:
        pipeline.check_reference_outputs(pipeline.load_spec_file(str(tmp_path / "spec.py")), tmp_path / "refs.py")
    msg = str(e.value)
    assert "expected reference none_back() to return 1 tensor(s) (out), got None; return out from none_back()" in msg
    assert "in place" not in msg


ACCUM = """
    import triton
    import triton.language as tl
    from flyship.compiler.spec import Constexpr, Spec, Tensor, Value, namespace, op, references

    @triton.jit
    def accum_kernel(acc, x, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(acc + offs, tl.load(acc + offs, mask=m) + tl.load(x + offs, mask=m), mask=m)

    namespace("t")
    references("refs.py")
    op("accum", kernel=accum_kernel, reference=REF, mutable=MUT, grid=("cdiv(acc.numel, BLOCK)",),
       args=[Tensor("acc", rank=1), Tensor("x", rank=1), Value("n", "acc.numel"), Constexpr("BLOCK")],
       specs=[Spec("f32", dtypes={"acc": "float32", "x": "float32"}, shapes={"acc": (256,), "x": (256,)},
                   constexprs={"BLOCK": 256}, constraints=("x.shape[0] == acc.shape[0]",))])
"""
ACCUM_REFS = "def accum(acc, x):\n    acc.add_(x)\n\ndef nothing(acc, x):\n    pass\n"


def _accum(tmp_path: Path, ref: str, mutable: str) -> Path:
    (tmp_path / "refs.py").write_text(ACCUM_REFS)
    (tmp_path / "spec.py").write_text(textwrap.dedent(ACCUM).replace("REF", repr(ref)).replace("MUT", mutable))
    return tmp_path / "spec.py"


def test_op_mutable_true_with_no_outputs_builds_and_its_reference_is_checked_against_the_found_writes(tmp_path):
    # A trial user's spec: op(..., mutable=True) whose reference writes acc in place and returns None was refused
    # ("expected ... to return 0 tensor(s) (None), got None"): the check ran before mutable=True was resolved.
    run_build(_accum(tmp_path, "accum", "True"), tmp_path / "ok", ["sm_90"])
    op = M.read(tmp_path / "ok").op("accum")
    assert op.mutable == ("acc",) and not op.outputs
    # After the compile, the reference is held to the written set the kernel showed (acc).
    err = _refused(tmp_path, _accum(tmp_path, "nothing", "True"), "sm_90")
    assert "expected reference nothing() to write acc in place" in err, err


def test_a_reference_left_unchanged_names_both_fixes_when_the_kernel_may_write_another_input(tmp_path):
    # mutable=["x"] while the kernel writes acc: the reference check runs before the write check, so its message
    # names both possibilities (write x in the reference, or declare the input the kernel writes).
    from flyship.compiler import pipeline

    sf = pipeline.load_spec_file(str(_accum(tmp_path, "accum", '["x"]')))
    with pytest.raises(CompileError) as e:
        pipeline.check_reference_outputs(sf, tmp_path / "refs.py")
    assert "to write x in place" in str(e.value) and "if the kernel writes another input instead" in str(e.value)
