# SPDX-License-Identifier: Apache-2.0
"""Row softmax over the last dim of a 2-D (M, N) tensor (Triton 3.6).

Kernel::

    softmax_kernel(x, out, x_row_stride, out_row_stride, n_cols, BLOCK_N: tl.constexpr)

* out[m, :] = exp(x[m, :] - max(x[m, :])) / sum(exp(x[m, :] - max(x[m, :]))), all math in float32.
* One program per row, grid = ``(M,)``; the whole row lives in registers, so ``BLOCK_N`` (a power of two)
  must be >= N: each specialization of the op is compiled for one ``BLOCK_N`` and guarded by
  ``x.shape[1] <= BLOCK_N``. Columns past N are masked (loaded as -inf, never stored).
* Row strides are runtime values (any row stride); the last dim must be contiguous (stride 1).
* dtypes: float32, bfloat16, float16 in and out.

Backward (``softmax_bwd_kernel(dy, y, dx, dy_row_stride, y_row_stride, dx_row_stride, n_cols, BLOCK_N)``): with
``y = softmax(x)`` and ``dy`` the gradient of ``y``, ``dx = y * (dy - sum(dy * y))`` per row; the same
one-program-per-row scheme, float32 math.
"""

import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x, out, x_row_stride, out_row_stride, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    v = tl.load(x + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    v = v - tl.max(v, axis=0)
    e = tl.exp(v)
    tl.store(out + row * out_row_stride + cols, (e / tl.sum(e, axis=0)).to(out.dtype.element_ty), mask=mask)


@triton.jit
def softmax_bwd_kernel(dy, y, dx, dy_row_stride, y_row_stride, dx_row_stride, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    g = tl.load(dy + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    p = tl.load(y + row * y_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    d = p * (g - tl.sum(g * p, axis=0))
    tl.store(dx + row * dx_row_stride + cols, d.to(dx.dtype.element_ty), mask=mask)


def softmax_grid(meta: dict, n_rows: int) -> tuple[int]:
    """Triton's own grid function for ``softmax_kernel[grid](...)``."""
    return (n_rows,)
