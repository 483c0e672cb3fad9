# SPDX-License-Identifier: Apache-2.0
"""Two-phase row sums (Triton 3.6): the kernels of ``multilaunch.py``, an op that launches two kernels per call.

Split row sum (``rowsum_split``), a two-pass reduction through a workspace ``partial`` of shape (M, SPLIT)::

    rowsum_partial_kernel(x, partial, n_cols, x_row_stride, chunk, SPLIT: tl.constexpr, BLOCK: tl.constexpr)
        grid (M, SPLIT): program (r, s) sums x[r, s*chunk : (s+1)*chunk] in float32 into partial[r, s]
    rowsum_combine_kernel(partial, y, SPLIT: tl.constexpr)
        grid (M,): y[r] = sum(partial[r, :])

Atomic row sum (``rowsum_atomic``), through a workspace ``acc`` of shape (M,) that must start at zero::

    rowsum_atomic_kernel(x, acc, n_cols, x_row_stride, chunk, BLOCK: tl.constexpr)
        grid (M, SPLIT): atomically adds its chunk's sum into acc[r]
    rowsum_cast_kernel(acc, y, n_rows, BLOCK: tl.constexpr)
        grid (cdiv(M, BLOCK),): y[r] = acc[r] in y's dtype

Rows need a unit column stride (the row stride is a parameter); offsets are 32-bit, so x.numel < 2**31.
"""

import triton
import triton.language as tl


@triton.jit
def rowsum_partial_kernel(x, partial, n_cols, x_row_stride, chunk, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    start = part * chunk
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, chunk, BLOCK):
        local = off + tl.arange(0, BLOCK)
        cols = start + local
        mask = (local < chunk) & (cols < n_cols)
        acc += tl.load(x + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(partial + row * SPLIT + part, tl.sum(acc, axis=0))


@triton.jit
def rowsum_combine_kernel(partial, y, SPLIT: tl.constexpr):
    row = tl.program_id(0)
    vals = tl.load(partial + row * SPLIT + tl.arange(0, SPLIT))
    tl.store(y + row, tl.sum(vals, axis=0).to(y.dtype.element_ty))


@triton.jit
def rowsum_atomic_kernel(x, acc, n_cols, x_row_stride, chunk, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    start = part * chunk
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, chunk, BLOCK):
        local = off + tl.arange(0, BLOCK)
        cols = start + local
        mask = (local < chunk) & (cols < n_cols)
        total += tl.load(x + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    tl.atomic_add(acc + row, tl.sum(total, axis=0))


@triton.jit
def rowsum_cast_kernel(acc, y, n_rows, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_rows
    tl.store(y + offs, tl.load(acc + offs, mask=mask).to(y.dtype.element_ty), mask=mask)
