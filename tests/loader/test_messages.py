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
    with pytest.raises(BundleError, match="expected a bundle directory .* got the file .*notes.txt; pass the folder"):
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
    r = subprocess.run([sys.executable, "-m", "flyship.loader.cli", "list", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("Error: "), r.stderr
