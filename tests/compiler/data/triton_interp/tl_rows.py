"""Triton kernels of the interpreter tests: a row scale (one program per row) with the row stride a runtime value."""

import triton
import triton.language as tl


@triton.jit
def scale_rows_kernel(x, out, x_row_stride, out_row_stride, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    v = tl.load(x + row * x_row_stride + cols, mask=mask, other=0.0)
    tl.store(out + row * out_row_stride + cols, v * 2.0 + 1.0, mask=mask)


@triton.jit
def scale_row_pairs_kernel(x, out, x_row_stride, out_row_stride, n_rows, n_cols, BLOCK_N: tl.constexpr):
    """Two rows per program (rows 2p and 2p + 1, the second masked past n_rows): the grid must be cdiv(rows, 2)."""
    cols = tl.arange(0, BLOCK_N)
    for i in tl.static_range(2):
        row = tl.program_id(0).to(tl.int64) * 2 + i
        mask = (cols < n_cols) & (row < n_rows)
        v = tl.load(x + row * x_row_stride + cols, mask=mask, other=0.0)
        tl.store(out + row * out_row_stride + cols, v * 2.0 + 1.0, mask=mask)


@triton.jit
def row_partial_kernel(x, partial, n_cols, x_row_stride, chunk, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """Phase 1 of a split row sum: program (row, part) writes the sum of its chunk of columns into the workspace."""
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    local = tl.arange(0, BLOCK)
    cols = part * chunk + local
    v = tl.load(x + row * x_row_stride + cols, mask=(local < chunk) & (cols < n_cols), other=0.0)
    tl.store(partial + row * SPLIT + part, tl.sum(v, axis=0))


@triton.jit
def row_combine_kernel(partial, y, SPLIT: tl.constexpr):
    """Phase 2: each row's SPLIT partial sums added."""
    row = tl.program_id(0).to(tl.int64)
    tl.store(y + row, tl.sum(tl.load(partial + row * SPLIT + tl.arange(0, SPLIT)), axis=0))


@triton.jit
def scale_row_pairs_inplace_kernel(x, x_row_stride, n_rows, n_cols, BLOCK_N: tl.constexpr):
    """scale_row_pairs_kernel writing x in place: the grid must be cdiv(rows, 2)."""
    cols = tl.arange(0, BLOCK_N)
    for i in tl.static_range(2):
        row = tl.program_id(0).to(tl.int64) * 2 + i
        mask = (cols < n_cols) & (row < n_rows)
        v = tl.load(x + row * x_row_stride + cols, mask=mask, other=0.0)
        tl.store(x + row * x_row_stride + cols, v * 2.0 + 1.0, mask=mask)
