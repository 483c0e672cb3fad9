# SPDX-License-Identifier: Apache-2.0
"""Spec file of a persistent Triton op whose launch grid reads the device (issue 9, pattern 13).

    flyc-build examples/triton/persistent.py -o artifacts/persistent --arch gfx942 --arch gfx950

``torch.ops.flyship_persistent.rowsum(x)`` launches ``min(rows, device.cu_count)`` programs: the loader
reads the compute-unit count once per device, so one gfx942 code object uses 304 programs on an MI300X and
80 on an MI308X.
"""

from tl_persistent import rowsum_persistent_kernel

from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op, references

namespace("flyship_persistent")
references("references.py")

op("rowsum", kernel=rowsum_persistent_kernel, reference="rowsum_ref", doc="out[r] = sum(x[r, :]), persistent grid",
   args=[Tensor("x", rank=2), Output("out", shape=("x.shape[0]",), dtype="x"), Value("n_rows", "x.shape[0]"),
         Value("n_cols", "x.shape[1]"), Value("x_row_stride", "x.stride[0]"), Constexpr("BLOCK_N")],
   grid=("min(x.shape[0], device.cu_count)",),
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (1000, 200)}, constexprs={"BLOCK_N": 256},
               options={"num_warps": 4},
               constraints=("x.stride[1] == 1", "x.shape[1] <= 256", "out.stride[0] == 1"))])
