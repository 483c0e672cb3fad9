# SPDX-License-Identifier: Apache-2.0
"""Column sums by atomic accumulation ``out[n] = sum_m x[m, n]`` for a float32 (M, N) tensor (FlyDSL 0.5.0).

Launcher::

    colsum(x, out, stream: fx.Stream = fx.Stream(None))

* x (M, N) float32, row stride dynamic (the last dim contiguous); out (N,) float32.
* One workgroup of 256 threads per (row, 256-column tile): grid = (M, ceil(N / 256), 1). Each thread loads one
  element (predicated on the column) and adds it into ``out[n]`` with a global atomic add, so every row's
  workgroups accumulate into the same output: **out must start from zeros**. The op declares
  ``Output("out", ..., zero=True)`` and the loader allocates it zero-filled; without it flyc-build refuses the
  kernel (its LLVM IR shows an ``atomicrmw fadd`` through the output's pointer).
* The order of the adds is not fixed, so results match a sequential sum to float32 rounding only.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

TILE_N = 256


@flyc.kernel
def colsum_kernel(X: fx.Tensor, Out: fx.Tensor):
    tid = fx.thread_idx.x
    row = fx.block_idx.x
    col = fx.block_idx.y * TILE_N + tid
    M, N = X.shape.unpack()
    if col < N:
        v = fx.generic_load(X.iter + (row * X.stride.unpack()[0] + col))
        fx.atomic_add(Out.iter + col, v)


@flyc.jit
def colsum(x: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    """out[n] = sum over m of x[m, n] (float32); out must start from zeros."""
    M, N = x.shape.unpack()
    colsum_kernel(x, out).launch(grid=(M, (N + TILE_N - 1) // TILE_N, 1), block=(TILE_N, 1, 1), stream=stream)
