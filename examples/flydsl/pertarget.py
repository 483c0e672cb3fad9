"""flyship spec: specs per target (issue 9, pattern 8): ``flyc-build examples/flydsl/pertarget.py -o OUT
--arch gfx942 --arch gfx950 --keep-going``.

* ``staged.f32``: one spec whose constexpr differs per target (``ROWS`` rows of LDS staging: 8 on gfx942,
  16 on gfx950's larger LDS). The launcher's grid depends on ROWS, so the guards differ too: the manifest
  holds ``f32__gfx942`` and ``f32__gfx950``, one variant each.
* ``dequant_fp8.fp8``: one spec whose dtype differs per target: fp8 is ``float8_e4m3fnuz`` on gfx942 and
  ``float8_e4m3fn`` on gfx950, the format each target's ``v_cvt_pk_f32_fp8`` decodes (dequant_fp8.py). The
  guards differ, so the manifest holds ``fp8__gfx942`` and ``fp8__gfx950``; an fp8 tensor of the other format
  goes to the next specialization or the reference on that target, never to a kernel that would misread it.
* ``staged.half``: the same with 16-bit floats (float16 on gfx942, bfloat16 on gfx950).
* ``staged.f32_lds80k``: 80 KiB of LDS, over gfx942's 64 KiB and fine on gfx950's 160 KiB. A plain build
  fails and lists it with a next step; ``--keep-going`` ships it for gfx950, records the gfx942 failure in the
  manifest (``failed``) and exits 1; on gfx942 the loader falls back with that reason.
"""

from dequant_fp8 import dequant_fp8
from staged import staged_scale

from flyship.compiler.spec import Constexpr, Output, Scalar, Spec, Tensor, namespace, op, references

namespace("flyship_pertarget")
references("references.py")

SHAPES = {"x": (100, 1000)}

op(
    "staged",
    kernel=staged_scale,
    args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=2.0), Constexpr("ROWS")],
    reference="scale_ref",
    doc="out = alpha * x, staged through ROWS rows of LDS",
    specs=[
        Spec("half", dtypes={"x": "float16"}, shapes=SHAPES, constexprs={"ROWS": 4},
             per_target={"gfx950": dict(dtypes={"x": "bfloat16"})}),
        # Tall inputs: 80 rows per workgroup, 80 KiB of LDS (gfx950 only; gfx942 runs the next spec).
        Spec("f32_lds80k", dtypes={"x": "float32"}, shapes={"x": (8192, 256)}, constexprs={"ROWS": 80},
             constraints=("x.shape[0] >= 4096",)),
        Spec("f32", dtypes={"x": "float32"}, shapes=SHAPES, constexprs={"ROWS": 8},
             per_target={"gfx950": dict(constexprs={"ROWS": 16})}),
    ],
)

op(
    "dequant_fp8",
    kernel=dequant_fp8,
    args=[Tensor("x", rank=2), Output("out", shape=("x.shape[0]", "x.shape[1]"), dtype="float32"),
          Scalar("scale", "float", default=1.0)],
    reference="dequant_fp8_ref",
    doc="out (float32) = x (the target's fp8 E4M3) * scale",
    specs=[
        Spec("fp8", dtypes={"x": "float8_e4m3fnuz"}, shapes={"x": (100, 1000)}, scalars={"scale": 0.25},
             per_target={"gfx950": dict(dtypes={"x": "float8_e4m3fn"})}),
    ],
)
