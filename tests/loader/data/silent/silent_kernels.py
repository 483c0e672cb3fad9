# SPDX-License-Identifier: Apache-2.0
"""FlyDSL kernels that build, load and pass `flyship verify` on their example, yet compute wrongly beyond it (issue
33's silent cases). ``out = x + 1`` (float32, (M, N)), one workgroup of TILE_N threads per row tile, like rows.py:

* ``wrap_rows``: reads row ``r % 256`` and writes row ``r``: right for the first 256 rows only;
* ``capped_rows``: launches at most 256 rows' workgroups: rows past 256 are never written;
* ``shared_stride``: ``out = x + y`` viewing y with x's layout (one stride for both): right while both share strides.
* ``plus_one``: right everywhere (the control).
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

TILE_N = 64
WRAP = 256


def _tiles(M, N, row, col):
    atom = fx.make_copy_atom(fx.UniversalCopy(32), fx.Float32)
    tiled = fx.make_tiled_copy_tv(atom, fx.make_ordered_layout((1, TILE_N), order=(1, 0)),
                                  fx.make_ordered_layout((1, 1), order=(0, 1)))
    return atom, tiled


@flyc.kernel
def wrap_kernel(X: fx.Tensor, Out: fx.Tensor):
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    M, N = X.shape.unpack()
    tiles_n = (N + TILE_N - 1) // TILE_N
    row, col = bid // tiles_n, bid % tiles_n
    atom, tiled = _tiles(M, N, row, col)
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    tile = tiled.tile_mn
    thr = tiled.get_slice(tid)
    tX = thr.partition_S(fx.flat_divide(X, tile)[None, None, row % WRAP, col])  # the bug: row r reads row r % 256
    tO = thr.partition_D(fx.flat_divide(Out, tile)[None, None, row, col])
    tC = thr.partition_S(fx.flat_divide(ident, tile)[None, None, row, col])
    rX = fx.make_fragment_like(tX)
    rO = fx.make_fragment_like(tO)
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(tC[i], (M, N))
    fx.copy(atom, tX, rX, pred=pred)
    rO.store(rX.load() + 1.0)
    fx.copy(atom, rO, tO, pred=pred)


@flyc.kernel
def plus_one_kernel(X: fx.Tensor, Out: fx.Tensor):
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    M, N = X.shape.unpack()
    tiles_n = (N + TILE_N - 1) // TILE_N
    row, col = bid // tiles_n, bid % tiles_n
    atom, tiled = _tiles(M, N, row, col)
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    tile = tiled.tile_mn
    thr = tiled.get_slice(tid)
    tX = thr.partition_S(fx.flat_divide(X, tile)[None, None, row, col])
    tO = thr.partition_D(fx.flat_divide(Out, tile)[None, None, row, col])
    tC = thr.partition_S(fx.flat_divide(ident, tile)[None, None, row, col])
    rX = fx.make_fragment_like(tX)
    rO = fx.make_fragment_like(tO)
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(tC[i], (M, N))
    fx.copy(atom, tX, rX, pred=pred)
    rO.store(rX.load() + 1.0)
    fx.copy(atom, rO, tO, pred=pred)


@flyc.kernel
def add_kernel(X: fx.Tensor, Y: fx.Tensor, Out: fx.Tensor):
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    M, N = X.shape.unpack()
    tiles_n = (N + TILE_N - 1) // TILE_N
    row, col = bid // tiles_n, bid % tiles_n
    atom, tiled = _tiles(M, N, row, col)
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    tile = tiled.tile_mn
    thr = tiled.get_slice(tid)
    tX = thr.partition_S(fx.flat_divide(X, tile)[None, None, row, col])
    Ys = fx.Tensor(fx.make_view(fx.get_iter(Y), fx.get_layout(X)))  # the bug: y indexed with x's strides
    tY = thr.partition_S(fx.flat_divide(Ys, tile)[None, None, row, col])
    tO = thr.partition_D(fx.flat_divide(Out, tile)[None, None, row, col])
    tC = thr.partition_S(fx.flat_divide(ident, tile)[None, None, row, col])
    rX = fx.make_fragment_like(tX)
    rY = fx.make_fragment_like(tY)
    rO = fx.make_fragment_like(tO)
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(tC[i], (M, N))
    fx.copy(atom, tX, rX, pred=pred)
    fx.copy(atom, tY, rY, pred=pred)
    rO.store(rX.load() + rY.load())
    fx.copy(atom, rO, tO, pred=pred)


@flyc.jit
def wrap_rows(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    M, N = x.shape.unpack()
    wrap_kernel(x, out).launch(grid=(M * ((N + TILE_N - 1) // TILE_N), 1, 1), block=(TILE_N, 1, 1), stream=stream)


@flyc.jit
def capped_rows(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    M, N = x.shape.unpack()
    # the bug: a grid of 256 rows' workgroups whatever M is (the kernel predicates rows >= M)
    plus_one_kernel(x, out).launch(grid=(WRAP * ((N + TILE_N - 1) // TILE_N), 1, 1), block=(TILE_N, 1, 1),
                                   stream=stream)


@flyc.jit
def shared_stride(x: fx.Tensor, y: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    M, N = x.shape.unpack()
    add_kernel(x, y, out).launch(grid=(M * ((N + TILE_N - 1) // TILE_N), 1, 1), block=(TILE_N, 1, 1), stream=stream)


@flyc.jit
def plus_one(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    """The right one: a workgroup per row tile of every row."""
    M, N = x.shape.unpack()
    plus_one_kernel(x, out).launch(grid=(M * ((N + TILE_N - 1) // TILE_N), 1, 1), block=(TILE_N, 1, 1),
                                   stream=stream)
