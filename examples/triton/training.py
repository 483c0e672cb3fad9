# SPDX-License-Identifier: Apache-2.0
"""Spec file of the training ops (Triton): autograd pairs whose backward writes gradients in place, and composite
ops that make each training op, forward and backward, one op of ``flyship.load`` (bundle schema 4.0).

    flyc-build examples/triton/training.py -o artifacts/training --arch sm_90

In the workload Python (torch only)::

    ops = flyship.load("artifacts/training")
    loss = ops.cross_entropy(logits, target)        # ce_fwd + a count on the host; backward: ce_bwd in place
    c = ops.swiglu(a, b)                            # backward writes da into a and db into b (or into copies)
    q2, k2 = ops.rope(q, k, cos, sin)               # backward rotates the incoming gradients in place
    ops.rope_inplace(q, cos, sin)                   # in-place forward (ctx.mark_dirty): q is rotated, not copied
    loss = ops.ce_fwd_inplace(logits, target)       # per-row loss; the gradient is written over logits

A buffer the backward overwrites is handed over only when nothing else holds it; otherwise the backward gets a
copy (docs/training.md). The ``*_inplace`` ops are autograd pairs whose forward writes its input in place (schema
5.0), the training-kernel library's form: autograd's rules apply as with ``ctx.mark_dirty``.
"""

from tl_training import (ce_bwd_kernel, ce_fwd_inplace_kernel, ce_fwd_kernel, rope_bwd_kernel, rope_fwd_kernel,
                         rope_inplace_kernel, scale_bwd_kernel, scale_fwd_kernel, swiglu_bwd_kernel, swiglu_fwd_kernel)

from flyship.compiler.spec import (Backward, Constexpr, Output, Scalar, Spec, Tensor, Value, composite, namespace, op,
                                   references)

namespace("flyship_training")
references("training_references.py")

FLOATS = {"f32": "float32", "bf16": "bfloat16"}


def dense(*names: str) -> tuple[str, ...]:
    """Row-major contiguous 2-D tensors of one shape (the flat kernels index them as one array)."""
    first = names[0]
    out = []
    for n in names:
        out += [f"{n}.stride[1] == 1", f"{n}.stride[0] == {n}.shape[1]"]
        if n != first:
            out += [f"{n}.shape[0] == {first}.shape[0]", f"{n}.shape[1] == {first}.shape[1]"]
    return (*out, f"{first}.numel + 1024 <= 2147483647")


# -- SwiGLU: c = silu(a) * b; the backward writes da into a and db into b ------------------------------------------
op("swiglu_fwd", kernel=swiglu_fwd_kernel, reference="swiglu_ref", doc="silu(a) * b",
   backward=Backward("swiglu_bwd", inputs={"dc": "grad:c", "a": "a", "b": "b"}, grads={"a": "a", "b": "b"}),
   args=[Tensor("a", rank=2, batch=True), Tensor("b", rank=2, batch=True), Output("c", like="a"),
         Value("n_elements", "a.numel"), Constexpr("BLOCK")],
   grid=("cdiv(a.numel, BLOCK)",),
   specs=[Spec(name, dtypes={"a": dt, "b": dt}, shapes={"a": (512, 1000), "b": (512, 1000)},
               constexprs={"BLOCK": 1024}, constraints=dense("a", "b", "c"))
          for name, dt in FLOATS.items()])

op("swiglu_bwd", kernel=swiglu_bwd_kernel, reference="swiglu_bwd_ref",
   doc="SwiGLU's gradients, written in place: da into a, db into b",
   args=[Tensor("dc", rank=2, batch=True), Tensor("a", rank=2, batch=True, mutable=True),
         Tensor("b", rank=2, batch=True, mutable=True), Value("n_elements", "a.numel"), Constexpr("BLOCK")],
   grid=("cdiv(a.numel, BLOCK)",),
   specs=[Spec(name, dtypes={"dc": dt, "a": dt, "b": dt}, shapes={"dc": (512, 1000), "a": (512, 1000),
                                                                  "b": (512, 1000)},
               constexprs={"BLOCK": 1024}, constraints=dense("a", "b", "dc"))
          for name, dt in FLOATS.items()])

