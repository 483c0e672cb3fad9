"""flyship spec: silent.py's two-rows-per-program kernel writing x in place (a mutable input, no output), on a grid
of rows // 2 programs where cdiv(rows, 2) belongs: the last row of an odd row count is never written. `flyc-build
--verify` refuses it under Triton's interpreter, naming the input it writes; the layouts its guard refuses (every
other element) are listed as not admitted under this namespace, never the dry run's private one."""

from tl_rows import scale_row_pairs_inplace_kernel

from flyship.compiler.spec import Constexpr, Spec, Tensor, Value, namespace, op, references

namespace("flyship_tl_inplace")
references("interp_references.py")

op("scale_rows_inplace", kernel=scale_row_pairs_inplace_kernel, reference="scale_rows_inplace",
   doc="x = 2 x + 1 in place, two rows per program",
   args=[Tensor("x", rank=2, mutable=True), Value("x_row_stride", "x.stride[0]"), Value("n_rows", "x.shape[0]"),
         Value("n_cols", "x.shape[1]"), Constexpr("BLOCK_N")],
   grid=("x.shape[0] // 2",),
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (16, 24)}, constexprs={"BLOCK_N": 32},
               options={"num_warps": 1}, constraints=("x.stride[1] == 1", "x.shape[1] <= 32"))])
