# SPDX-License-Identifier: Apache-2.0
"""Issue 33's mixed-dtype silent case: ``out = x + b`` with x bfloat16 and b float32, where the kernel copies b with
x's 16-bit copy atom (reads b's float32 bytes as bfloat16 pairs). It builds and loads; the emulated device refuses
it on its first case."""

import flydsl.compiler as flyc
import flydsl.expr as fx

TILE_N = 64


@flyc.kernel
def mixed_kernel(X: fx.Tensor, B: fx.Tensor, Out: fx.Tensor):
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    M, N = X.shape.unpack()
    tiles_n = (N + TILE_N - 1) // TILE_N
    row, col = bid // tiles_n, bid % tiles_n
    atom = fx.make_copy_atom(fx.UniversalCopy(16), X.dtype)  # the bug: B (float32) copied with x's 16-bit atom
    tiled = fx.make_tiled_copy_tv(atom, fx.make_ordered_layout((1, TILE_N), order=(1, 0)),
                                  fx.make_ordered_layout((1, 1), order=(0, 1)))
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    tile = tiled.tile_mn
    thr = tiled.get_slice(tid)
    tX = thr.partition_S(fx.flat_divide(X, tile)[None, None, row, col])
    Bv = fx.Tensor(fx.make_view(fx.get_iter(B), fx.get_layout(X)))
    tB = thr.partition_S(fx.flat_divide(Bv, tile)[None, None, row, col])
    tO = thr.partition_D(fx.flat_divide(Out, tile)[None, None, row, col])
    tC = thr.partition_S(fx.flat_divide(ident, tile)[None, None, row, col])
    rX = fx.make_fragment_like(tX)
    rB = fx.make_fragment_like(tX)
    rO = fx.make_fragment_like(tO)
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(tC[i], (M, N))
    fx.copy(atom, tX, rX, pred=pred)
    fx.copy(atom, tB, rB, pred=pred)
    rO.store(rX.load() + rB.load())
    fx.copy(atom, rO, tO, pred=pred)


@flyc.jit
def bias_add(x: fx.Tensor, b: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    M, N = x.shape.unpack()
    mixed_kernel(x, b, out).launch(grid=(M * ((N + TILE_N - 1) // TILE_N), 1, 1), block=(TILE_N, 1, 1), stream=stream)
