# SPDX-License-Identifier: Apache-2.0
"""``out = alpha * x`` for an (M, N) float32 tensor, in the launcher shape many upstream FlyDSL builders use.

Launcher::

    scale(x, out, alpha: fx.Float32, TILE_N: fx.Constexpr[int], stream: fx.Stream)

* ``stream`` has **no default** (flyship passes ``fx.Stream(None)`` while tracing; the loader launches on
  torch's current stream).
* ``alpha`` is a runtime ``fx.Float32``: the spec must declare it ``Scalar("alpha", "float")``.
* ``TILE_N`` is a constexpr: one workgroup of ``TILE_N`` threads covers ``TILE_N`` columns of one row.
* The launcher computes a 1-D grid ``M * ((N + TILE_N - 1) // TILE_N)`` in **32-bit** integers, so the
  guard keeps every intermediate below 2**31 (pattern 11 of issue 9).
* Tails are predicated per element; the last dim must be contiguous (the layout fixes stride 1).
"""

from flyship.compiler.frontends.flydsl import requires

# @fx.struct is missing from FlyDSL 0.1.5 ("flydsl.expr has no attribute struct"); 0.5.0 is the release this
# example is verified with: an older one is refused here, naming both versions, before anything is traced.
requires("0.5.0", "@fx.struct")

import flydsl.compiler as flyc  # noqa: E402
import flydsl.expr as fx  # noqa: E402


@fx.struct
class ScaleConfig:
    """Compile-time configuration as a struct of constexpr fields (no storage: FlyDSL bakes it in)."""

    tile_n: fx.Constexpr[int]


@flyc.kernel
def scale_kernel(X: fx.Tensor, Out: fx.Tensor, alpha: fx.Float32, TILE_N: fx.Constexpr[int]):
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
    rX = fx.make_fragment_like(tX)
    rO = fx.make_fragment_like(tO)
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(tC[i], (M, N))
    fx.copy(atom, tX, rX, pred=pred)
    rO.store(rX.load() * alpha)
    fx.copy(atom, rO, tO, pred=pred)


@flyc.jit
def scale(x: fx.Tensor, out: fx.Tensor, alpha: fx.Float32, TILE_N: fx.Constexpr[int], stream: fx.Stream):
    """out = alpha * x (float32, (M, N), last dim contiguous)."""
    M, N = x.shape.unpack()
    grid = M * ((N + TILE_N - 1) // TILE_N)
    scale_kernel(x, out, alpha, TILE_N).launch(grid=(grid, 1, 1), block=(TILE_N, 1, 1), stream=stream)


@flyc.jit
def scale_cfg(x: fx.Tensor, out: fx.Tensor, alpha: fx.Float32, cfg: ScaleConfig,
              stream: fx.Stream = fx.Stream(None)):
    """out = alpha * x, configured by a constexpr struct (``cfg=ScaleConfig(tile_n=256)``)."""
    M, N = x.shape.unpack()
    grid = M * ((N + cfg.tile_n - 1) // cfg.tile_n)
    scale_kernel(x, out, alpha, cfg.tile_n).launch(grid=(grid, 1, 1), block=(cfg.tile_n, 1, 1), stream=stream)
