# SPDX-License-Identifier: Apache-2.0
"""Elementwise add ``out = x + y`` over every element of contiguous tensors (Triton 3.6).

Kernel::

    add_kernel(x, y, out, n_elements, BLOCK: tl.constexpr)

* One program adds ``BLOCK`` consecutive elements of the flattened tensors; the tail is masked, so
  any ``n_elements >= 0`` works (no tile-multiple requirement). grid = ``(cdiv(n_elements, BLOCK),)``.
* dtypes: float32, bfloat16, float16 (x, y and out share one); the add is done in float32 and rounded
  back, like ``references.add_ref``.
* The tensors must be contiguous (the kernel indexes the flat storage); ``n_elements`` is an ``i32``
  and offsets are computed in 32 bits, so ``n_elements + BLOCK < 2**31``.
"""

import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n_elements, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    xv = tl.load(x + offs, mask=mask).to(tl.float32)
    yv = tl.load(y + offs, mask=mask).to(tl.float32)
    tl.store(out + offs, (xv + yv).to(out.dtype.element_ty), mask=mask)


def add_grid(meta: dict, n_elements: int) -> tuple[int]:
    """Triton's own grid function for ``add_kernel[grid](...)`` (what the spec's grid expression mirrors)."""
    return (triton.cdiv(n_elements, meta["BLOCK"]),)
