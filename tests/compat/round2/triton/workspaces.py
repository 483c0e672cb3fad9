# SPDX-License-Identifier: Apache-2.0
"""Spec file of Triton ops whose workspaces are sized by the device and whose launches reuse one kernel (issue 23).

    flyc-build examples/triton/workspaces.py -o artifacts/workspaces --arch sm_90 --arch gfx942

* ``rmsnorm_bwd``: RMSNorm's backward as training-kernel libraries write it: a persistent kernel of one program
  per SM/CU (grid ``device.cu_count``), each writing its share of dW into one row of a ``(device.cu_count, N)``
  float32 workspace, then a kernel summing those rows. The loader sizes the workspace on the device that runs the
  call (132 rows on an H200, 304 on an MI300X); the workspace is declared 16-byte aligned (``divisible_by_16``:
  the loader allocates it from torch's allocator, which aligns every block to at least 512 bytes on a GPU).
  No other hint: each spec builds Triton's JIT variant for aligned inputs, then the generic one (docs/triton.md).
* ``add3``: ``out = (x + y) + z`` by one kernel launched twice on other buffers; a Launch binds the op's
  declarations to the kernel's parameters by position (``add_kernel(x, y, out, n_elements, BLOCK)`` gets
  ``xy, z, out`` the second time).
"""

from tl_elementwise import add_kernel
from tl_rmsnorm_bwd import rmsnorm_bwd_dx_kernel, sum_rows_kernel

from flyship.compiler.spec import (Constexpr, Launch, Output, Scalar, Spec, Tensor, Value, Workspace, namespace, op,
                                   references)

namespace("flyship_workspaces")
references("references.py")

FLOATS = {"f32": "float32", "bf16": "bfloat16"}
BWD_RULES = ("x.stride[1] == 1", "dy.stride[1] == 1", "w.stride[0] == 1", "dy.shape[0] == x.shape[0]",
             "dy.shape[1] == x.shape[1]", "w.shape[0] == x.shape[1]", "x.shape[1] >= 1", "x.shape[1] <= BLOCK_N",
             "x.shape[0] <= 2147483647")

op("rmsnorm_bwd", reference="rmsnorm_bwd_ref", doc="(dx, dw) of out = x * rsqrt(mean(x**2, -1) + eps) * w",
   kernel=[Launch(rmsnorm_bwd_dx_kernel, args=["dy", "x", "w", "dx", "partial", "n_rows", "n_cols", "x_row_stride",
                                               "dy_row_stride", "dx_row_stride", "rows_per_program", "eps", "BLOCK_N"],
                  grid=("device.cu_count",)),
           Launch(sum_rows_kernel, args=["partial", "dw", "n_parts", "n_cols", "BLOCK"],
                  grid=("cdiv(x.shape[1], BLOCK)",))],
   args=[Tensor("dy", rank=2), Tensor("x", rank=2), Tensor("w", rank=1), Scalar("eps", "float", 1e-6),
         Output("dx", like="x"), Output("dw", like="w"),
         Workspace("partial", shape=("device.cu_count", "x.shape[1]"), dtype="float32"),
         Value("n_rows", "x.shape[0]"), Value("n_cols", "x.shape[1]"), Value("x_row_stride", "x.stride[0]"),
         Value("dy_row_stride", "dy.stride[0]"), Value("dx_row_stride", "dx.stride[0]"),
         Value("rows_per_program", "cdiv(x.shape[0], device.cu_count)"), Value("n_parts", "device.cu_count"),
         Constexpr("BLOCK_N"), Constexpr("BLOCK")],
   # Llama-3-8B rows: 4096 tokens x 4096 hidden (the example call: the JIT variant is what Triton's JIT builds for it)
   specs=[Spec(f"{name}_n4096", dtypes={"dy": dt, "x": dt, "w": dt},
               shapes={"dy": (4096, 4096), "x": (4096, 4096), "w": (4096,)}, constexprs={"BLOCK_N": 4096, "BLOCK": 256},
               options={"num_warps": 8, "divisible_by_16": ["partial"]}, constraints=BWD_RULES)
          for name, dt in FLOATS.items()])

op("add3", reference="add3_ref", doc="out = (x + y) + z, one kernel launched twice",
   kernel=[Launch(add_kernel, args=["x", "y", "xy", "n", "BLOCK"], grid=("cdiv(x.numel, BLOCK)",)),
           Launch(add_kernel, args=["xy", "z", "out", "n", "BLOCK"], grid=("cdiv(x.numel, BLOCK)",))],
   args=[Tensor("x", rank=1), Tensor("y", rank=1), Tensor("z", rank=1), Output("out", like="x"),
         Workspace("xy", shape=("x.numel",), dtype="float32"), Value("n", "x.numel"), Constexpr("BLOCK")],
   specs=[Spec(name, dtypes={"x": dt, "y": dt, "z": dt}, shapes={"x": (4096,), "y": (4096,), "z": (4096,)},
               constexprs={"BLOCK": 1024}, constraints=("y.numel == x.numel", "z.numel == x.numel"))
          for name, dt in FLOATS.items()])
