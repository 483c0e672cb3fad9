"""Kernels that accumulate into an output with atomics, at build time: flyc-build reads the atomic
read-modify-writes from the kernel's IR (FlyDSL: LLVM IR; Triton: TTIR) and refuses one into an ``Output`` not
declared ``zero=True`` (the loader would hand the kernel uninitialised memory); declared, the manifest records
``outputs[].zero`` and is written as 2.1 (a must-understand key)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flyship.bundle import manifest as M

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile

FLYDSL = """
    from colsum import colsum
    op("colsum", kernel=colsum, args=[Tensor("x", rank=2), Output("out", shape=("x.shape[1]",), dtype="x"ZERO)],
       specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 1000)})])
"""
TRITON = """
    from tl_rowsum_split import rowsum_atomic_kernel
    op("rowsum_atomic_out", kernel=rowsum_atomic_kernel,
       args=[Tensor("x", rank=2), Output("acc", shape=("x.shape[0]",), dtype="x"ZERO), Value("n_cols", "x.shape[1]"),
             Value("x_row_stride", "x.stride[0]"), Value("chunk", "cdiv(x.shape[1], 4)"), Constexpr("BLOCK")],
       grid=("x.shape[0]", "4"),
       specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 4096)}, constexprs={"BLOCK": 256},
                   options={"num_warps": 4}, constraints=("x.stride[1] == 1",))])
"""


def _spec(tmp_path: Path, folder: str, body: str, zero: bool) -> Path:
    p = tmp_path / f"spec_{folder}_{zero}.py"
    p.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples' / folder)!r})
        from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op
        namespace("t")
    """) + textwrap.dedent(body).replace("ZERO", ", zero=True" if zero else ""))
    return p


@pytest.mark.parametrize("folder, body, arch, param", [("flydsl", FLYDSL, "gfx942", "parameter 2 (arg2), bound to "
                                                        "output 'out'"),
                                                       ("triton", TRITON, "sm_90", "parameter 1 (acc), bound to "
                                                        "output 'acc'")])
def test_a_kernel_that_adds_atomically_into_an_output_not_declared_zero_is_refused(tmp_path, folder, body, arch,
                                                                                   param):
    r = run_build(_spec(tmp_path, folder, body, zero=False), tmp_path / "no", [arch], check=False)
    assert r.returncode == 1 and not (tmp_path / "no").exists(), r.stdout + r.stderr
    assert f"the kernel accumulates atomically (an atomic add, max or compare-and-swap) through {param}" in r.stderr
    name = param.rsplit("'", 2)[1]
    assert f"declare Output({name!r}, ..., zero=True)" in r.stderr and "mutable=True" in r.stderr
    # Declared zero-filled, the same kernel builds and the manifest tells the loader.
    run_build(_spec(tmp_path, folder, body, zero=True), tmp_path / "ok", [arch])
    m = M.read(tmp_path / "ok")
    assert [(o.name, o.zero) for o in m.ops[0].outputs] == [(name, True)]
    assert m.schema_version == "3.2" and M.must_understand(m) == ("zero",)


def test_the_patterns_bundle_ships_the_flydsl_atomic_colsum_with_a_zero_filled_output(patterns_bundle):
    op = M.read(patterns_bundle).op("colsum")
    assert [(o.name, o.zero) for o in op.outputs] == [("out", True)]