# -- RoPE: q (T, H, D) rotated by cos/sin (T, D/2); the backward rotates the incoming gradient in place --------------
ROPE_HEADS = (32, 64)  # BLOCK_H: D/2 up to 64 and 128 (head dims 64 and 128, and smaller even ones)


def rope_guard(x: str, bh: int) -> tuple[str, ...]:
    return (f"{x}.stride[2] == 1", "cos.stride[1] == 1", "sin.stride[1] == 1", "sin.stride[0] == cos.stride[0]",
            f"cos.shape[0] == {x}.shape[0]", f"sin.shape[0] == {x}.shape[0]", f"cos.shape[1] * 2 == {x}.shape[2]",
            f"sin.shape[1] == cos.shape[1]", f"{x}.shape[2] <= {2 * bh}", f"{x}.shape[2] > {bh}")


op("rope_fwd", kernel=rope_fwd_kernel, reference="rope_ref", doc="rotate-half RoPE of q (T, H, D) by cos/sin (T, D/2)",
   backward=Backward("rope_bwd", inputs={"dq": "grad:out", "cos": "cos", "sin": "sin"}, grads={"q": "dq"}),
   args=[Tensor("q", rank=3), Output("out", like="q"), Tensor("cos", rank=2), Tensor("sin", rank=2),
         Value("q_row_stride", "q.stride[0]"), Value("q_head_stride", "q.stride[1]"),
         Value("out_row_stride", "out.stride[0]"), Value("out_head_stride", "out.stride[1]"),
         Value("cs_row_stride", "cos.stride[0]"), Value("half", "cos.shape[1]"), Constexpr("BLOCK_H")],
   grid=("q.shape[0]", "q.shape[1]"),
   specs=[Spec(f"{name}_d{2 * bh}", dtypes={"q": dt, "cos": "float32", "sin": "float32"},
               shapes={"q": (64, 8, 2 * bh), "cos": (64, bh), "sin": (64, bh)}, constexprs={"BLOCK_H": bh},
               constraints=(*rope_guard("q", bh), "out.stride[2] == 1"))
          for bh in ROPE_HEADS for name, dt in FLOATS.items()])

op("rope_bwd", kernel=rope_bwd_kernel, reference="rope_bwd_ref", doc="RoPE's gradient: the inverse rotation, in place",
   args=[Tensor("dq", rank=3, mutable=True), Tensor("cos", rank=2), Tensor("sin", rank=2),
         Value("dq_row_stride", "dq.stride[0]"), Value("dq_head_stride", "dq.stride[1]"),
         Value("cs_row_stride", "cos.stride[0]"), Value("half", "cos.shape[1]"), Constexpr("BLOCK_H")],
   grid=("dq.shape[0]", "dq.shape[1]"),
   specs=[Spec(f"{name}_d{2 * bh}", dtypes={"dq": dt, "cos": "float32", "sin": "float32"},
               shapes={"dq": (64, 8, 2 * bh), "cos": (64, bh), "sin": (64, bh)}, constexprs={"BLOCK_H": bh},
               constraints=rope_guard("dq", bh))
          for bh in ROPE_HEADS for name, dt in FLOATS.items()])

