# SPDX-License-Identifier: Apache-2.0
"""``out = alpha * x`` for an (M, N) float tensor, staged through LDS: a block of ``ROWS`` rows of
``TILE_N`` columns goes global -> registers -> LDS -> registers -> global, in x's dtype.

Launcher::

    staged_scale(x, out, alpha: fx.Float32, ROWS: fx.Constexpr[int], stream: fx.Stream = fx.Stream(None))

The LDS buffer is ``ROWS * TILE_N`` elements of x's dtype, so ``ROWS`` is what a target's LDS budget decides:
for float32, 64 rows (64 KiB) fit gfx942's 64 KiB per workgroup and gfx950's 160 KiB; 80 rows (80 KiB) fit
gfx950 only. The
element type is x's (16- or 32-bit floats: FlyDSL 0.5.0 copies fp8 tensors but does not lower ``.to(fx.Float32)``
of fp8 values; dequant_fp8.py converts fp8 with the target's own instruction instead).
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

TILE_N = 256


@flyc.kernel
def staged_scale_kernel(X: fx.Tensor, Out: fx.Tensor, alpha: fx.Float32, ROWS: fx.Constexpr[int]):
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    dtype = X.element_type
    atom = fx.make_copy_atom(fx.UniversalCopy(dtype.width), dtype)
    tiled = fx.make_tiled_copy_tv(atom, fx.make_ordered_layout((1, TILE_N), order=(1, 0)),
                                  fx.make_ordered_layout((1, 1), order=(0, 1)))
    M, N = X.shape.unpack()
    tiles_n = (N + TILE_N - 1) // TILE_N
    row0, col = (bid // tiles_n) * ROWS, bid % tiles_n
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    lds = fx.SharedAllocator().allocate(fx.Array[dtype, ROWS * TILE_N, 16]).peek()
    stage = lds.view(fx.make_layout((ROWS, TILE_N), (TILE_N, 1)))
    tile = tiled.tile_mn
    thr = tiled.get_slice(tid)
    for r in fx.range_constexpr(ROWS):
        tX = thr.partition_S(fx.flat_divide(X, tile)[None, None, row0 + r, col])
        tC = thr.partition_S(fx.flat_divide(ident, tile)[None, None, row0 + r, col])
        tS = thr.partition_D(fx.flat_divide(stage, tile)[None, None, r, 0])
        rX = fx.make_fragment_like(tX)
        pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
        for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
            pred[i] = fx.elem_less(tC[i], (M, N))
        fx.copy(atom, tX, rX, pred=pred)
        fx.copy(atom, rX, tS)
    fx.barrier()
    for r in fx.range_constexpr(ROWS):
        tS = thr.partition_S(fx.flat_divide(stage, tile)[None, None, ROWS - 1 - r, 0])
        tO = thr.partition_D(fx.flat_divide(Out, tile)[None, None, row0 + ROWS - 1 - r, col])
        tC = thr.partition_S(fx.flat_divide(ident, tile)[None, None, row0 + ROWS - 1 - r, col])
        rS = fx.make_fragment_like(tS)
        rO = fx.make_fragment_like(tO)
        pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
        for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
            pred[i] = fx.elem_less(tC[i], (M, N))
        fx.copy(atom, tS, rS)
        rO.store((rS.load().to(fx.Float32) * alpha).to(dtype))
        fx.copy(atom, rO, tO, pred=pred)


@flyc.jit
def staged_scale(x: fx.Tensor, out: fx.Tensor, alpha: fx.Float32, ROWS: fx.Constexpr[int],
                 stream: fx.Stream = fx.Stream(None)):
    """out = alpha * x ((M, N), last dim contiguous), staged through ROWS * TILE_N elements of LDS."""
    M, N = x.shape.unpack()
    grid = ((M + ROWS - 1) // ROWS) * ((N + TILE_N - 1) // TILE_N)
    staged_scale_kernel(x, out, alpha, ROWS).launch(grid=(grid, 1, 1), block=(TILE_N, 1, 1), stream=stream)
