"""flyship spec: FlyDSL launcher shapes from issue 9 (``flyc-build examples/flydsl/patterns.py -o OUT --arch gfx942``).

Each op shows launcher patterns that upstream FlyDSL builders use and flyship builds as they are:

* ``scale`` (scale.py): a ``stream: fx.Stream`` parameter with no default (1), a runtime ``fx.Float32``
  scalar declared ``Scalar(..., "float")`` (12), a constexpr named in a constraint (12), and a grid the
  launcher computes in 32-bit integers, which the guard keeps below the wrap (11).
"""

from scale import scale

from flyship.compiler.spec import Constexpr, Output, Scalar, Spec, Tensor, namespace, op, references

namespace("flyship_patterns")
references("references.py")

op(
    "scale",
    kernel=scale,
    args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=2.0), Constexpr("TILE_N")],
    reference="scale_ref",
    doc="out = alpha * x (float32), launcher with a stream parameter that has no default",
    specs=[
        # A constraint may name a constexpr: flyship writes its value in (the guard reads x.shape[1] >= 256).
        Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)}, constexprs={"TILE_N": 256},
             constraints=("x.shape[1] >= TILE_N",)),
    ],
)
