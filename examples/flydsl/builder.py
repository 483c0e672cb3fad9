# SPDX-License-Identifier: Apache-2.0
"""``out = x / alpha`` behind a builder of the shape upstream FlyDSL's RoPE + KV cache and flash attention
builders have: the ``@flyc.jit`` launcher is defined *inside* the builder (it closes over the builder's
parameters) and the builder returns a plain Python function around it::

    divide = build_closure_divide(tile_n=256)
    divide(x, out, alpha)        # what the user calls, and what the spec names: kernel=build_closure_divide()

flyc-build accepts such a function as it is (it finds the launcher in the function's closure) and calls it as
the user does, like an ``entry()``.

``build_dispatch_divide`` has the shape of upstream's flash attention builder: the returned function takes
``*args`` and picks one of two inner launchers from the call's sizes (there: the sequence length; here: the row
width). flyc-build calls it as the user does, so a spec builds the launcher its example picks; the spec's
constraints pin the sizes that pick it (``"x.shape[1] <= 64"``), so a call of the other width never reaches it.
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


def _tiled_launcher(tile_n: int):
    """A ``@flyc.jit`` launcher of ``out = x / alpha`` with one ``tile_n``-thread block per ``tile_n`` columns."""

    @flyc.kernel
    def divide_tile(X: fx.Tensor, Out: fx.Tensor, alpha: fx.Float32):
        atom = fx.make_copy_atom(fx.UniversalCopy(32), fx.Float32)
        tiled = fx.make_tiled_copy_tv(atom, fx.make_ordered_layout((1, tile_n), order=(1, 0)),
                                      fx.make_ordered_layout((1, 1), order=(0, 1)))
        M, N = X.shape.unpack()
        tiles_n = (N + tile_n - 1) // tile_n
        row, col = fx.block_idx.x // tiles_n, fx.block_idx.x % tiles_n
        ident = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
        thr = tiled.get_slice(fx.thread_idx.x)
        tX = thr.partition_S(fx.flat_divide(X, tiled.tile_mn)[None, None, row, col])
        tO = thr.partition_D(fx.flat_divide(Out, tiled.tile_mn)[None, None, row, col])
        tC = thr.partition_S(fx.flat_divide(ident, tiled.tile_mn)[None, None, row, col])
        rX, rO = fx.make_fragment_like(tX), fx.make_fragment_like(tO)
        pred = fx.make_fragment_like(tC, dtype=fx.Boolean)
        for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
            pred[i] = fx.elem_less(tC[i], (M, N))
        fx.copy(atom, tX, rX, pred=pred)
        rO.store(rX.load() / alpha)
        fx.copy(atom, rO, tO, pred=pred)

    @flyc.jit
    def launch(x: fx.Tensor, out: fx.Tensor, alpha: fx.Float32, stream: fx.Stream = fx.Stream(None)):
        M, N = x.shape.unpack()
        divide_tile(x, out, alpha).launch(grid=(M * ((N + tile_n - 1) // tile_n), 1, 1), block=(tile_n, 1, 1),
                                          stream=stream)

    return launch


def build_dispatch_divide(narrow_n: int = 64, wide_n: int = 256):
    """Return ``divide(*args, stream=None)``: rows of at most ``narrow_n`` columns run ``narrow_n``-thread blocks
    (one per row, no idle threads), wider rows ``wide_n``-thread ones; the arguments pass through unread but
    for the row width."""
    narrow, wide = _tiled_launcher(narrow_n), _tiled_launcher(wide_n)

    def divide(*args, stream=None):
        """out = x / alpha (float32), args = (x, out, alpha)."""
        launch = narrow if args[0].shape[1] <= narrow_n else wide
        return launch(*args, fx.Stream(stream))

    return divide
