"""A launcher that passes its ``fx.Pointer`` operands to the kernel as 64-bit addresses (``fx.Int64(fx.ptrtoint(p))``;
the kernel rebuilds views with ``fx.inttoptr``), as upstream's MXFP4 preshuffle GEMM (``kernels/gemm/
mxfp4_preshuffle.py: launch_gemm``) does: each such kernel argument is the tensor's data pointer, 8 bytes by value,
laid out as a pointer field. flyc-build refused it before (``host launcher computes a launch value with
llvm.ptrtoint``). The kernel is ``examples/flydsl/pointers.py: add_one_addr``."""

from __future__ import annotations

import textwrap

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import rules

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile


def test_addresses_a_launcher_computes_with_ptrtoint_are_the_tensors_data_pointers(tmp_path):
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "examples" / "flydsl")!r})
        from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op
        from pointers import ROWS_MAX, add_one_addr
        namespace("t")
        op("add_one_addr", kernel=add_one_addr,
           args=[Tensor("x", rank=2), Output("out", like="x"), Value("m", "x.shape[0]"), Constexpr("N")],
           specs=[Spec("n1024", dtypes={{"x": "float32"}}, shapes={{"x": (300, 1024)}}, constexprs={{"N": 1024}},
                       constraints=("x.shape[1] == N", "x.stride[0] == N", "x.stride[1] == 1",
                                    f"x.shape[0] <= {{ROWS_MAX}}"))])
    """))
    run_build(spec, tmp_path / "o", ["gfx942", "gfx950"])
    s = M.read(tmp_path / "o").op("add_one_addr").specializations[0]
    assert sorted(v.target for v in s.variants) == ["gfx942", "gfx950"]
    for v in s.variants:
        # The addresses are i64 by-value arguments in the metadata; the loader writes the data pointers there.
        assert [(f.kind, f.type, f.arg, f.offset) for f in v.kernargs.fields] == [
            ("pointer", "ptr", "x", 0), ("pointer", "ptr", "out", 8), ("expr", "i32", None, 16)]
        assert [(a.offset, a.size, a.value_kind) for a in v.metadata.args if not a.hidden][:2] == [
            (0, 8, "by_value"), (8, 8, "by_value")]
        rules.check_layout(v.kernargs, v.metadata, v.target)
        assert v.proof.method == "flydsl-binary" and v.proof.differences == ()


def test_an_output_passed_as_a_byte_pointer_is_declared_with_pointee(tmp_path):
    """Upstream's MXFP4 caller passes its bf16 output C as ``from_c_void_p(fx.Uint8, c.data_ptr())``:
    ``Output(..., pointee="uint8")`` makes flyc-build pass the same pointer type (the host IR check refuses any other
    than the declared one); an unknown pointee is refused when the spec is read."""
    def spec_for(pointee: str) -> str:
        return textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {str(ROOT / "examples" / "flydsl")!r})
            from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op
            from pointers import add_one_addr
            namespace("t")
            op("add_one_addr", kernel=add_one_addr,
               args=[Tensor("x", rank=2), Output("out", like="x", pointee={pointee!r}), Value("m", "x.shape[0]"),
                     Constexpr("N")],
               specs=[Spec("n1024", dtypes={{"x": "float32"}}, shapes={{"x": (300, 1024)}}, constexprs={{"N": 1024}},
                           constraints=("x.shape[1] == N", "x.stride[0] == N", "x.stride[1] == 1",
                                        "x.shape[0] <= 65536"))])
        """)
    (tmp_path / "bytes.py").write_text(spec_for("uint8"))
    run_build(tmp_path / "bytes.py", tmp_path / "o", ["gfx942"])
    v = M.read(tmp_path / "o").op("add_one_addr").specializations[0].variants[0]
    assert v.tensor_abi["out"] == "pointer" and v.proof.method == "flydsl-binary"

    (tmp_path / "typo.py").write_text(spec_for("byte"))
    r = run_build(tmp_path / "typo.py", tmp_path / "o2", ["gfx942"], check=False)
    assert r.returncode != 0 and "output out: pointee 'byte' is not a dtype" in r.stderr, r.stderr
