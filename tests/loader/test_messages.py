"""Messages a user meets: each says what was expected, what was got, and what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flyship.bundle.errors import BundleError

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cpu


def test_out_given_one_tensor_for_a_two_output_op_says_how_to_pass_both(fresh_ops):
    ops = fresh_ops()
    x = torch.empty(8, device="meta")
    with pytest.raises(TypeError, match=r"expected out= to hold 2 tensors, one per output \(sum, diff\), got one "
                                        r"Tensor; pass out=\(sum, diff\) or sum=..., diff=..."):
        ops.addsub.out(x, x, out=torch.empty(8, device="meta"))


def test_out_given_a_tuple_for_a_two_output_op_fills_the_outputs_in_order(fresh_ops):
    ops = fresh_ops()
    x = torch.empty(8, device="meta")
    s, d = torch.empty(8, device="meta"), torch.empty(8, device="meta")
    got = ops.addsub.out(x, x, out=(s, d))
    assert got[0] is s and got[1] is d


def test_load_accepts_the_manifest_file_of_a_bundle(tiny_bundle, tiny):
    import flyship

    assert flyship.load(tiny_bundle / "manifest.json") is tiny


def test_load_of_another_file_says_what_to_pass(tmp_path):
    import flyship

    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(BundleError, match="notes.txt: expected a bundle directory .* got a file that is not a zip "
                                          "archive .*; pass the folder"):
        flyship.load(f)


def test_a_dtype_key_naming_an_unknown_argument_is_a_spec_error():
    from flyship.compiler.spec import OpDecl, Output, Spec, Tensor, validate
    from flyship.errors import SpecError

    decl = OpDecl(name="add", kernel=None, args=(Tensor("x", rank=1), Output("out", like="x")),
                  specs=(Spec("f32", dtypes={"x": "float32", "z": "float32"}, shapes={"x": (8,)}),),
                  reference=None, doc="", grid=("1",), frontend="triton")
    with pytest.raises(SpecError, match="dtypes key 'z' names no input tensor; the op's input tensors are x"):
        validate(decl)


def test_flyc_build_from_a_python_without_flydsl_names_the_python_to_use(tmp_path):
    pytest.importorskip("click")
    if subprocess.run([sys.executable, "-c", "import flydsl"], capture_output=True).returncode == 0:
        pytest.skip("this Python has FlyDSL; the test runs flyc-build from one without it")
    r = subprocess.run([sys.executable, "-m", "flyship.compiler.cli", "examples/flydsl/ops.py", "-o",
                        str(tmp_path / "b"), "--arch", "gfx942"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "expected a Python with flydsl" in r.stderr and ".venv-flydsl/bin/flyc-build" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("manifest", ["{not json", '{"format": "flyship-bundle", "schema_version": "1.1"}', ""])
def test_flyship_list_on_a_damaged_bundle_prints_one_line_not_a_traceback(tmp_path, manifest):
    if manifest:
        (tmp_path / "manifest.json").write_text(manifest)
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "list", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("Error: "), r.stderr


def test_the_cpu_out_variant_refuses_an_out_tensor_of_the_wrong_dtype(fresh_ops):
    from flyship.errors import CallError

    ops = fresh_ops()
    x = torch.randn(8)
    with pytest.raises(CallError, match=r"expected out tensor 'out' of shape \[8\] and dtype float32, got shape \[8\] "
                                        r"and dtype float64; allocate it with torch.empty\(\[8\], dtype=torch.float32"):
        ops.add.out(x, x, out=torch.empty(8, dtype=torch.float64))


def test_the_cpu_out_variant_refuses_an_out_tensor_of_the_wrong_shape_before_running_the_reference(fresh_ops):
    from flyship.errors import CallError

    ops = fresh_ops()
    x = torch.randn(8)
    with pytest.raises(CallError, match=r"expected out tensor 'out' of shape \[8\] and dtype float32, got shape \[4\]"):
        ops.add.out(x, x, out=torch.empty(4))
    assert ops.add.stats()["calls"] == 0


def test_a_mixed_dtype_cpu_call_says_no_specialization_admits_the_dtypes(fresh_ops):
    from flyship.errors import CallError

    ops = fresh_ops()
    with pytest.raises(CallError, match=r"no specialization admits the input dtypes x=int32, y=float32 \(they take "
                                        r"x=float32, y=float32 \(f32\); x=float16, y=float16 \(f16\)\), and the "
                                        r"reference \(fallback\) returned output 'out' of shape \[4\], dtype float32 "
                                        r"on cpu; the manifest's rule gives \[4\], int32 on cpu; pass tensors of "
                                        r"dtypes the op takes"):
        ops.add(torch.ones(4, dtype=torch.int32), torch.ones(4))


def test_a_mixed_dtype_call_on_the_cpp_path_says_the_same(recorded_tiny):
    from flyship.errors import CallError

    ops = recorded_tiny()
    with pytest.raises(CallError, match=r"no specialization admits the input dtypes x=int32, y=float32 \(they take "
                                        r"x=float32, y=float32 \(f32\); x=float16, y=float16 \(f16\)\), and the "
                                        r"reference \(fallback\) returned output 'out' of shape \[4\], dtype float32 "
                                        r"on cpu; the manifest's rule gives \[4\], int32 on cpu; pass tensors of "
                                        r"dtypes the op takes"):
        ops.add(torch.ones(4, dtype=torch.int32), torch.ones(4))


def test_a_reference_that_raises_on_cpu_is_a_flyship_error_naming_the_reference(fresh_ops):
    from flyship.errors import CallError

    def broken(x, y):
        raise ValueError("reference is broken")

    ops = fresh_ops(references={"add": broken})
    with pytest.raises(CallError, match=r"the reference \(fallback\) raised ValueError: reference is broken"):
        ops.add(torch.ones(4), torch.ones(4))


@pytest.mark.parametrize("where", ["cpu", "meta"])
def test_a_rank_error_is_a_flyship_error_on_every_path(fresh_ops, where):
    from flyship.errors import CallError, FlyshipError

    ops = fresh_ops()
    with pytest.raises(CallError, match=r"expected 'x' of rank 2, got rank 1 \(shape \[7\]\); pass a tensor of rank "
                                        r"2") as e:
        ops.scale_rows(torch.ones(7, device=where))
    assert isinstance(e.value, FlyshipError) and isinstance(e.value, RuntimeError)


def test_a_rank_error_of_the_cpp_path_is_a_flyship_error(recorded_tiny):
    from flyship.errors import CallError

    ops = recorded_tiny()
    with pytest.raises(CallError, match=r"expected 'x' of rank 2, got rank 1 \(shape \[7\]\); pass a tensor of rank"):
        ops.scale_rows(torch.ones(7))
    with pytest.raises(CallError, match=r"expected 'x' of rank 2, got rank 1"):
        ops.scale_rows.dispatch(torch.ones(7), target="gfx942")


def test_a_wrong_argument_type_through_dispatch_is_a_flyship_type_error(recorded_tiny):
    from flyship.errors import CallTypeError

    ops = recorded_tiny()
    with pytest.raises(CallTypeError, match="expected 'alpha' to be a float, got a tensor of shape"):
        ops.scale_rows.dispatch(torch.ones(2, 2), torch.ones(2), target="gfx942")


@pytest.mark.parametrize("alpha", [torch.tensor(2.0), torch.tensor([2.0]), torch.tensor(2)])
def test_dispatch_takes_a_one_element_tensor_for_a_scalar_as_the_call_does(recorded_tiny, alpha):
    """torch's argument parser passes a one-element tensor given for a float as its value, so the call launches;
    dispatch, which says what a call would do, decides the same (it refused it before)."""
    ops = recorded_tiny()
    x = torch.ones(2, 2)
    decision = ops.scale_rows.dispatch(x, alpha, target="gfx942")
    ops.scale_rows(x, alpha)
    assert decision.spec is not None and ops.scale_rows.stats()["launches"][decision.spec] == 1


def test_a_string_where_a_number_goes_is_quoted_in_the_message(recorded_tiny):
    from flyship.errors import CallTypeError

    ops = recorded_tiny()
    with pytest.raises(CallTypeError, match=r"expected 'alpha' to be a float, got str '2'"):
        ops.scale_rows.dispatch(torch.ones(2, 2), "2", target="gfx942")


@pytest.mark.parametrize("target, message", [
    ("h100", r"target=: target ID 'h100': expected an AMD target like 'gfx942'"),
    ("GFX942", r"target=: target ID 'GFX942': expected an AMD target like .*; did you mean 'gfx942'\?"),
    ("sm90", r"target=: target ID 'sm90': expected an AMD target like .*; did you mean 'sm_90'\?"),
    (942, r"expected target= a device target ID string \('gfx942', 'sm_90'\), got int"),
])
def test_dispatch_with_a_bad_target_is_a_config_error_saying_what_to_pass(fresh_ops, target, message):
    from flyship.errors import ConfigError

    ops = fresh_ops()
    with pytest.raises(ConfigError, match=message + ".*ops.device_target\\(0\\) gives a GPU's"):
        ops.add.dispatch(torch.ones(4), torch.ones(4), target=target)


def test_the_readme_quickstart_says_triton_args_follow_the_kernel_parameters_in_order():
    readme = (ROOT / "README.md").read_text()
    assert "for a `@triton.jit` kernel, the same names, in the same order as its" in readme


def test_the_readme_and_loader_md_say_verify_covers_example_shapes_and_layouts_only():
    """Issue 32 item 7: a kernel wrong only from row 256 passes verify; the docs must not let a reader think more."""
    readme = (ROOT / "README.md").read_text()
    loader_md = (ROOT / "docs" / "loader.md").read_text()
    assert "**What `verify` covers today**" in readme and "It does not sweep shapes" in readme
    assert "### What verify covers" in loader_md and "It does **not** sweep shapes or values" in loader_md
    from flyship.loader.tools import verify

    # the module says the same: inputs come from each specialization's example
    assert "Inputs come from each specialization's ``example``" in verify.__doc__
