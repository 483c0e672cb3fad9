# SPDX-License-Identifier: Apache-2.0
"""RMSNorm with a weight (FlyDSL 0.5.0).

Launcher::

    rmsnorm(x, w, out, eps: fx.Float32 = 1e-6, MAX_N: fx.Constexpr[int] = 8192,
            VEC: fx.Constexpr[int] = 0, stream: fx.Stream = fx.Stream(None))

* out[m, :] = x[m, :] * rsqrt(mean(x[m, :]^2) + eps) * w   (all math in f32)
* ``eps`` is a RUNTIME f32 scalar (a kernel argument; a Python float works).
* dtypes: float32, bfloat16, float16; x, w, out share the dtype of ``x``.
* shapes: x, out (M, N) with 1 <= N <= MAX_N (dynamic M, N); w (N,) contiguous.
  MAX_N is a compile-time register capacity (default 8192, MAX_N / 256 f32
  values per thread); N > MAX_N is NOT checked on the device.  Tails are
  predicated per element.
* tiling: one row per workgroup of 256 threads (4 waves); grid = (M, 1, 1).
  A row is cut into chunks of 256 * VEC columns, VEC contiguous elements per
  thread per chunk (VEC = 0 means 128 bits: 4 for f32, 8 for 16-bit types).
  sum(x^2) is reduced across the workgroup with ``fx.coop.BlockReduce``.
* Full, 128-bit-aligned chunks use vector loads/stores; the tail chunk (or a
  misaligned view) uses per-element predicated accesses.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

BLOCK_THREADS = 256

BlockReduceF32 = fx.coop.BlockReduce[fx.Float32, BLOCK_THREADS]


@flyc.kernel
def rmsnorm_kernel(
    X: fx.Tensor,
    W: fx.Tensor,
    Out: fx.Tensor,
    eps: fx.Float32,
    MAX_N: fx.Constexpr[int],
    VEC: fx.Constexpr[int],
):
    tid = fx.thread_idx.x
    row = fx.block_idx.x

    dtype = X.dtype
    chunk = BLOCK_THREADS * VEC
    n_chunks = (MAX_N + chunk - 1) // chunk

    M, N = X.shape.unpack()
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    # w broadcast along the rows: a (M, N) view with row stride 0.
    Wb = fx.make_view(W.iter, fx.make_layout((M, N), (0, 1)))

    elem_atom = fx.make_copy_atom(fx.UniversalCopy(dtype.width), dtype)
    vec_atom = fx.make_copy_atom(fx.UniversalCopy(dtype.width * VEC), dtype)
    tiled_copy = fx.make_tiled_copy_tv(
        elem_atom,
        fx.make_ordered_layout((1, BLOCK_THREADS), order=(1, 0)),
        fx.make_ordered_layout((1, VEC), order=(0, 1)),
    )
    thr = tiled_copy.get_slice(tid)
    tile = (1, chunk)
    dX = fx.flat_divide(X, tile)
    dW = fx.flat_divide(Wb, tile)
    dO = fx.flat_divide(Out, tile)
    dC = fx.flat_divide(ident, tile)

    vec_bytes = VEC * dtype.width // 8
    sx, so = X.stride.unpack()[0], Out.stride.unpack()[0]
    addr_bits = fx.ptrtoint(X.iter) | fx.ptrtoint(W.iter) | fx.ptrtoint(Out.iter)
    aligned = ((addr_bits % vec_bytes) == 0) & (((sx | so) % VEC) == 0)

    storage = fx.SharedAllocator().allocate(BlockReduceF32.SharedStorage).peek()

    # ---- pass 1: load the row (masked lanes = 0) and sum of squares
    xs = []
    preds = []
    thread_ss = fx.Float32(0.0)
    for c in fx.range_constexpr(n_chunks):
        tX = thr.partition_S(dX[None, None, row, c])
        tC = thr.partition_S(dC[None, None, row, c])
        rX = fx.make_fragment_like(tX)
        pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
        for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
            pred[i] = fx.elem_less(tC[i], (M, N))
        rX.fill(0.0)
        if ((c + 1) * chunk <= N) & aligned:
            fx.copy(vec_atom, tX, rX)
        else:
            if c * chunk < N:
                fx.copy(elem_atom, tX, rX, pred=pred)
        v = rX.load().to(fx.Float32)
        xs.append(v)
        preds.append(pred)
        thread_ss = thread_ss + (v * v).reduce(fx.ReductionOp.ADD)

    ss = BlockReduceF32(thread_ss, fx.ReductionOp.ADD, storage=storage)
    rstd = fx.math.rsqrt(ss / N.to(fx.Float32) + eps)

    # ---- pass 2: scale by rstd and w, store (predicated tail)
    for c in fx.range_constexpr(n_chunks):
        tW = thr.partition_S(dW[None, None, row, c])
        tO = thr.partition_D(dO[None, None, row, c])
        rW = fx.make_fragment_like(tW)
        rO = fx.make_fragment_like(tO)
        rW.fill(0.0)
        full = ((c + 1) * chunk <= N) & aligned
        if full:
            fx.copy(vec_atom, tW, rW)
        else:
            if c * chunk < N:
                fx.copy(elem_atom, tW, rW, pred=preds[c])
        rO.store((xs[c] * rstd * rW.load().to(fx.Float32)).to(dtype))
        if full:
            fx.copy(vec_atom, rO, tO)
        else:
            if c * chunk < N:
                fx.copy(elem_atom, rO, tO, pred=preds[c])


@flyc.jit
def rmsnorm(
    x: fx.Tensor,
    w: fx.Tensor,
    out: fx.Tensor,
    eps: fx.Float32 = 1e-6,
    MAX_N: fx.Constexpr[int] = 8192,
    VEC: fx.Constexpr[int] = 0,
    stream: fx.Stream = fx.Stream(None),
):
    """out = rmsnorm(x) * w.  Inputs x (M, N), w (N,); output out (M, N); eps runtime f32."""
    if VEC == 0:
        VEC = 128 // x.dtype.width
    M, N = x.shape.unpack()
    rmsnorm_kernel(x, w, out, eps, MAX_N, VEC).launch(grid=(M, 1, 1), block=(BLOCK_THREADS, 1, 1), stream=stream)
