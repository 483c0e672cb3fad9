"""A float ``Value`` on a Triton kernel (issue 34 item 2: ``Value(..., type="f32")`` worked for FlyDSL only): the
constant is an fp32 kernel parameter, as Triton's JIT passes a Python float, packed by the loader as an f32
constant field; the guard and the JIT hints ignore it."""

from __future__ import annotations

import struct
import textwrap

import pytest

from ..conftest import run_build

pytestmark = pytest.mark.compile
pytest.importorskip("triton", reason="needs triton 3.6 (the FlyDSL venv); it would compile a Triton kernel with a "
                                     "float Value")

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def axpb(x, out, n, a, b, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, tl.load(x + i, mask=m) * a + b, mask=m)
'''

SPEC = """
import sys
sys.path.insert(0, {folder!r})
from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op
from kern import axpb
namespace("t")
op("axpb", kernel=axpb, grid=("cdiv(x.numel, BLOCK)",),
   args=[Tensor("x", rank=1), Output("out", like="x"), Value("n", "x.numel"), Value("a", "0.5", type="f32"),
         Value("b", "-3.25e-1", type="f32"), Constexpr("BLOCK")],
   specs=[Spec("f32", dtypes={{"x": "float32"}}, shapes={{"x": (1000,)}}, constexprs={{"BLOCK": 256}},
               options={{"specialize": "declared"}})])
"""


def test_a_float_value_is_an_fp32_parameter_of_a_triton_kernel_packed_as_a_constant(tmp_path):
    from flyship.bundle import manifest as M
    from flyship.bundle import rules

    (tmp_path / "kern.py").write_text(KERNEL)
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(SPEC.format(folder=str(tmp_path))))
    run_build(spec, tmp_path / "o", ["gfx942"])
    m = M.read(tmp_path / "o")
    rules.check_bundle_files(tmp_path / "o", m)  # the layout against the code object's own metadata
    (v,) = m.op("axpb").specializations[0].variants
    fields = {f.kernel_arg: f for f in v.kernargs.fields}
    assert (fields["a"].kind, fields["a"].type, fields["a"].size, fields["a"].value) == ("constant", "f32", 4, 0.5)
    assert (fields["b"].kind, fields["b"].value) == ("constant", -0.325)
    assert struct.pack("<f", fields["b"].value) == struct.pack("<f", -0.325)
    by_offset = {a.offset: a for a in v.metadata.args if not a.hidden}
    assert by_offset[fields["a"].offset].size == 4 and by_offset[fields["a"].offset].value_kind == "by_value"
    assert not any("0.5" in c or "0.325" in c for c in m.op("axpb").specializations[0].guard.constraints)
