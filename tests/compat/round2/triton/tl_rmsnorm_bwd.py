# SPDX-License-Identifier: Apache-2.0
"""RMSNorm backward as training-kernel libraries write it (Triton 3.6): a persistent first kernel over one
program per SM/CU, each accumulating its rows' share of dW into one row of a ``(cu_count, N)`` float32 workspace,
then a second kernel summing the workspace's rows into dW.

Kernels::

    rmsnorm_bwd_dx_kernel(dy, x, w, dx, partial, n_rows, n_cols, x_row_stride, dy_row_stride, dx_row_stride,
                          rows_per_program, eps, BLOCK_N: tl.constexpr)
    sum_rows_kernel(partial, dw, n_parts, n_cols, BLOCK: tl.constexpr)

* y = x * rstd * w with rstd = 1 / sqrt(mean(x**2) + eps) (recomputed here);
  dx = rstd * (w * dy - x_hat * mean(x_hat * w * dy)), x_hat = x * rstd; dW = sum over rows of dy * x_hat.
* Kernel 1: grid ``(cu_count,)``; program p takes rows ``[p * rows_per_program, (p + 1) * rows_per_program)``
  and writes its dW share (float32) to ``partial[p, :]`` (every program writes its row, zeros when it has none).
* Kernel 2: grid ``(cdiv(N, BLOCK),)``; ``dw[c] = sum_p partial[p, c]`` in float32, cast to dW's dtype.
* ``BLOCK_N`` (a power of two) must be >= N; the last dim of x, dy, dx and w contiguous.
"""

import triton
import triton.language as tl


@triton.jit
def rmsnorm_bwd_dx_kernel(dy, x, w, dx, partial, n_rows, n_cols, x_row_stride, dy_row_stride, dx_row_stride,
                          rows_per_program, eps, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    wv = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for row in range(row_start, row_end):
        r64 = row.to(tl.int64)
        xv = tl.load(x + r64 * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dyv = tl.load(dy + r64 * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=0) / n_cols + eps)
        xhat = xv * rstd
        wdy = wv * dyv
        c = tl.sum(xhat * wdy, axis=0) / n_cols
        tl.store(dx + r64 * dx_row_stride + cols, ((wdy - xhat * c) * rstd).to(dx.dtype.element_ty), mask=mask)
        acc += dyv * xhat
    tl.store(partial + pid.to(tl.int64) * n_cols + cols, acc, mask=mask)


@triton.jit
def sum_rows_kernel(partial, dw, n_parts, n_cols, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(0, n_parts):
        acc += tl.load(partial + p * n_cols + cols, mask=mask, other=0.0)
    tl.store(dw + cols, acc.to(dw.dtype.element_ty), mask=mask)


def launch_with_triton(dy, x, w, eps, cu_count, block_n, num_warps=8):
    """The same two kernels launched by Triton's own JIT (``kernel[grid](...)``), as a library would, with the
    options of workspaces.py's specs (``num_warps`` for both kernels, ``BLOCK=256``): the bench's and the GPU test's
    reference launch. Returns (dx, dw)."""
    import torch

    n_rows, n_cols = x.shape
    dx = torch.empty_like(x)
    partial = torch.empty((cu_count, n_cols), dtype=torch.float32, device=x.device)
    dw = torch.empty_like(w)
    rows_per_program = triton.cdiv(n_rows, cu_count)
    rmsnorm_bwd_dx_kernel[(cu_count,)](dy, x, w, dx, partial, n_rows, n_cols, x.stride(0), dy.stride(0),
                                       dx.stride(0), rows_per_program, eps, BLOCK_N=block_n, num_warps=num_warps)
    sum_rows_kernel[(triton.cdiv(n_cols, 256),)](partial, dw, cu_count, n_cols, BLOCK=256, num_warps=num_warps)
    return dx, dw
