"""flyship spec: the version-portable FlyDSL kernels (``flyc-build examples/flydsl_portable/ops.py -o DIR``).

Builds with every FlyDSL from 0.1.5 to 0.5.0. With FlyDSL before 0.2.0 each tensor is a static layout,
so the bundle's guards pin the example shapes below; from 0.2.0 the shapes stay dynamic.
"""

from kernels import add, block_sum, row_sum

from flyship.compiler.spec import Output, Spec, Tensor, namespace, op, references

namespace("flyship_portable")
references("references.py")

op(
    "add",
    kernel=add,
    args=[Tensor("x", rank=1), Tensor("y", rank=1), Output("out", like="x")],
    reference="add_ref",
    doc="out = x + y for 1-D float32 tensors, predicated tail",
    specs=[Spec("f32", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (1000,), "y": (1000,)},
                constraints=("y.shape[0] == x.shape[0]",))],
)

op(
    "row_sum",
    kernel=row_sum,
    args=[Tensor("x", rank=2), Output("out", shape=("x.shape[0]",), dtype="x")],
    reference="row_sum_ref",
    doc="out[r] = sum(x[r, :]), one thread per row",
    specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 300)})],
)

op(
    "block_sum",
    kernel=block_sum,
    args=[Tensor("x", rank=1), Output("out", shape=("cdiv(x.shape[0], 256)",), dtype="x")],
    reference="block_sum_ref",
    doc="partial sums of 256-element blocks, reduced in LDS",
    specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (1000,)})],
)
