# SPDX-License-Identifier: Apache-2.0
"""Launcher shapes from a trial on upstream FlyDSL builders that flyship binds by parameter name.

* ``scale_stream_first(x, stream, TILE_N, out, alpha)``: the stream and a constexpr come *before* runtime
  parameters. flyship passes every argument by its parameter name, so the order is the launcher's business.
* ``scale_rewrapped(x, out, alpha)``: an entry that re-wraps its tensors with
  ``flyc.from_torch_tensor(t).mark_layout_dynamic()`` before calling the launcher: the wrappers hold the
  caller's own tensors, bound as the op's ``x`` and ``out``.
* ``add_one_64_rows(x, out)``: an entry that passes the launcher a literal row count (``64``), declared in the
  spec as the constant ``Value("m", "64")``.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from rows import add_one_rows
from scale import scale_kernel


@flyc.jit
def scale_stream_first(x: fx.Tensor, stream: fx.Stream, TILE_N: fx.Constexpr[int], out: fx.Tensor,
                       alpha: fx.Float32):
    """out = alpha * x (float32, (M, N), last dim contiguous); stream and TILE_N before out and alpha."""
    M, N = x.shape.unpack()
    grid = M * ((N + TILE_N - 1) // TILE_N)
    scale_kernel(x, out, alpha, TILE_N).launch(grid=(grid, 1, 1), block=(TILE_N, 1, 1), stream=stream)


def scale_rewrapped(x, out, alpha, stream=None):
    """out = alpha * x, the tensors handed to the launcher as FlyDSL tensor arguments with dynamic layouts."""
    xw = flyc.from_torch_tensor(x).mark_layout_dynamic()
    ow = flyc.from_torch_tensor(out).mark_layout_dynamic()
    return scale_stream_first(xw, fx.Stream(stream), 256, ow, alpha)


def add_one_64_rows(x, out):
    """out = x + 1 for a (64, 1024) float32 tensor: the entry passes the row count as a literal."""
    return add_one_rows(x, out, 64, N=1024)
