# SPDX-License-Identifier: Apache-2.0
"""Training kernels whose backward writes gradients in place (Triton 3.6), the patterns training-kernel libraries
use to save memory: the backward overwrites buffers nobody needs any more instead of allocating gradients.

Kernels::

    swiglu_fwd_kernel(a, b, c, n_elements, BLOCK: tl.constexpr)
    swiglu_bwd_kernel(dc, a, b, n_elements, BLOCK: tl.constexpr)
    rope_fwd_kernel(q, out, cos, sin, q_row_stride, q_head_stride, out_row_stride, out_head_stride,
                    cs_row_stride, half, BLOCK_H: tl.constexpr)
    rope_bwd_kernel(dq, cos, sin, dq_row_stride, dq_head_stride, cs_row_stride, half, BLOCK_H: tl.constexpr)
    rope_inplace_kernel(q, cos, sin, q_row_stride, q_head_stride, cs_row_stride, half, BLOCK_H: tl.constexpr)
    ce_fwd_kernel(logits, target, loss, dlogits, l_row_stride, d_row_stride, n_cols, ignore_index,
                  BLOCK: tl.constexpr)
    ce_bwd_kernel(dlogits, g, d_row_stride, n_cols, BLOCK: tl.constexpr)
    ce_fwd_inplace_kernel(logits, target, loss, l_row_stride, n_cols, ignore_index, BLOCK: tl.constexpr)
    scale_fwd_kernel(x, w, y, x_row_stride, y_row_stride, n_cols, BLOCK_N: tl.constexpr)
    scale_bwd_kernel(dy, x, w, dx, partial, dy_row_stride, x_row_stride, dx_row_stride, p_row_stride, n_rows,
                     n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr)

* SwiGLU: ``c = silu(a) * b`` over contiguous tensors, one flat pass. The backward reads ``dc, a, b`` and writes
  ``da`` into ``a`` and ``db`` into ``b`` (each element is read before it is overwritten, by the same program).
* RoPE (rotate-half form): ``q`` is ``(T, H, D)``, ``cos``/``sin`` are ``(T, D/2)`` float32; the first and second
  halves of each head rotate by the token's angles. The rotation is orthogonal, so the backward is the rotation by
  the opposite angles, applied in place to the incoming gradient. One program per (token, head).
* Cross-entropy: one program per row, looping over the vocabulary in ``BLOCK`` chunks with an online max/sum
  (no row in registers, any vocabulary size). The forward writes each row's loss and its gradient
  ``softmax(x) - onehot(target)`` into ``dlogits`` (zeros on ignored rows: every element is written); the backward
  scales ``dlogits`` in place by the incoming per-row gradient. A target outside ``[0, n_cols)`` that is not
  ``ignore_index`` gives a NaN loss (torch raises there; a kernel cannot, so the loss says it).
* In-place forwards (the training-kernel library's form, an autograd pair whose forward writes its input as
  ``ctx.mark_dirty`` allows): ``rope_inplace_kernel`` rotates ``q`` itself (each program reads both halves of its
  head before it writes them); ``ce_fwd_inplace_kernel`` writes each row's gradient over the row's logits (the
  second pass reads each chunk before it overwrites it, and the loss needs only the first pass and the target's
  logit, read before the second pass). Their backwards are ``rope_bwd_kernel`` and ``ce_bwd_kernel``.

* Scale by a weight vector (``y = x * w``, x (M, N), w (N,)): the weight's gradient is a reduction over rows. The
  backward kernel writes ``dx`` and one float32 row of partial sums per block of ``ROWS`` rows; the host step
  ``partial.sum(0).to(w.dtype)`` (a composite of the bundle) finishes ``dw``, the pattern of norm backwards.

All math in float32; values are rounded to the tensors' dtype when stored.
"""

import triton
import triton.language as tl


