"""flyship spec: a Triton op right on every admitted shape and layout (the control of silent.py)."""

from tl_rows import scale_rows_kernel

from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op, references

namespace("flyship_tl_right")
references("interp_references.py")

op("scale_rows", kernel=scale_rows_kernel, reference="scale_rows", doc="out = 2 x + 1, row by row",
   args=[Tensor("x", rank=2), Output("out", like="x"), Value("x_row_stride", "x.stride[0]"),
         Value("out_row_stride", "out.stride[0]"), Value("n_cols", "x.shape[1]"), Constexpr("BLOCK_N")],
   grid=("x.shape[0]",),
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (16, 24)}, constexprs={"BLOCK_N": 32},
               options={"num_warps": 1},
               constraints=("x.stride[1] == 1", "out.stride[1] == 1", "x.shape[1] <= 32"))])
