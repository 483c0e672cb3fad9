"""flyship spec: Triton ops right on every admitted shape and layout (the control of silent.py): one kernel per
call, and two launches per call passing a workspace between them (replayed on a workspace allocated per call)."""

from tl_rows import row_combine_kernel, row_partial_kernel, scale_rows_kernel

from flyship.compiler.spec import (Constexpr, Launch, Output, Spec, Tensor, Value, Workspace, namespace, op,
                                   references)

namespace("flyship_tl_right")
references("interp_references.py")

op("scale_rows", kernel=scale_rows_kernel, reference="scale_rows", doc="out = 2 x + 1, row by row",
   args=[Tensor("x", rank=2), Output("out", like="x"), Value("x_row_stride", "x.stride[0]"),
         Value("out_row_stride", "out.stride[0]"), Value("n_cols", "x.shape[1]"), Constexpr("BLOCK_N")],
   grid=("x.shape[0]",),
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (16, 24)}, constexprs={"BLOCK_N": 32},
               options={"num_warps": 1},
               constraints=("x.stride[1] == 1", "out.stride[1] == 1", "x.shape[1] <= 32"))])

op("row_sums", reference="row_sums", doc="y[r] = sum(x[r, :]), two launches through a workspace",
   kernel=[Launch(row_partial_kernel, args=["x", "partial", "n_cols", "x_row_stride", "chunk", "SPLIT", "BLOCK"],
                  grid=("x.shape[0]", "SPLIT")),
           Launch(row_combine_kernel, args=["partial", "y", "SPLIT"], grid=("x.shape[0]",))],
   args=[Tensor("x", rank=2), Output("y", shape=("x.shape[0]",), dtype="float32"),
         Workspace("partial", shape=("x.shape[0]", "SPLIT"), dtype="float32"),
         Value("n_cols", "x.shape[1]"), Value("x_row_stride", "x.stride[0]"), Value("chunk", "cdiv(x.shape[1], SPLIT)"),
         Constexpr("SPLIT"), Constexpr("BLOCK")],
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (16, 40)}, constexprs={"SPLIT": 2, "BLOCK": 32},
               options={"num_warps": 1}, constraints=("x.stride[1] == 1", "x.shape[1] <= 64"))])
