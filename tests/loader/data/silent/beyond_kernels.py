# SPDX-License-Identifier: Apache-2.0
"""FlyDSL kernels right on their spec's example yet wrong on inputs the guard admits (issue 33 item 5, the cases
silent_kernels.py and mixed_kernels.py leave out). Each builds and loads:

* ``gemm_colb``: ``out = a @ b`` (float32, one thread per output element, K baked in) reading b through its data
  pointer as column-major ``(K, N):(1, K)``, never its strides: right for the column-major b of the example, wrong for
  a padded column-major b the guard also admits (FlyDSL's guard pins only ``b.stride[0] == 1``);
* ``gemm_colb_ptr``: the same kernel with b a bare ``fx.Pointer`` of the launcher: flyship's guard for a pointer
  operand asks for contiguous rows, so it admits a row-major b (and not the column-major example, so here the
  example-only `flyship verify` on a GPU would report the example refused), read wrongly;
* ``q_scale``: the Q load of a flash-attention kernel, ``out = q * 0.5`` for q ``(T, H, D)``, indexing q with the
  fixed per-token stride ``H * D`` and never reading q's strides, while the guard asks only ``q.stride[2] == 1``:
  a padded q (rows of D + pad) or q = k.transpose(0, 1) is read wrongly;
* ``lds_broadcast``: every wave of a 128-thread workgroup reads the slot of LDS wave 0 stages, with no barrier
  between wave 0's write and the other waves' reads: right only when wave 0 runs first (an LDS race);
* ``wrap_512``: ``out = x + 1`` that reads row ``r % 512``: right for the first 512 rows only;
* ``cols_baked``: ``out = x + 1`` with x's column count N baked in (a Constexpr, also its row stride) while the
  guard admits ``x.shape[1] <= N``: right for N columns only, reads past x for fewer.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

THREADS = 64
ROWS_MAX = 1 << 20


@flyc.kernel
def gemm_colb_kernel(A: fx.Tensor, B: fx.Tensor, Out: fx.Tensor, K: fx.Constexpr[int]):
    n = fx.thread_idx.x
    m = fx.block_idx.x
    M, N = Out.shape.unpack()
    sa = A.stride.unpack()[0]
    so = Out.stride.unpack()[0]
    if n < N:
        acc = fx.Float32(0.0)
        for k in fx.range_constexpr(K):
            a = fx.generic_load(A.iter + (m * sa + k))
            b = fx.generic_load(B.iter + (n * K + k))  # the bug: b read as column-major, whatever its strides
            acc = acc + a * b
        fx.generic_store(Out.iter + (m * so + n), acc)


@flyc.jit
def gemm_colb(a: fx.Tensor, b: fx.Tensor, out: fx.Tensor, K: fx.Constexpr[int],
              stream: fx.Stream = fx.Stream(None)):
    M, N = out.shape.unpack()
    gemm_colb_kernel(a, b, out, K).launch(grid=(M, 1, 1), block=(THREADS, 1, 1), stream=stream)


@flyc.kernel
def q_scale_kernel(Q: fx.Tensor, Out: fx.Tensor):
    d = fx.thread_idx.x
    row = fx.block_idx.x  # one (token, head) pair per workgroup: row = t * H + h
    T, H, D = Q.shape.unpack()
    if d < D:
        q = fx.generic_load(Q.iter + (row * D + d))  # the bug: token stride H * D and head stride D assumed
        fx.generic_store(Out.iter + (row * D + d), q * 0.5)


@flyc.jit
def q_scale(q: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    T, H, D = q.shape.unpack()
    q_scale_kernel(q, out).launch(grid=(T * H, 1, 1), block=(THREADS, 1, 1), stream=stream)


@flyc.kernel
def lds_broadcast_kernel(X: fx.Tensor, Out: fx.Tensor):
    tid = fx.thread_idx.x
    row = fx.block_idx.x
    sx = X.stride.unpack()[0]
    so = Out.stride.unpack()[0]
    lds = fx.SharedAllocator().allocate(fx.Array[fx.Float32, THREADS, 16]).peek()
    slot = lds.view(fx.make_layout((THREADS,), (1,)))
    if tid < THREADS:  # wave 0 stages its row chunk
        fx.generic_store(slot.iter + tid, fx.generic_load(X.iter + (row * sx + tid)))
    # the bug: no fx.barrier() here; wave 1 reads slots wave 0 may not have written yet
    fx.generic_store(Out.iter + (row * so + tid), fx.generic_load(slot.iter + (tid % THREADS)) * 2.0)


@flyc.jit
def lds_broadcast(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    M, N = x.shape.unpack()
    lds_broadcast_kernel(x, out).launch(grid=(M, 1, 1), block=(2 * THREADS, 1, 1), stream=stream)


@flyc.kernel
def wrap_512_kernel(X: fx.Tensor, Out: fx.Tensor):
    col = fx.thread_idx.x
    row = fx.block_idx.x
    M, N = X.shape.unpack()
    sx = X.stride.unpack()[0]
    so = Out.stride.unpack()[0]
    if col < N:
        v = fx.generic_load(X.iter + ((row % 512) * sx + col))  # the bug: row r reads row r % 512
        fx.generic_store(Out.iter + (row * so + col), v + 1.0)


@flyc.jit
def wrap_512(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    M, N = x.shape.unpack()
    wrap_512_kernel(x, out).launch(grid=(M, 1, 1), block=(THREADS, 1, 1), stream=stream)


@flyc.jit
def gemm_colb_ptr(a: fx.Tensor, b: fx.Pointer, out: fx.Tensor, K: fx.Constexpr[int],
                  stream: fx.Stream = fx.Stream(None)):
    """gemm_colb with b a bare pointer viewed column-major ``(K, N):(1, K)``: the guard flyship derives for a
    pointer operand admits contiguous (row-major) rows of b, which this kernel reads as column-major."""
    M, N = out.shape.unpack()
    bs = fx.Tensor(fx.make_view(b, fx.make_layout((K, ROWS_MAX), (1, K))))
    gemm_colb_kernel(a, bs, out, K).launch(grid=(M, 1, 1), block=(THREADS, 1, 1), stream=stream)


@flyc.kernel
def cols_baked_kernel(X: fx.Tensor, Out: fx.Tensor, N: fx.Constexpr[int]):
    col = fx.thread_idx.x
    row = fx.block_idx.x
    if col < N:  # the bug: N columns (and a row stride of N) baked in, never x's own
        v = fx.generic_load(X.iter + (row * N + col))
        fx.generic_store(Out.iter + (row * N + col), v + 1.0)


@flyc.jit
def cols_baked(x: fx.Tensor, out: fx.Tensor, N: fx.Constexpr[int], stream: fx.Stream = fx.Stream(None)):
    M, _ = x.shape.unpack()
    cols_baked_kernel(x, out, N).launch(grid=(M, 1, 1), block=(THREADS, 1, 1), stream=stream)