# -- cross-entropy: the forward writes the gradient, the backward scales it in place --------------------------------
op("ce_fwd", kernel=ce_fwd_kernel, reference="ce_fwd_ref",
   doc="per-row cross-entropy and its gradient softmax(x) - onehot(target) (zero on ignored rows)",
   backward=Backward("ce_bwd", inputs={"dlogits": "dlogits", "g": "grad:loss"}, grads={"logits": "dlogits"}),
   args=[Tensor("logits", rank=2), Tensor("target", rank=1),
         Output("loss", shape=("logits.shape[0]",), dtype="float32"), Output("dlogits", like="logits"),
         Value("l_row_stride", "logits.stride[0]"), Value("d_row_stride", "dlogits.stride[0]"),
         Value("n_cols", "logits.shape[1]"), Scalar("ignore_index", "int", -100), Constexpr("BLOCK")],
   grid=("logits.shape[0]",),
   specs=[Spec(name, dtypes={"logits": dt, "target": "int64"}, shapes={"logits": (64, 5000), "target": (64,)},
               constexprs={"BLOCK": 2048}, options={"num_warps": 8},
               constraints=("logits.stride[1] == 1", "dlogits.stride[1] == 1", "target.stride[0] == 1",
                            "target.shape[0] == logits.shape[0]", "logits.shape[1] >= 1"))
          for name, dt in FLOATS.items()])

op("ce_bwd", kernel=ce_bwd_kernel, reference="ce_bwd_ref", doc="scales each row of dlogits by g, in place",
   args=[Tensor("dlogits", rank=2, mutable=True), Tensor("g", rank=1), Value("d_row_stride", "dlogits.stride[0]"),
         Value("n_cols", "dlogits.shape[1]"), Constexpr("BLOCK")],
   grid=("dlogits.shape[0]",),
   specs=[Spec(name, dtypes={"dlogits": dt, "g": "float32"}, shapes={"dlogits": (64, 5000), "g": (64,)},
               constexprs={"BLOCK": 2048}, options={"num_warps": 8},
               constraints=("dlogits.stride[1] == 1", "g.stride[0] == 1", "g.shape[0] == dlogits.shape[0]"))
          for name, dt in FLOATS.items()])

# -- in-place forwards (schema 5.0): the forward writes its input, as torch.autograd.Function + ctx.mark_dirty ---------
op("rope_inplace", kernel=rope_inplace_kernel, reference="rope_inplace_ref",
   doc="rotate-half RoPE of q (T, H, D) by cos/sin (T, D/2), written into q",
   backward=Backward("rope_bwd", inputs={"dq": "grad:q", "cos": "cos", "sin": "sin"}, grads={"q": "dq"}),
   args=[Tensor("q", rank=3, mutable=True), Tensor("cos", rank=2), Tensor("sin", rank=2),
         Value("q_row_stride", "q.stride[0]"), Value("q_head_stride", "q.stride[1]"),
         Value("cs_row_stride", "cos.stride[0]"), Value("half", "cos.shape[1]"), Constexpr("BLOCK_H")],
   grid=("q.shape[0]", "q.shape[1]"),
   specs=[Spec(f"{name}_d{2 * bh}", dtypes={"q": dt, "cos": "float32", "sin": "float32"},
               shapes={"q": (64, 8, 2 * bh), "cos": (64, bh), "sin": (64, bh)}, constexprs={"BLOCK_H": bh},
               constraints=rope_guard("q", bh))
          for bh in ROPE_HEADS for name, dt in FLOATS.items()])

op("ce_fwd_inplace", kernel=ce_fwd_inplace_kernel, reference="ce_fwd_inplace_ref",
   doc="per-row cross-entropy; its gradient softmax(x) - onehot(target) is written over the logits",
   backward=Backward("ce_bwd", inputs={"dlogits": "logits", "g": "grad:loss"}, grads={"logits": "dlogits"}),
   args=[Tensor("logits", rank=2, mutable=True), Tensor("target", rank=1),
         Output("loss", shape=("logits.shape[0]",), dtype="float32"), Value("l_row_stride", "logits.stride[0]"),
         Value("n_cols", "logits.shape[1]"), Scalar("ignore_index", "int", -100), Constexpr("BLOCK")],
   grid=("logits.shape[0]",),
   specs=[Spec(name, dtypes={"logits": dt, "target": "int64"}, shapes={"logits": (64, 5000), "target": (64,)},
               constexprs={"BLOCK": 2048}, options={"num_warps": 8},
               constraints=("logits.stride[1] == 1", "target.stride[0] == 1", "target.shape[0] == logits.shape[0]",
                            "logits.shape[1] >= 1"))
          for name, dt in FLOATS.items()])

