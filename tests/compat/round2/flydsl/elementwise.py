# SPDX-License-Identifier: Apache-2.0
"""2-D elementwise add ``out = x + y`` for (M, N) tensors (FlyDSL 0.5.0).

Launcher::

    add(x, y, out, VEC: fx.Constexpr[int] = 0, stream: fx.Stream = fx.Stream(None))

* dtypes: float32, bfloat16, float16 (taken from ``x``; x, y, out share a dtype).
* shapes: any M >= 1, N >= 1 (dynamic; no tile-multiple requirement).  Tails
  are predicated per element, so a partial tile never reads or writes past
  (M, N).  Row stride is dynamic (the last dim must be contiguous).
* tiling: a workgroup of 256 threads (laid out 8 x 32, row-major over N)
  covers a tile of 8 rows x (32 * VEC) columns; each thread owns VEC contiguous
  elements of one row.  grid = (ceil(M / 8), ceil(N / (32 * VEC)), 1).
  VEC = 0 (default) means 128 bits per thread: 4 for f32, 8 for bf16/f16.
* Interior tiles whose base pointers and row strides are VEC-aligned (runtime
  check) use one 128-bit load/store per operand; border tiles (or misaligned
  views) use per-element predicated scalar loads/stores.
* The add is computed in float32 for 16-bit inputs and rounded back.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

THREADS_M = 8
THREADS_N = 32
BLOCK_THREADS = THREADS_M * THREADS_N


def _make_tiled_copy(dtype, vec: int):
    # One copy atom per element (bit width of the dtype) so that every
    # element carries its own bounds predicate; a thread handles VEC
    # contiguous elements of one row.
    atom = fx.make_copy_atom(fx.UniversalCopy(dtype.width), dtype)
    return fx.make_tiled_copy_tv(
        atom,
        fx.make_ordered_layout((THREADS_M, THREADS_N), order=(1, 0)),
        fx.make_ordered_layout((1, vec), order=(0, 1)),
    )


@flyc.kernel
def add_kernel(
    X: fx.Tensor,
    Y: fx.Tensor,
    Out: fx.Tensor,
    VEC: fx.Constexpr[int],
):
    tid = fx.thread_idx.x
    bid_m = fx.block_idx.x
    bid_n = fx.block_idx.y

    dtype = X.dtype
    tiled_copy = _make_tiled_copy(dtype, VEC)
    tile_mn = tiled_copy.tile_mn

    M, N = X.shape.unpack()
    # Coordinate tensor: element (m, n) holds the coordinate (m, n).
    ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))

    gX = fx.flat_divide(X, tile_mn)[None, None, bid_m, bid_n]
    gY = fx.flat_divide(Y, tile_mn)[None, None, bid_m, bid_n]
    gO = fx.flat_divide(Out, tile_mn)[None, None, bid_m, bid_n]
    gC = fx.flat_divide(ident, tile_mn)[None, None, bid_m, bid_n]

    thr = tiled_copy.get_slice(tid)
    tX = thr.partition_S(gX)
    tY = thr.partition_S(gY)
    tO = thr.partition_D(gO)
    tC = thr.partition_S(gC)

    rX = fx.make_fragment_like(tX)
    rY = fx.make_fragment_like(tY)
    rO = fx.make_fragment_like(tO)
    pred = fx.make_fragment_like(tC, dtype=fx.Boolean)

    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(tC[i], (M, N))

    atom = fx.make_copy_atom(fx.UniversalCopy(dtype.width), dtype)
    tile_m, tile_n = tile_mn.unpack()
    # Fast path: the whole tile is in bounds and every thread's VEC-element
    # chunk is VEC-aligned in memory (base pointers and row strides), so one
    # wide vector load/store per operand replaces VEC predicated scalar ones.
    vec_bytes = VEC * dtype.width // 8
    addr_bits = fx.ptrtoint(X.iter) | fx.ptrtoint(Y.iter) | fx.ptrtoint(Out.iter)
    sx, sy, so = X.stride.unpack()[0], Y.stride.unpack()[0], Out.stride.unpack()[0]
    strides_ok = ((sx | sy | so) % VEC) == 0
    aligned = ((addr_bits % vec_bytes) == 0) & strides_ok
    interior = ((bid_m + 1) * tile_m <= M) & ((bid_n + 1) * tile_n <= N) & aligned
    vatom = fx.make_copy_atom(fx.UniversalCopy(dtype.width * VEC), dtype)
    if interior:
        fx.copy(vatom, tX, rX)
        fx.copy(vatom, tY, rY)
        s = rX.load().to(fx.Float32) + rY.load().to(fx.Float32)
        rO.store(s.to(dtype))
        fx.copy(vatom, rO, tO)
    else:
        fx.copy(atom, tX, rX, pred=pred)
        fx.copy(atom, tY, rY, pred=pred)
        s = rX.load().to(fx.Float32) + rY.load().to(fx.Float32)
        rO.store(s.to(dtype))
        fx.copy(atom, rO, tO, pred=pred)


@flyc.jit
def add(
    x: fx.Tensor,
    y: fx.Tensor,
    out: fx.Tensor,
    VEC: fx.Constexpr[int] = 0,
    stream: fx.Stream = fx.Stream(None),
):
    """out = x + y.  Inputs x, y; output out.  All (M, N), same dtype."""
    if VEC == 0:
        VEC = 128 // x.dtype.width
    M, N = x.shape.unpack()
    tile_m = THREADS_M
    tile_n = THREADS_N * VEC
    grid_m = (M + tile_m - 1) // tile_m
    grid_n = (N + tile_n - 1) // tile_n
    add_kernel(x, y, out, VEC).launch(grid=(grid_m, grid_n, 1), block=(BLOCK_THREADS, 1, 1), stream=stream)
