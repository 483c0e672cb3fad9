# SPDX-License-Identifier: Apache-2.0
"""RMSNorm over the last dim: ``out = x * rsqrt(mean(x**2) + eps) * w`` (Triton 3.6).

Kernel::

    rmsnorm_kernel(x, w, out, x_row_stride, out_row_stride, n_cols, eps, BLOCK_N: tl.constexpr)

* x (M, N), w (N,), out (M, N); one dtype for all three (float32, bfloat16, float16); math in float32.
* ``eps`` is a runtime float32 kernel argument (changing it does not recompile).
* One program per row, grid = ``(M,)``; ``BLOCK_N`` (a power of two) must be >= N, each specialization
  is guarded by ``x.shape[1] <= BLOCK_N``. Columns past N are masked.
* Row strides are runtime values; the last dim of x and out, and w, must be contiguous.
"""

import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x, w, out, x_row_stride, out_row_stride, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    xv = tl.load(x + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=0) / n_cols + eps)
    wv = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * out_row_stride + cols, (xv * rstd * wv).to(out.dtype.element_ty), mask=mask)


def rmsnorm_grid(meta: dict, n_rows: int) -> tuple[int]:
    """Triton's own grid function for ``rmsnorm_kernel[grid](...)``."""
    return (n_rows,)
