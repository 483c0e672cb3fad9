# SPDX-License-Identifier: Apache-2.0
"""``out = alpha * x + 1`` for an (M, N) float32 tensor in two launches through a workspace (FlyDSL 0.5.0).

Launcher::

    scale_add_one(x, tmp, out, alpha: fx.Float32, TILE_N: fx.Constexpr[int], stream: fx.Stream = fx.Stream(None))

One ``@flyc.jit`` launcher that launches two ``@flyc.kernel`` kernels in sequence, as upstream multi-phase
builders do (split-K GEMMs, two-pass reductions, sorts):

1. ``scale_phase`` writes ``tmp = alpha * x``;
2. ``add_one_phase`` reads ``tmp`` and writes ``out = tmp + 1``.

``tmp`` is a workspace: the caller allocates it per call (flyship's loader does, from torch's caching
allocator, before the first launch), never part of the op's schema. Both grids are
``M * ceil(N / TILE_N)`` workgroups of ``TILE_N`` threads, one row tile each; tails are predicated per element;
the last dim must be contiguous (the layout fixes stride 1).
"""

import flydsl.compiler as flyc
import flydsl.expr as fx


def _row_tile(X, Out, TILE_N):
    """Thread-level views of this workgroup's row tile of X and Out, and the bounds predicate."""
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    atom = fx.make_copy_atom(fx.UniversalCopy(32), fx.Float32)
    tiled = fx.make_tiled_copy_tv(atom, fx.make_ordered_layout((1, TILE_N), order=(1, 0)),
                                  fx.make_ordered_layout((1, 1), order=(0, 1)))
    M, N = X.shape.unpack()
    tiles_n = (N + TILE_N - 1) // TILE_N
    row, col = bid // tiles_n, bid % tiles_n
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    tile = tiled.tile_mn
    thr = tiled.get_slice(tid)
    tX = thr.partition_S(fx.flat_divide(X, tile)[None, None, row, col])
    tO = thr.partition_D(fx.flat_divide(Out, tile)[None, None, row, col])
    tC = thr.partition_S(fx.flat_divide(ident, tile)[None, None, row, col])
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(tC[i], (M, N))
    return atom, tX, tO, pred


@flyc.kernel
def scale_phase(X: fx.Tensor, Tmp: fx.Tensor, alpha: fx.Float32, TILE_N: fx.Constexpr[int]):
    atom, tX, tT, pred = _row_tile(X, Tmp, TILE_N)
    rX = fx.make_fragment_like(tX)
    rT = fx.make_fragment_like(tT)
    fx.copy(atom, tX, rX, pred=pred)
    rT.store(rX.load() * alpha)
    fx.copy(atom, rT, tT, pred=pred)


@flyc.kernel
def add_one_phase(Tmp: fx.Tensor, Out: fx.Tensor, TILE_N: fx.Constexpr[int]):
    atom, tT, tO, pred = _row_tile(Tmp, Out, TILE_N)
    rT = fx.make_fragment_like(tT)
    rO = fx.make_fragment_like(tO)
    fx.copy(atom, tT, rT, pred=pred)
    rO.store(rT.load() + 1.0)
    fx.copy(atom, rO, tO, pred=pred)


@flyc.jit
def scale_add_one(x: fx.Tensor, tmp: fx.Tensor, out: fx.Tensor, alpha: fx.Float32, TILE_N: fx.Constexpr[int],
                  stream: fx.Stream = fx.Stream(None)):
    """out = alpha * x + 1 (float32, (M, N), last dim contiguous), through the workspace tmp (x's shape)."""
    M, N = x.shape.unpack()
    grid = M * ((N + TILE_N - 1) // TILE_N)
    scale_phase(x, tmp, alpha, TILE_N).launch(grid=(grid, 1, 1), block=(TILE_N, 1, 1), stream=stream)
    add_one_phase(tmp, out, TILE_N).launch(grid=(grid, 1, 1), block=(TILE_N, 1, 1), stream=stream)
