# SPDX-License-Identifier: Apache-2.0
"""Row softmax over the last dim of a 2-D (M, N) tensor (FlyDSL 0.5.0).

Launcher::

    softmax(x, out, MAX_N: fx.Constexpr[int] = 8192, VEC: fx.Constexpr[int] = 0,
            stream: fx.Stream = fx.Stream(None))

* out[m, :] = exp(x[m, :] - max(x[m, :])) / sum(exp(x[m, :] - max(x[m, :])))
  (numerically stable; exp computed as exp2((x - max) * log2(e)); all math in f32).
* dtypes: float32, bfloat16, float16 in/out (dtype taken from ``x``; out must match).
* shapes: M >= 1 and 1 <= N <= MAX_N, both dynamic.  MAX_N is a compile-time
  capacity (default 8192): the row is buffered in registers, MAX_N / 256 f32
  values per thread.  N > MAX_N is NOT checked on the device (the columns past
  MAX_N are left unwritten and the result is wrong) -- pick MAX_N >= N.
  Tails (N not a multiple of the chunk) are predicated per element.
* tiling: one row per workgroup, 256 threads (4 waves of 64); grid = (M, 1, 1).
  A row is cut into chunks of 256 * VEC columns; each thread owns VEC
  contiguous elements of each chunk (VEC = 0 means 128 bits: 4 for f32,
  8 for 16-bit types).  The row max and the row sum are reduced across the
  workgroup with ``fx.coop.BlockReduce`` (wave shuffles + LDS).
* Full, 128-bit-aligned chunks use one vector load/store per thread; the
  tail chunk (or a misaligned view) uses per-element predicated accesses.

Backward launcher ``softmax_bwd(dy, y, dx, MAX_N, VEC, stream)``: with ``y = softmax(x)`` and ``dy`` the
gradient of ``y``, ``dx = y * (dy - sum(dy * y))`` per row; the same tiling, one block reduction.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

BLOCK_THREADS = 256
LOG2E = 1.4426950408889634

BlockReduceF32 = fx.coop.BlockReduce[fx.Float32, BLOCK_THREADS]


@flyc.kernel
def softmax_kernel(
    X: fx.Tensor,
    Out: fx.Tensor,
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

    # (1, VEC) values per thread, 256 threads along the row.
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
    dO = fx.flat_divide(Out, tile)
    dC = fx.flat_divide(ident, tile)

    # Wide accesses need VEC-aligned rows (runtime check, uniform per block).
    vec_bytes = VEC * dtype.width // 8
    sx, so = X.stride.unpack()[0], Out.stride.unpack()[0]
    aligned = (((fx.ptrtoint(X.iter) | fx.ptrtoint(Out.iter)) % vec_bytes) == 0) & (((sx | so) % VEC) == 0)

    storage = fx.SharedAllocator().allocate(BlockReduceF32.SharedStorage).peek()

    # ---- pass 1: load the row into registers (masked lanes = -inf), row max
    vals = []
    preds = []
    thread_max = fx.Float32(float("-inf"))
    for c in fx.range_constexpr(n_chunks):
        tX = thr.partition_S(dX[None, None, row, c])
        tC = thr.partition_S(dC[None, None, row, c])
        rX = fx.make_fragment_like(tX)
        pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
        for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
            pred[i] = fx.elem_less(tC[i], (M, N))
        rX.fill(float("-inf"))
        if ((c + 1) * chunk <= N) & aligned:
            fx.copy(vec_atom, tX, rX)
        else:
            if c * chunk < N:
                fx.copy(elem_atom, tX, rX, pred=pred)
        v = rX.load().to(fx.Float32)
        vals.append(v)
        preds.append(pred)
        thread_max = fx.max(thread_max, v.reduce(fx.ReductionOp.MAX))

    row_max = BlockReduceF32(thread_max, fx.ReductionOp.MAX, storage=storage)
    fx.barrier()  # storage is reused by the next reduction

    # ---- pass 2: e = exp(x - max), row sum (masked lanes give exp(-inf) = 0)
    thread_sum = fx.Float32(0.0)
    for c in fx.range_constexpr(n_chunks):
        e = fx.math.exp2((vals[c] - row_max) * LOG2E)
        vals[c] = e
        thread_sum = thread_sum + e.reduce(fx.ReductionOp.ADD)

    row_sum = BlockReduceF32(thread_sum, fx.ReductionOp.ADD, storage=storage)
    inv_sum = 1.0 / row_sum

    # ---- pass 3: normalize, store (predicated tail)
    for c in fx.range_constexpr(n_chunks):
        tO = thr.partition_D(dO[None, None, row, c])
        rO = fx.make_fragment_like(tO)
        rO.store((vals[c] * inv_sum).to(dtype))
        if ((c + 1) * chunk <= N) & aligned:
            fx.copy(vec_atom, rO, tO)
        else:
            if c * chunk < N:
                fx.copy(elem_atom, rO, tO, pred=preds[c])


@flyc.jit
def softmax(
    x: fx.Tensor,
    out: fx.Tensor,
    MAX_N: fx.Constexpr[int] = 8192,
    VEC: fx.Constexpr[int] = 0,
    stream: fx.Stream = fx.Stream(None),
):
    """out = softmax(x, dim=-1).  Input x (M, N); output out (M, N), same dtype."""
    if VEC == 0:
        VEC = 128 // x.dtype.width
    M, N = x.shape.unpack()
    softmax_kernel(x, out, MAX_N, VEC).launch(grid=(M, 1, 1), block=(BLOCK_THREADS, 1, 1), stream=stream)


# ---- backward: dx = y * (dy - sum(dy * y)) per row, with y = softmax(x) the forward's output ----------------


@flyc.kernel
def softmax_bwd_kernel(
    DY: fx.Tensor,
    Y: fx.Tensor,
    DX: fx.Tensor,
    MAX_N: fx.Constexpr[int],
    VEC: fx.Constexpr[int],
):
    tid = fx.thread_idx.x
    row = fx.block_idx.x

    dtype = Y.dtype
    chunk = BLOCK_THREADS * VEC
    n_chunks = (MAX_N + chunk - 1) // chunk

    M, N = Y.shape.unpack()
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))

    elem_atom = fx.make_copy_atom(fx.UniversalCopy(dtype.width), dtype)
    vec_atom = fx.make_copy_atom(fx.UniversalCopy(dtype.width * VEC), dtype)
    tiled_copy = fx.make_tiled_copy_tv(
        elem_atom,
        fx.make_ordered_layout((1, BLOCK_THREADS), order=(1, 0)),
        fx.make_ordered_layout((1, VEC), order=(0, 1)),
    )
    thr = tiled_copy.get_slice(tid)
    tile = (1, chunk)
    dG = fx.flat_divide(DY, tile)
    dY = fx.flat_divide(Y, tile)
    dD = fx.flat_divide(DX, tile)
    dC = fx.flat_divide(ident, tile)

    vec_bytes = VEC * dtype.width // 8
    sg, sy, sd = DY.stride.unpack()[0], Y.stride.unpack()[0], DX.stride.unpack()[0]
    aligned = (((fx.ptrtoint(DY.iter) | fx.ptrtoint(Y.iter) | fx.ptrtoint(DX.iter)) % vec_bytes) == 0) & (
        ((sg | sy | sd) % VEC) == 0)

    storage = fx.SharedAllocator().allocate(BlockReduceF32.SharedStorage).peek()

    # ---- pass 1: load dy and y (masked lanes = 0), thread partial of sum(dy * y)
    gs, ys, preds = [], [], []
    thread_dot = fx.Float32(0.0)
    for c in fx.range_constexpr(n_chunks):
        tG = thr.partition_S(dG[None, None, row, c])
        tY = thr.partition_S(dY[None, None, row, c])
        tC = thr.partition_S(dC[None, None, row, c])
        rG = fx.make_fragment_like(tG)
        rY = fx.make_fragment_like(tY)
        pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
        for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
            pred[i] = fx.elem_less(tC[i], (M, N))
        rG.fill(0.0)
        rY.fill(0.0)
        if ((c + 1) * chunk <= N) & aligned:
            fx.copy(vec_atom, tG, rG)
            fx.copy(vec_atom, tY, rY)
        else:
            if c * chunk < N:
                fx.copy(elem_atom, tG, rG, pred=pred)
                fx.copy(elem_atom, tY, rY, pred=pred)
        g = rG.load().to(fx.Float32)
        y = rY.load().to(fx.Float32)
        gs.append(g)
        ys.append(y)
        preds.append(pred)
        thread_dot = thread_dot + (g * y).reduce(fx.ReductionOp.ADD)

    dot = BlockReduceF32(thread_dot, fx.ReductionOp.ADD, storage=storage)

    # ---- pass 2: dx = y * (dy - dot), store (predicated tail)
    for c in fx.range_constexpr(n_chunks):
        tD = thr.partition_D(dD[None, None, row, c])
        rD = fx.make_fragment_like(tD)
        rD.store((ys[c] * (gs[c] - dot)).to(dtype))
        if ((c + 1) * chunk <= N) & aligned:
            fx.copy(vec_atom, rD, tD)
        else:
            if c * chunk < N:
                fx.copy(elem_atom, rD, tD, pred=preds[c])


@flyc.jit
def softmax_bwd(
    dy: fx.Tensor,
    y: fx.Tensor,
    dx: fx.Tensor,
    MAX_N: fx.Constexpr[int] = 8192,
    VEC: fx.Constexpr[int] = 0,
    stream: fx.Stream = fx.Stream(None),
):
    """dx = y * (dy - sum(dy * y, -1)): the gradient of softmax's input.  dy, y, dx (M, N), one dtype."""
    if VEC == 0:
        VEC = 128 // y.dtype.width
    M, N = y.shape.unpack()
    softmax_bwd_kernel(dy, y, dx, MAX_N, VEC).launch(grid=(M, 1, 1), block=(BLOCK_THREADS, 1, 1), stream=stream)
