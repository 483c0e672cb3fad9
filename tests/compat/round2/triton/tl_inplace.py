# SPDX-License-Identifier: Apache-2.0
"""Kernels that write an input in place (Triton 3.6): the op declares it ``Tensor(..., mutable=True)``.

Kernels::

    fused_add_rmsnorm_kernel(x, residual, w, out, x_row_stride, r_row_stride, out_row_stride, n_cols, eps,
                             BLOCK_N: tl.constexpr)
    accumulate_kernel(acc, x, n_elements, alpha, BLOCK: tl.constexpr)

* ``fused_add_rmsnorm``: a transformer block's pre-norm step. ``residual += x`` is written back in place (the
  residual stream carries on with the sum) and ``out = rmsnorm(residual) * w`` is a fresh output. x, residual,
  out (M, N), w (N,); one dtype; math in float32, the sum rounded to the dtype before the norm (what the next
  layer reads). One program per row, ``BLOCK_N >= N`` (guarded), row strides at run time.
* ``accumulate``: ``acc += alpha * x`` over contiguous tensors; the op has no output at all (it returns ``()``),
  only the in-place write. One flat pass, ``BLOCK`` elements per program.
"""

import triton
import triton.language as tl


@triton.jit
def fused_add_rmsnorm_kernel(x, residual, w, out, x_row_stride, r_row_stride, out_row_stride, n_cols, eps,
                             BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    xv = tl.load(x + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rv = tl.load(residual + row * r_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    h = (xv + rv).to(residual.dtype.element_ty)
    tl.store(residual + row * r_row_stride + cols, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    wv = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * out_row_stride + cols, (hf * rstd * wv).to(out.dtype.element_ty), mask=mask)


@triton.jit
def accumulate_kernel(acc, x, n_elements, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    a = tl.load(acc + offs, mask=mask).to(tl.float32)
    v = tl.load(x + offs, mask=mask).to(tl.float32)
    tl.store(acc + offs, (a + alpha * v).to(acc.dtype.element_ty), mask=mask)


def fused_add_rmsnorm_grid(meta: dict, n_rows: int) -> tuple[int]:
    """Triton's own grid function for ``fused_add_rmsnorm_kernel[grid](...)``: one program per row."""
    return (n_rows,)


def accumulate_grid(meta: dict, n_elements: int) -> tuple[int]:
    """Triton's own grid function for ``accumulate_kernel[grid](...)``."""
    return (triton.cdiv(n_elements, meta["BLOCK"]),)
