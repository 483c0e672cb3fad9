# SPDX-License-Identifier: Apache-2.0
"""``out = x / alpha`` behind a builder of the shape upstream FlyDSL's RoPE + KV cache and flash attention
builders have: the ``@flyc.jit`` launcher is defined *inside* the builder (it closes over the builder's
parameters) and the builder returns a plain Python function around it::

    divide = build_closure_divide(tile_n=256)
    divide(x, out, alpha)        # what the user calls, and what the spec names: kernel=build_closure_divide()

flyc-build accepts such a function as it is (it finds the launcher in the function's closure) and calls it as
the user does, like an ``entry()``.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

from divide import divide_kernel


def build_closure_divide(tile_n: int = 256):
    """Return the entry point users call: ``divide(x, out, alpha, stream=None)``; the launcher is built per call
    of the builder (a different ``tile_n`` is another launcher)."""

    @flyc.jit
    def _launch(x: fx.Tensor, out: fx.Tensor, alpha: fx.Float32, stream: fx.Stream = fx.Stream(None)):
        M, N = x.shape.unpack()
        grid = M * ((N + tile_n - 1) // tile_n)
        divide_kernel(x, out, alpha).launch(grid=(grid, 1, 1), block=(tile_n, 1, 1), stream=stream)

    def divide(x, out, alpha, stream=None):
        """out = x / alpha (float32)."""
        return _launch(x, out, alpha, fx.Stream(stream))

    return divide
