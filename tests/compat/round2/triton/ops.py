# SPDX-License-Identifier: Apache-2.0
"""Spec file of the Triton example ops: one spec for NVIDIA (sm_90) and AMD (gfx942) alike.

    flyc-build examples/triton/ops.py -o artifacts/triton --arch sm_90 --arch gfx942

Every op is ``torch.ops.flyship_triton.<name>`` in the workload Python. Kernel parameters are listed in the
kernel's order: tensors and outputs become the op's schema, ``Value``s are integers the loader computes
from the inputs per call (sizes, row strides), ``Constexpr``s are fixed per specialization. The guard
constraints say what each kernel assumes (contiguous rows, ``N <= BLOCK_N``, TMA pitch rules); inputs that
fit no specialization run the reference in ``references.py``.
"""

from tl_elementwise import add_kernel
from tl_gemm import gemm_kernel, gemm_tma_kernel
from tl_inplace import accumulate_kernel, fused_add_rmsnorm_kernel
from tl_rmsnorm import rmsnorm_kernel
from tl_rowsum_split import rowsum_atomic_kernel
from tl_softmax import softmax_bwd_kernel, softmax_kernel

from flyship.compiler.spec import (Backward, Constexpr, Output, Scalar, Spec, Tensor, Value, namespace, op,
                                   references)

namespace("flyship_triton")
references("references.py")

FLOATS = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
HALVES = {"bf16": "bfloat16", "f16": "float16"}


def contiguous(t: str) -> tuple[str, ...]:
    """Constraints for a row-major contiguous 2-D tensor."""
    return (f"{t}.stride[1] == 1", f"{t}.stride[0] == {t}.shape[1]")


# -- add: one flat pass over x.numel elements --------------------------------------------------------
op("add", kernel=add_kernel, reference="add_ref", doc="out = x + y (same shape, contiguous)",
   args=[Tensor("x", rank=2, alignment=16), Tensor("y", rank=2, alignment=16), Output("out", like="x"),
         Value("n_elements", "x.numel"), Constexpr("BLOCK")],
   grid=("cdiv(x.numel, BLOCK)",),
   specs=[Spec(name, dtypes={"x": dt, "y": dt}, shapes={"x": (1000, 1000), "y": (1000, 1000)},
               constexprs={"BLOCK": 1024}, options={"num_warps": 4, "divisible_by_16": ["out"]},
               constraints=(*contiguous("x"), *contiguous("y"), *contiguous("out"), "y.shape[0] == x.shape[0]",
                            "y.shape[1] == x.shape[1]", "x.numel + 1024 <= 2147483647"))
          for name, dt in FLOATS.items()])

# -- softmax / rmsnorm: one program per row, the row held in registers (BLOCK_N >= N) --------------------
ROW_BLOCKS = ((1024, 4), (4096, 8), (16384, 16))  # (BLOCK_N, num_warps)

# softmax trains: its backward is softmax_bwd(dy=grad of out, y=out), saving the forward's output.
# Row kernels take model-shaped tensors: batch=True lets (B, S, N) in as the view (B*S, N); outputs like x get
# (B, S, N) back, and the backward op is batched too (the rule book requires it of an autograd pair).
op("softmax", kernel=softmax_kernel, reference="softmax_ref", doc="softmax over the last dim of a 2-D tensor",
   backward=Backward("softmax_bwd", inputs={"dy": "grad:out", "y": "out"}, grads={"x": "dx"}),
   args=[Tensor("x", rank=2, batch=True), Output("out", like="x"), Value("x_row_stride", "x.stride[0]"),
         Value("out_row_stride", "out.stride[0]"), Value("n_cols", "x.shape[1]"), Constexpr("BLOCK_N")],
   grid=("x.shape[0]",),
   specs=[Spec(f"{name}_n{bn}", dtypes={"x": dt}, shapes={"x": (64, bn - 24)}, constexprs={"BLOCK_N": bn},
               options={"num_warps": nw},
               constraints=("x.stride[1] == 1", "out.stride[1] == 1", "x.shape[1] >= 1", f"x.shape[1] <= {bn}"))
          for bn, nw in ROW_BLOCKS for name, dt in FLOATS.items()])

