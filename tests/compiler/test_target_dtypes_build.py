"""An fp8 output that is float8_e4m3fnuz on gfx942 and float8_e4m3fn on gfx950 under one op name (issue 34 item 2):
``Output(..., dtype="float8_e4m3fn", per_target={"gfx942": "float8_e4m3fnuz"})`` on a tiny Triton kernel built for
both targets. Each target's kernel is compiled with its own fp8 format (Triton's ``fp8e4b8`` / ``fp8e4nv`` store), the
manifest carries the per-target dtype (written as 6.0) and the recording driver allocates each target's dtype."""

from __future__ import annotations

import textwrap

import pytest

from ..conftest import run_build

pytestmark = pytest.mark.compile
pytest.importorskip("triton", reason="needs triton 3.6 (the FlyDSL venv); it would compile a Triton kernel that "
                                     "writes fp8 for gfx942 and gfx950")

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def quant(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, tl.load(x + i, mask=m).to(out.dtype.element_ty), mask=m)
'''

REFS = '''
import torch


def quant(x):
    return x.to(torch.float8_e4m3fn)
'''

SPEC = """
import sys
sys.path.insert(0, {folder!r})
from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op, references
from kern import quant
namespace("t")
references({refs!r})
op("quant", kernel=quant, grid=("cdiv(x.numel, BLOCK)",), reference="quant",
   args=[Tensor("x", rank=1), Output("out", like="x", dtype="float8_e4m3fn", per_target={{"gfx942": "float8_e4m3fnuz"}}),
         Value("n", "x.numel"), Constexpr("BLOCK")],
   specs=[Spec("f32", dtypes={{"x": "float32"}}, shapes={{"x": (1000,)}}, constexprs={{"BLOCK": 256}},
               options={{"specialize": "declared"}})])
"""


def test_an_fp8_output_is_fnuz_on_gfx942_and_fn_on_gfx950_under_one_op(tmp_path):
    from flyship.bundle import manifest as M
    from flyship.bundle import rules

    (tmp_path / "kern.py").write_text(KERNEL)
    (tmp_path / "refs.py").write_text(REFS)
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(SPEC.format(folder=str(tmp_path), refs=str(tmp_path / "refs.py"))))
    run_build(spec, tmp_path / "o", ["gfx942", "gfx950"])
    m = M.read(tmp_path / "o")
    rules.check_bundle_files(tmp_path / "o", m)
    out = m.op("quant").outputs[0]
    assert (out.dtype, out.target_dtypes) == ("float8_e4m3fn", {"gfx942": "float8_e4m3fnuz"})
    assert m.schema_version == "6.0" and M.must_understand(m) == ("target_dtypes",)
    (s,) = m.op("quant").specializations
    assert sorted(v.target for v in s.variants) == ["gfx942", "gfx950"]
    # Each target's kernel converts to its own format: gfx942's stores fnuz with v_cvt_pk_fp8_f32 (E4M3FNUZ there),
    # gfx950's OCP E4M3FN with v_cvt_scalef32_pk_fp8_f32; the same spec without per_target gives gfx942 another kernel.
    cvt = {v.target: _conversions(tmp_path / "o" / v.code_object.file, v.target) for v in s.variants}
    assert cvt == {"gfx942": {"v_cvt_pk_fp8_f32"}, "gfx950": {"v_cvt_scalef32_pk_fp8_f32"}}
    spec.write_text(spec.read_text().replace(', per_target={"gfx942": "float8_e4m3fnuz"}', ""))
    run_build(spec, tmp_path / "fn", ["gfx942"])
    plain = M.read(tmp_path / "fn")
    (v,) = plain.op("quant").specializations[0].variants
    assert plain.schema_version == "1.5" and plain.op("quant").outputs[0].target_dtypes == {}
    assert _conversions(tmp_path / "fn" / v.code_object.file, "gfx942") != cvt["gfx942"]


def _conversions(path, target: str) -> set[str]:
    """The fp8 conversion instructions of a code object (llvm-objdump)."""
    import re
    import subprocess

    from flyship.compiler.toolchain import find_toolchain

    objdump = find_toolchain().objdump
    if objdump is None:
        pytest.skip("would read each target's fp8 conversion from its code object; this toolchain has no llvm-objdump")
    text = subprocess.run([*objdump.argv, "-d", f"--mcpu={target}", str(path)], capture_output=True, text=True,
                          check=True).stdout
    return set(re.findall(r"\bv_cvt\w*fp8\w*", text))
