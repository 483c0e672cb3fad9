# SPDX-License-Identifier: Apache-2.0
"""A persistent row sum ``out[r] = sum(x[r, :])`` whose grid is sized by the device (Triton 3.6).

Kernel::

    rowsum_persistent_kernel(x, out, n_rows, n_cols, x_row_stride, BLOCK_N: tl.constexpr)

* At most one program per compute unit: grid = ``(min(n_rows, CUs),)``, as Triton's fused-softmax
  tutorial sizes its persistent grid from the device; each program walks rows ``pid, pid + grid, ...``.
  One target ID covers devices of different sizes (gfx942: 304-CU MI300X, 80-CU MI308X), so the grid
  reads the device at run time (``device.cu_count`` in the spec), never the build machine's count.
* float32 in, float32 out; a row fits one block (``n_cols <= BLOCK_N``), rows may be strided.
"""

import triton
import triton.language as tl


@triton.jit
def rowsum_persistent_kernel(x, out, n_rows, n_cols, x_row_stride, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    for row in tl.range(pid, n_rows, programs):
        v = tl.load(x + row * x_row_stride + offs, mask=mask, other=0.0)
        tl.store(out + row, tl.sum(v, axis=0))


def rowsum_grid(n_rows: int, cu_count: int) -> tuple[int]:
    """The grid a Triton user computes from ``torch.cuda.get_device_properties(d).multi_processor_count``."""
    return (min(n_rows, cu_count),)
