"""flyship spec: issue 33's silent cases beyond silent.py and mixed.py (beyond_kernels.py): a GEMM built for a
column-major b (fed a padded one; and, b a bare pointer, a row-major one its guard admits), a flash-attention-style
fixed per-token stride, an LDS race, rows wrong from 512 and a column count baked in. Each builds;
`flyc-build --verify` and `flyship verify --emulate` refuse it (tests/loader/test_emulated_silent.py,
tests/compiler/test_build_verify.py)."""

from beyond_kernels import cols_baked, gemm_colb, gemm_colb_ptr, lds_broadcast, q_scale, wrap_512

from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, namespace, op, references

namespace("flyship_beyond")
references("silent_references.py")

op("gemm_colb", kernel=gemm_colb, reference="matmul",
   args=[Tensor("a", rank=2), Tensor("b", rank=2), Output("out", shape=("a.shape[0]", "b.shape[1]"), dtype="a"),
         Constexpr("K")],
   doc="out = a @ b (float32), b read as column-major whatever its strides (the spec pins none)",
   specs=[Spec("f32_k16", dtypes={"a": "float32", "b": "float32"}, shapes={"a": (32, 16), "b": (16, 48)},
               strides={"b": (1, 16)}, constexprs={"K": 16},
               constraints=("a.shape[1] == K", "b.shape[0] == K", "b.shape[1] <= 64"))])

op("gemm_colb_ptr", kernel=gemm_colb_ptr, reference="matmul",
   args=[Tensor("a", rank=2), Tensor("b", rank=2), Output("out", shape=("a.shape[0]", "b.shape[1]"), dtype="a"),
         Constexpr("K")],
   doc="out = a @ b (float32), b a bare pointer read as column-major; the guard admits a row-major b",
   specs=[Spec("f32_k16", dtypes={"a": "float32", "b": "float32"}, shapes={"a": (32, 16), "b": (16, 48)},
               strides={"b": (1, 16)}, constexprs={"K": 16},
               constraints=("a.shape[1] == K", "b.shape[0] == K", "b.shape[1] <= 64"))])

op("q_scale", kernel=q_scale, reference="half", args=[Tensor("q", rank=3), Output("out", like="q")],
   doc="out = q * 0.5 for q (T, H, D), q indexed with a fixed per-token stride H * D",
   specs=[Spec("f32", dtypes={"q": "float32"}, shapes={"q": (16, 2, 32)},
               constraints=("q.stride[2] == 1", "q.shape[2] <= 64"))])

op("lds_broadcast", kernel=lds_broadcast, reference="broadcast_64", args=[Tensor("x", rank=2),
   Output("out", shape=("x.shape[0]", "2 * x.shape[1]"), dtype="x")],
   doc="out[r, c] = 2 * x[r, c % 64] for c < 128, staged in LDS by wave 0 with no barrier before wave 1 reads it",
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (16, 64)}, constraints=("x.shape[1] == 64",))])

op("wrap_512", kernel=wrap_512, reference="plus_one", args=[Tensor("x", rank=2), Output("out", like="x")],
   doc="out = x + 1, wrong from row 512 (reads row r % 512)",
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 64)}, constraints=("x.shape[1] <= 64",))])

op("cols_baked", kernel=cols_baked, reference="plus_one", args=[Tensor("x", rank=2), Output("out", like="x"),
   Constexpr("N")],
   doc="out = x + 1 with N columns baked in, the guard admitting fewer (x.shape[1] <= N)",
   specs=[Spec("n64", dtypes={"x": "float32"}, shapes={"x": (40, 64)}, constexprs={"N": 64},
               constraints=("x.shape[1] <= N",))])
