# SPDX-License-Identifier: Apache-2.0
"""Spec file of Triton ops that launch two kernels per call (issue 9, pattern 6).

    flyc-build examples/triton/multilaunch.py -o artifacts/multilaunch --arch sm_90 --arch gfx942 --arch gfx950

``kernel=[Launch(...), Launch(...)]`` lists the kernels in launch order, each with its parameters (names of
the op's declarations) and its grid. A ``Workspace`` is device memory the loader allocates per call, before
the first launch, from torch's caching allocator (zero-filled on the current stream with ``zero=True``); it is
never part of the op's schema. Both launches go to torch's current stream, so a CUDA/HIP graph captures them
in order.
"""

from tl_rowsum_split import rowsum_atomic_kernel, rowsum_cast_kernel, rowsum_combine_kernel, rowsum_partial_kernel

from flyship.compiler.spec import (Constexpr, Launch, Output, Spec, Tensor, Value, Workspace, namespace, op,
                                   references)

namespace("flyship_multilaunch")
references("references.py")

FLOATS = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
ROWS = ("x.stride[1] == 1", "x.numel <= 2147483647")

# Phase 1: (rows x SPLIT) programs write partial sums into the workspace; phase 2 adds each row's SPLIT values.
op("rowsum_split", reference="rowsum_f32_ref", doc="y[r] = sum(x[r, :]) in float32, a two-pass split reduction",
   kernel=[Launch(rowsum_partial_kernel, args=["x", "partial", "n_cols", "x_row_stride", "chunk", "SPLIT", "BLOCK"],
                  grid=("x.shape[0]", "SPLIT")),
           Launch(rowsum_combine_kernel, args=["partial", "y", "SPLIT"], grid=("x.shape[0]",))],
   args=[Tensor("x", rank=2), Output("y", shape=("x.shape[0]",), dtype="float32"),
         Workspace("partial", shape=("x.shape[0]", "SPLIT"), dtype="float32"),
         Value("n_cols", "x.shape[1]"), Value("x_row_stride", "x.stride[0]"), Value("chunk", "cdiv(x.shape[1], SPLIT)"),
         Constexpr("SPLIT"), Constexpr("BLOCK")],
   specs=[Spec(name, dtypes={"x": dt}, shapes={"x": (64, 4096)}, constexprs={"SPLIT": 8, "BLOCK": 256},
               options={"num_warps": 4}, constraints=ROWS)
          for name, dt in FLOATS.items()])

# Phase 1 adds into a zeroed workspace with atomics; phase 2 casts it to x's dtype.
op("rowsum_atomic", reference="rowsum_ref", doc="y[r] = sum(x[r, :]) through an atomically accumulated workspace",
   kernel=[Launch(rowsum_atomic_kernel, args=["x", "acc", "n_cols", "x_row_stride", "chunk", "BLOCK"],
                  grid=("x.shape[0]", "SPLIT")),
           Launch(rowsum_cast_kernel, args=["acc", "y", "n_rows", "BLOCK"], grid=("cdiv(x.shape[0], BLOCK)",))],
   args=[Tensor("x", rank=2), Output("y", shape=("x.shape[0]",), dtype="x"),
         Workspace("acc", shape=("x.shape[0]",), dtype="float32", zero=True),
         Value("n_cols", "x.shape[1]"), Value("x_row_stride", "x.stride[0]"), Value("chunk", "cdiv(x.shape[1], SPLIT)"),
         Value("n_rows", "x.shape[0]"), Constexpr("SPLIT"), Constexpr("BLOCK")],
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 4096)}, constexprs={"SPLIT": 4, "BLOCK": 256},
               options={"num_warps": 4}, constraints=ROWS)])
