# SPDX-License-Identifier: Apache-2.0
"""``out = x / alpha`` (float32, (M, N)) behind a builder that returns a plain Python entry point.

Builders in upstream FlyDSL's ``kernels/`` return a wrapper, not the ``@flyc.jit`` launcher: it wraps the
stream, and compiles the launcher under compile hints (here fast-math, which turns the IEEE division into a
reciprocal multiply)::

    divide = build_divide()
    divide(x, out, alpha)            # what the user calls, and what the spec names: entry(build_divide())

Naming ``launch_divide`` directly would build without the hints, so other machine code.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.kernel_function import CompilationContext

TILE_N = 256
FAST_MATH = {"fast_fp_math": True, "unsafe_fp_math": True}


@flyc.kernel
def divide_kernel(X: fx.Tensor, Out: fx.Tensor, alpha: fx.Float32):
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
    rO.store(rX.load() / alpha)
    fx.copy(atom, rO, tO, pred=pred)


@flyc.jit
def launch_divide(x: fx.Tensor, out: fx.Tensor, alpha: fx.Float32, stream: fx.Stream = fx.Stream(None)):
    M, N = x.shape.unpack()
    grid = M * ((N + TILE_N - 1) // TILE_N)
    divide_kernel(x, out, alpha).launch(grid=(grid, 1, 1), block=(TILE_N, 1, 1), stream=stream)


def build_divide():
    """Return the entry point users call: ``divide(x, out, alpha, stream=None)``."""

    def divide(x, out, alpha, stream=None):
        """out = x / alpha (float32), compiled with fast-math."""
        with CompilationContext.compile_hints(FAST_MATH):
            return launch_divide(x, out, alpha, fx.Stream(stream))

    return divide
