"""A Triton kernel that returns before its stores on some rows (the cross-entropy pattern: ignored rows are
skipped), for tests/gpu/test_verify_unwritten.py.

``skip_rows_kernel(x, t, out, n, BLOCK)``: one program per row of x (M, N); a row whose label ``t[row]`` is
negative is left alone, the others get ``out[row] = 2 * x[row]``. Without ``zero=True`` the skipped rows of a
fresh output hold whatever the allocator left there.
"""

import triton
import triton.language as tl


@triton.jit
def skip_rows_kernel(x, t, out, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    if tl.load(t + row) < 0:
        return
    cols = tl.arange(0, BLOCK)
    m = cols < n
    v = tl.load(x + row * n + cols, mask=m)
    tl.store(out + row * n + cols, v * 2, mask=m)