@triton.jit
def swiglu_fwd_kernel(a, b, c, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    av = tl.load(a + offs, mask=mask, other=0.0).to(tl.float32)
    bv = tl.load(b + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(c + offs, (av * tl.sigmoid(av) * bv).to(c.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(dc, a, b, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    g = tl.load(dc + offs, mask=mask, other=0.0).to(tl.float32)
    av = tl.load(a + offs, mask=mask, other=0.0).to(tl.float32)
    bv = tl.load(b + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(av)
    # d/da [a * sig(a)] = sig(a) * (1 + a * (1 - sig(a)))
    da = g * bv * sig * (1.0 + av * (1.0 - sig))
    db = g * av * sig
    tl.store(a + offs, da.to(a.dtype.element_ty), mask=mask)
    tl.store(b + offs, db.to(b.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_head(src, dst, cos, sin, src_off, dst_off, cs_off, half, SIGN: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rotate one head: (x1, x2) -> (x1 cos - s x2 sin, x2 cos + s x1 sin) with s = SIGN (-1: the inverse)."""
    cols = tl.arange(0, BLOCK_H)
    mask = cols < half
    c = tl.load(cos + cs_off + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin + cs_off + cols, mask=mask, other=0.0).to(tl.float32) * SIGN
    x1 = tl.load(src + src_off + cols, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + src_off + half + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst + dst_off + cols, (x1 * c - x2 * s).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + dst_off + half + cols, (x2 * c + x1 * s).to(dst.dtype.element_ty), mask=mask)


@triton.jit
def rope_fwd_kernel(q, out, cos, sin, q_row_stride, q_head_stride, out_row_stride, out_head_stride, cs_row_stride,
                    half, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    _rotate_head(q, out, cos, sin, row * q_row_stride + head * q_head_stride,
                 row * out_row_stride + head * out_head_stride, row * cs_row_stride, half, 1.0, BLOCK_H)


@triton.jit
def rope_bwd_kernel(dq, cos, sin, dq_row_stride, dq_head_stride, cs_row_stride, half, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    off = row * dq_row_stride + head * dq_head_stride
    _rotate_head(dq, dq, cos, sin, off, off, row * cs_row_stride, half, -1.0, BLOCK_H)


@triton.jit
def rope_inplace_kernel(q, cos, sin, q_row_stride, q_head_stride, cs_row_stride, half, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    off = row * q_row_stride + head * q_head_stride
    _rotate_head(q, q, cos, sin, off, off, row * cs_row_stride, half, 1.0, BLOCK_H)


@triton.jit
def ce_fwd_kernel(logits, target, loss, dlogits, l_row_stride, d_row_stride, n_cols, ignore_index,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    src = logits + row * l_row_stride
    dst = dlogits + row * d_row_stride
    t = tl.load(target + row)
    m = float("-inf")
    total = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(src + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(total)
    keep = t != ignore_index
    inside = (t >= 0) & (t < n_cols)
    xt = tl.load(src + t, mask=keep & inside, other=0.0).to(tl.float32)
    row_loss = tl.where(inside, lse - xt, float("nan"))
    tl.store(loss + row, tl.where(keep, row_loss, 0.0))
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(src + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        p = tl.exp(x - lse)
        g = tl.where(cols == t, p - 1.0, p)
        tl.store(dst + cols, tl.where(keep, g, 0.0).to(dlogits.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def ce_fwd_inplace_kernel(logits, target, loss, l_row_stride, n_cols, ignore_index, BLOCK: tl.constexpr):
    # ce_fwd_kernel with dlogits = logits: every read of a chunk comes before its write, by the same program.
    ce_fwd_kernel(logits, target, loss, logits, l_row_stride, l_row_stride, n_cols, ignore_index, BLOCK)


@triton.jit
def ce_bwd_kernel(dlogits, g, d_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dst = dlogits + row * d_row_stride
    scale = tl.load(g + row).to(tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(dst + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        tl.store(dst + cols, (x * scale).to(dlogits.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def scale_fwd_kernel(x, w, y, x_row_stride, y_row_stride, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    xv = tl.load(x + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    wv = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y + row * y_row_stride + cols, (xv * wv).to(y.dtype.element_ty), mask=mask)


@triton.jit
def scale_bwd_kernel(dy, x, w, dx, partial, dy_row_stride, x_row_stride, dx_row_stride, p_row_stride, n_rows, n_cols,
                     ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    block = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    wv = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for r in range(0, ROWS):
        row = (block * ROWS + r).to(tl.int64)
        m = mask & (row < n_rows)
        g = tl.load(dy + row * dy_row_stride + cols, mask=m, other=0.0).to(tl.float32)
        xv = tl.load(x + row * x_row_stride + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(dx + row * dx_row_stride + cols, (g * wv).to(dx.dtype.element_ty), mask=m)
        acc += g * xv
    tl.store(partial + block.to(tl.int64) * p_row_stride + cols, acc, mask=mask)
