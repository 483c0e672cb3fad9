# SPDX-License-Identifier: Apache-2.0
"""Fused residual add + RMSNorm that writes the residual in place (FlyDSL 0.5.0): issue 9, pattern 7.

Launcher::

    fused_add_rmsnorm(x, residual, w, out, eps: fx.Float32 = 1e-6, MAX_N: fx.Constexpr[int] = 4096,
                      stream: fx.Stream = fx.Stream(None))

* ``residual[m, :] += x[m, :]`` is stored back into ``residual`` (the residual stream a transformer block
  carries on with), and ``out[m, :] = h * rsqrt(mean(h^2) + eps) * w`` with ``h`` the new residual row is a
  fresh output. The spec declares ``Tensor("residual", rank=2, mutable=True)``: the torch schema says
  ``Tensor(a!) residual`` and no output is made for it.
* float32; x, residual, out (M, N) with 1 <= N <= MAX_N (dynamic M, N), last dim contiguous; w (N,).
* One row per workgroup of 256 threads, each thread holding MAX_N / 256 values of the row; the sum of squares
  is reduced across the workgroup with ``fx.coop.BlockReduce``. Tails are predicated per element.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

THREADS = 256

BlockSum = fx.coop.BlockReduce[fx.Float32, THREADS]


@flyc.kernel
def fused_add_rmsnorm_kernel(X: fx.Tensor, R: fx.Tensor, W: fx.Tensor, Out: fx.Tensor, eps: fx.Float32,
                             MAX_N: fx.Constexpr[int]):
    tid = fx.thread_idx.x
    row = fx.block_idx.x
    M, N = X.shape.unpack()
    atom = fx.make_copy_atom(fx.UniversalCopy(32), fx.Float32)
    tiled = fx.make_tiled_copy_tv(atom, fx.make_ordered_layout((1, THREADS), order=(1, 0)),
                                  fx.make_ordered_layout((1, 1), order=(0, 1)))
    thr = tiled.get_slice(tid)
    tile = (1, THREADS)
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    Wb = fx.make_view(W.iter, fx.make_layout((M, N), (0, 1)))  # w broadcast along the rows
    dX, dR, dW = fx.flat_divide(X, tile), fx.flat_divide(R, tile), fx.flat_divide(Wb, tile)
    dO, dC = fx.flat_divide(Out, tile), fx.flat_divide(ident, tile)
    storage = fx.SharedAllocator().allocate(BlockSum.SharedStorage).peek()

    # pass 1: h = x + residual, written back into residual; sum of h^2
    hs, preds = [], []
    ss = fx.Float32(0.0)
    for c in fx.range_constexpr((MAX_N + THREADS - 1) // THREADS):
        tX = thr.partition_S(dX[None, None, row, c])
        tR = thr.partition_D(dR[None, None, row, c])
        tC = thr.partition_S(dC[None, None, row, c])
        rX, rR = fx.make_fragment_like(tX), fx.make_fragment_like(tR)
        pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
        for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
            pred[i] = fx.elem_less(tC[i], (M, N))
        rX.fill(0.0)
        rR.fill(0.0)
        fx.copy(atom, tX, rX, pred=pred)
        fx.copy(atom, tR, rR, pred=pred)
        h = rX.load() + rR.load()
        rR.store(h)
        fx.copy(atom, rR, tR, pred=pred)  # the in-place write
        hs.append(h)
        preds.append(pred)
        ss = ss + (h * h).reduce(fx.ReductionOp.ADD)
    total = BlockSum(ss, fx.ReductionOp.ADD, storage=storage)
    rstd = fx.math.rsqrt(total / N.to(fx.Float32) + eps)

    # pass 2: out = h * rstd * w
    for c in fx.range_constexpr((MAX_N + THREADS - 1) // THREADS):
        tW = thr.partition_S(dW[None, None, row, c])
        tO = thr.partition_D(dO[None, None, row, c])
        rW, rO = fx.make_fragment_like(tW), fx.make_fragment_like(tO)
        rW.fill(0.0)
        fx.copy(atom, tW, rW, pred=preds[c])
        rO.store(hs[c] * rstd * rW.load())
        fx.copy(atom, rO, tO, pred=preds[c])


@flyc.jit
def fused_add_rmsnorm(x: fx.Tensor, residual: fx.Tensor, w: fx.Tensor, out: fx.Tensor, eps: fx.Float32 = 1e-6,
                      MAX_N: fx.Constexpr[int] = 4096, stream: fx.Stream = fx.Stream(None)):
    """residual += x (in place); out = rmsnorm(residual) * w.  float32, x/residual/out (M, N), w (N,)."""
    M, N = x.shape.unpack()
    fused_add_rmsnorm_kernel(x, residual, w, out, eps, MAX_N).launch(grid=(M, 1, 1), block=(THREADS, 1, 1),
                                                                     stream=stream)


@flyc.kernel
def add_into_kernel(X: fx.Tensor, Y: fx.Tensor, Out: fx.Tensor):
    """out = x + y, and (the mistake the build catches) y = x as well: a store through an input."""
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    M, N = X.shape.unpack()
    atom = fx.make_copy_atom(fx.UniversalCopy(32), fx.Float32)
    tiled = fx.make_tiled_copy_tv(atom, fx.make_ordered_layout((1, THREADS), order=(1, 0)),
                                  fx.make_ordered_layout((1, 1), order=(0, 1)))
    thr = tiled.get_slice(tid)
    tile = (1, THREADS)
    tiles_n = (N + THREADS - 1) // THREADS
    row, col = bid // tiles_n, bid % tiles_n
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    tX = thr.partition_S(fx.flat_divide(X, tile)[None, None, row, col])
    tY = thr.partition_D(fx.flat_divide(Y, tile)[None, None, row, col])
    tO = thr.partition_D(fx.flat_divide(Out, tile)[None, None, row, col])
    tC = thr.partition_S(fx.flat_divide(ident, tile)[None, None, row, col])
    rX, rY, rO = fx.make_fragment_like(tX), fx.make_fragment_like(tY), fx.make_fragment_like(tO)
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(tC[i], (M, N))
    fx.copy(atom, tX, rX, pred=pred)
    fx.copy(atom, tY, rY, pred=pred)
    rO.store(rX.load() + rY.load())
    fx.copy(atom, rO, tO, pred=pred)
    fx.copy(atom, rX, tY, pred=pred)


@flyc.jit
def add_into(x: fx.Tensor, y: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    """out = x + y, and y = x: it writes its input y (for the build-time write check's test)."""
    M, N = x.shape.unpack()
    add_into_kernel(x, y, out).launch(grid=(M * ((N + THREADS - 1) // THREADS), 1, 1), block=(THREADS, 1, 1),
                                      stream=stream)
