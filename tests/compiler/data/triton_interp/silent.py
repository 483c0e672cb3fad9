"""flyship spec: a Triton op whose kernel does two rows per program, launched on a grid of rows // 2 programs where
cdiv(rows, 2) belongs. It builds, and it matches its reference on the example (16 rows) and on every even row count;
on an odd row count, which the guard admits, the last row is never written. `flyc-build --verify` refuses it under
Triton's interpreter."""

from tl_rows import scale_row_pairs_kernel

from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op, references

namespace("flyship_tl_silent")
references("interp_references.py")

op("scale_rows", kernel=scale_row_pairs_kernel, reference="scale_rows", doc="out = 2 x + 1, two rows per program",
   args=[Tensor("x", rank=2), Output("out", like="x"), Value("x_row_stride", "x.stride[0]"),
         Value("out_row_stride", "out.stride[0]"), Value("n_rows", "x.shape[0]"), Value("n_cols", "x.shape[1]"),
         Constexpr("BLOCK_N")],
   grid=("x.shape[0] // 2",),
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (16, 24)}, constexprs={"BLOCK_N": 32},
               options={"num_warps": 1},
               constraints=("x.stride[1] == 1", "out.stride[1] == 1", "x.shape[1] <= 32"))])
