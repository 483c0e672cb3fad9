# Frozen compatibility corpus (tests/compat/README.md): do not edit.
"""A row kernel in the shape of a training library's norm kernels, written against the round-3 docs (docs/triton.md
at main f2869ed): launched twice by one op, the second launch skipping the inputs."""

import triton
import triton.language as tl


@triton.jit
def rows_kernel(x, w, out, x_stride, w_stride, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    if MODE == 0:
        v = tl.load(x + row * x_stride + cols, mask=m) * tl.load(w + row * w_stride + cols, mask=m)
        tl.store(out + row * n + cols, v, mask=m)
    else:
        v = tl.load(out + row * n + cols, mask=m)
        tl.store(out + row * n + cols, v + 1.0, mask=m)
