"""flyship spec that declares other things per target at import (``flyc-build examples/flydsl/archspec.py -o OUT
--arch gfx942 --arch gfx950``): the bundle is the same whatever the order of ``--arch``.

* ``scale_tiled.f32``: its constexpr ``TILE_N`` comes from archtile.py, fixed at import from the target's arch
  (256 on gfx942, 128 on gfx950): each target builds the tile its own import chose.
* ``scale_wide.f32``: declared only when the spec is imported for gfx950 (a builder valid only there): built for
  gfx950 alone.
"""

from archtile import ARCH, TILE_N, scale

from flyship.compiler.spec import Constexpr, Output, Scalar, Spec, Tensor, namespace, op, references

namespace("flyship_archspec")
references("references.py")

ARGS = [Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=2.0), Constexpr("TILE_N")]

op("scale_tiled", kernel=scale, args=ARGS, reference="scale_ref",
   doc="out = alpha * x (float32), tile width fixed per target at import",
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)}, constexprs={"TILE_N": TILE_N})])

if ARCH == "gfx950":
    op("scale_wide", kernel=scale, args=ARGS, reference="scale_ref",
       doc="out = alpha * x (float32) with 512-column tiles, declared for gfx950 only",
       specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)}, constexprs={"TILE_N": 512})])