op("softmax_bwd", kernel=softmax_bwd_kernel, reference="softmax_bwd_ref",
   doc="gradient of softmax's input: y * (dy - sum(dy * y, -1))",
   args=[Tensor("dy", rank=2, batch=True), Tensor("y", rank=2, batch=True), Output("dx", like="y"),
         Value("dy_row_stride", "dy.stride[0]"),
         Value("y_row_stride", "y.stride[0]"), Value("dx_row_stride", "dx.stride[0]"), Value("n_cols", "y.shape[1]"),
         Constexpr("BLOCK_N")],
   grid=("y.shape[0]",),
   specs=[Spec(f"{name}_n{bn}", dtypes={"dy": dt, "y": dt}, shapes={"dy": (64, bn - 24), "y": (64, bn - 24)},
               constexprs={"BLOCK_N": bn}, options={"num_warps": nw},
               constraints=("dy.stride[1] == 1", "y.stride[1] == 1", "dx.stride[1] == 1", "dy.shape[0] == y.shape[0]",
                            "dy.shape[1] == y.shape[1]", "y.shape[1] >= 1", f"y.shape[1] <= {bn}"))
          for bn, nw in ROW_BLOCKS for name, dt in FLOATS.items()])

op("rmsnorm", kernel=rmsnorm_kernel, reference="rmsnorm_ref", doc="x * rsqrt(mean(x**2, -1) + eps) * w",
   args=[Tensor("x", rank=2, batch=True), Tensor("w", rank=1), Output("out", like="x"),
         Value("x_row_stride", "x.stride[0]"),
         Value("out_row_stride", "out.stride[0]"), Value("n_cols", "x.shape[1]"), Scalar("eps", "float", 1e-6),
         Constexpr("BLOCK_N")],
   grid=("x.shape[0]",),
   specs=[Spec(f"{name}_n{bn}", dtypes={"x": dt, "w": dt}, shapes={"x": (64, bn - 24), "w": (bn - 24,)},
               constexprs={"BLOCK_N": bn}, options={"num_warps": nw},
               constraints=("x.stride[1] == 1", "out.stride[1] == 1", "w.stride[0] == 1", "w.shape[0] == x.shape[1]",
                            "x.shape[1] >= 1", f"x.shape[1] <= {bn}"))
          for bn, nw in ROW_BLOCKS for name, dt in FLOATS.items()])

# -- gemm: masked pointer GEMM; a 16-aligned fast path first, then any shape and stride ----------------------
GEMM_ARGS = [Tensor("a", rank=2), Tensor("b", rank=2), Output("c", shape=("a.shape[0]", "b.shape[0]"), dtype="a"),
             Value("M", "a.shape[0]"), Value("N", "b.shape[0]"), Value("K", "a.shape[1]"),
             Value("stride_am", "a.stride[0]"), Value("stride_bn", "b.stride[0]"), Value("stride_cm", "c.stride[0]"),
             Constexpr("BLOCK_M"), Constexpr("BLOCK_N"), Constexpr("BLOCK_K"), Constexpr("GROUP_M")]
GEMM_RULES = ("a.stride[1] == 1", "b.stride[1] == 1", "c.stride[1] == 1", "b.shape[1] == a.shape[1]")
BIG_TILE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}
SMALL_TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}

op("gemm", kernel=gemm_kernel, reference="gemm_ref", doc="c = a @ b.T (b is (N, K))", args=GEMM_ARGS,
   grid=("cdiv(a.shape[0], BLOCK_M) * cdiv(b.shape[0], BLOCK_N)",),
   specs=[spec for name, dt in HALVES.items() for spec in (
       Spec(f"{name}_aligned", dtypes={"a": dt, "b": dt}, shapes={"a": (512, 384), "b": (256, 384)},
            constexprs=BIG_TILE, constraints=GEMM_RULES,
            options={"num_warps": 8, "num_stages": 3, "hip": {"num_stages": 2},
                     "divisible_by_16": ["a", "b", "c", "stride_am", "stride_bn", "stride_cm"]}),
       Spec(name, dtypes={"a": dt, "b": dt}, shapes={"a": (100, 72), "b": (60, 72)}, constexprs=SMALL_TILE,
            constraints=GEMM_RULES, options={"num_warps": 4, "num_stages": 2}),
   )])