# -- scale by a weight vector: the backward is a composite, a kernel then a host-side reduction ----------------------
from training_references import SCALE_ROWS  # noqa: E402 - rows per program of scale_bwd_kernel (one owner)

op("scale", kernel=scale_fwd_kernel, reference="scale_ref", doc="x * w, w broadcast over rows",
   backward=Backward("scale_bwd", inputs={"dy": "grad:y", "x": "x", "w": "w"}, grads={"x": "dx", "w": "dw"}),
   args=[Tensor("x", rank=2), Tensor("w", rank=1), Output("y", like="x"), Value("x_row_stride", "x.stride[0]"),
         Value("y_row_stride", "y.stride[0]"), Value("n_cols", "x.shape[1]"), Constexpr("BLOCK_N")],
   grid=("x.shape[0]", "cdiv(x.shape[1], BLOCK_N)"),
   specs=[Spec(name, dtypes={"x": dt, "w": dt}, shapes={"x": (256, 1000), "w": (1000,)}, constexprs={"BLOCK_N": 1024},
               constraints=("x.stride[1] == 1", "y.stride[1] == 1", "w.stride[0] == 1", "w.shape[0] == x.shape[1]"))
          for name, dt in FLOATS.items()])

op("scale_bwd_partial", kernel=scale_bwd_kernel, reference="scale_bwd_partial_ref",
   doc="dx = dy * w and per-block partial sums of dy * x (float32)",
   args=[Tensor("dy", rank=2), Tensor("x", rank=2), Tensor("w", rank=1), Output("dx", like="dy"),
         Output("partial", shape=(f"cdiv(x.shape[0], {SCALE_ROWS})", "x.shape[1]"), dtype="float32"),
         Value("dy_row_stride", "dy.stride[0]"), Value("x_row_stride", "x.stride[0]"),
         Value("dx_row_stride", "dx.stride[0]"), Value("p_row_stride", "partial.stride[0]"),
         Value("n_rows", "x.shape[0]"), Value("n_cols", "x.shape[1]"), Constexpr("ROWS"), Constexpr("BLOCK_N")],
   grid=(f"cdiv(x.shape[0], {SCALE_ROWS})", "cdiv(x.shape[1], BLOCK_N)"),
   specs=[Spec(name, dtypes={"dy": dt, "x": dt, "w": dt}, shapes={"dy": (256, 1000), "x": (256, 1000), "w": (1000,)},
               constexprs={"ROWS": SCALE_ROWS, "BLOCK_N": 256},
               constraints=("dy.stride[1] == 1", "x.stride[1] == 1", "dx.stride[1] == 1", "partial.stride[1] == 1",
                            "w.stride[0] == 1", "dy.shape[0] == x.shape[0]", "dy.shape[1] == x.shape[1]",
                            "w.shape[0] == x.shape[1]"))
          for name, dt in FLOATS.items()])

composite("scale_bwd", function="scale_bwd", returns=["dx", "dw"], doc="scale's backward: kernel, then dw on the host",
          args=[Tensor("dy", rank=2), Tensor("x", rank=2), Tensor("w", rank=1)])

# -- the training ops a user calls: one op each, forward and backward ------------------------------------------------
composite("cross_entropy", function="cross_entropy", returns=["loss"],
          doc="mean cross-entropy over rows whose target is not ignore_index",
          args=[Tensor("logits", rank=2), Tensor("target", rank=1), Scalar("ignore_index", "int", -100)])
composite("swiglu", function="swiglu", returns=["c"], doc="silu(a) * b", args=[Tensor("a", rank=2),
                                                                               Tensor("b", rank=2)])
composite("rope", function="rope", returns=["q_out", "k_out"], doc="RoPE of queries and keys",
          args=[Tensor("q", rank=3), Tensor("k", rank=3), Tensor("cos", rank=2), Tensor("sin", rank=2)])