# -- gemm_tma: device-side tensor descriptors (TMA on sm_90: the kernel needs Triton's global scratch) ---------
op("gemm_tma", kernel=gemm_tma_kernel, reference="gemm_ref", doc="c = a @ b.T through tensor descriptors",
   args=[Tensor("a", rank=2, alignment=16), Tensor("b", rank=2, alignment=16),
         Output("c", shape=("a.shape[0]", "b.shape[0]"), dtype="a"),
         Value("M", "a.shape[0]"), Value("N", "b.shape[0]"), Value("K", "a.shape[1]"),
         Constexpr("BLOCK_M"), Constexpr("BLOCK_N"), Constexpr("BLOCK_K")],
   grid=("cdiv(a.shape[0], BLOCK_M)", "cdiv(b.shape[0], BLOCK_N)"),
   specs=[Spec(name, dtypes={"a": dt, "b": dt}, shapes={"a": (300, 264), "b": (200, 264)},
               constexprs={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64},
               options={"num_warps": 8, "num_stages": 3, "hip": {"num_stages": 2}, "divisible_by_16": ["c"]},
               # TMA: contiguous rows whose pitch is a multiple of 16 bytes (K, N multiples of 8 for 16-bit
               # types), 16-byte aligned bases (alignment=16 above), every global dim >= 1.
               constraints=(*contiguous("a"), *contiguous("b"), *contiguous("c"), "b.shape[1] == a.shape[1]",
                            "a.shape[1] % 8 == 0", "b.shape[0] % 8 == 0", "a.shape[1] >= 8"))
          for name, dt in HALVES.items()])

# -- inputs the kernel writes in place (issue 9, pattern 7): Tensor(a!) in the schema, no fresh output for them -------
# fused_add_rmsnorm(x, residual(a!), w, eps) -> out: residual += x in place, out = rmsnorm(residual) * w.
op("fused_add_rmsnorm", kernel=fused_add_rmsnorm_kernel, reference="fused_add_rmsnorm_ref",
   doc="residual += x (in place); out = rmsnorm(residual) * w",
   args=[Tensor("x", rank=2), Tensor("residual", rank=2, mutable=True), Tensor("w", rank=1), Output("out", like="x"),
         Value("x_row_stride", "x.stride[0]"), Value("r_row_stride", "residual.stride[0]"),
         Value("out_row_stride", "out.stride[0]"), Value("n_cols", "x.shape[1]"), Scalar("eps", "float", 1e-6),
         Constexpr("BLOCK_N")],
   grid=("x.shape[0]",),
   specs=[Spec(f"{name}_n{bn}", dtypes={"x": dt, "residual": dt, "w": dt},
               shapes={"x": (64, bn - 24), "residual": (64, bn - 24), "w": (bn - 24,)},
               constexprs={"BLOCK_N": bn}, options={"num_warps": nw},
               constraints=("x.stride[1] == 1", "residual.stride[1] == 1", "out.stride[1] == 1", "w.stride[0] == 1",
                            "residual.shape[0] == x.shape[0]", "residual.shape[1] == x.shape[1]",
                            "w.shape[0] == x.shape[1]", "x.shape[1] >= 1", f"x.shape[1] <= {bn}"))
          for bn, nw in ((1024, 4), (8192, 16)) for name, dt in (("f32", "float32"), ("bf16", "bfloat16"))])

# accumulate(acc(a!), x, alpha) -> (): only an in-place write, no output (no .out variant).
op("accumulate", kernel=accumulate_kernel, reference="accumulate_ref", doc="acc += alpha * x (in place, no output)",
   args=[Tensor("acc", rank=1, mutable=True), Tensor("x", rank=1), Value("n_elements", "acc.numel"),
         Scalar("alpha", "float", 1.0), Constexpr("BLOCK")],
   grid=("cdiv(acc.numel, BLOCK)",),
   specs=[Spec("f32", dtypes={"acc": "float32", "x": "float32"}, shapes={"acc": (5000,), "x": (5000,)},
               constexprs={"BLOCK": 1024}, options={"num_warps": 4},
               constraints=("acc.stride[0] == 1", "x.stride[0] == 1", "x.shape[0] == acc.shape[0]",
                            "acc.numel + 1024 <= 2147483647"))])

# rowsum_atomic_out(x) -> acc: SPLIT programs per row each add their chunk's sum into acc[r] with tl.atomic_add, so acc
# must start from zeros: Output(..., zero=True) makes the loader allocate it zero-filled (and zero an out= tensor).
SPLIT = 4
op("rowsum_atomic_out", kernel=rowsum_atomic_kernel, reference="rowsum_ref",
   doc="acc[r] = sum(x[r, :]) by atomic adds straight into a zero-filled output (float32)",
   args=[Tensor("x", rank=2), Output("acc", shape=("x.shape[0]",), dtype="x", zero=True), Value("n_cols", "x.shape[1]"),
         Value("x_row_stride", "x.stride[0]"), Value("chunk", f"cdiv(x.shape[1], {SPLIT})"), Constexpr("BLOCK")],
   grid=("x.shape[0]", str(SPLIT)),
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 4096)}, constexprs={"BLOCK": 256},
               options={"num_warps": 4}, constraints=("x.stride[1] == 1",))])
