# SPDX-License-Identifier: Apache-2.0
"""``out = alpha * x + 1`` for an (M, N) float32 tensor as an entry point that calls two ``@flyc.jit``
launchers in sequence (FlyDSL 0.5.0).

twophase.py launches both phases from one launcher. Upstream builders as often give each phase a launcher
of its own and return a plain Python function that allocates the buffer between them and calls both::

    scale_add_one_split(x, out, alpha)    # tmp = empty_like(x); scale_launcher(x, tmp, alpha);
                                          # add_one_launcher(tmp, out)

Each launcher call is its own FlyDSL compile, so its own code object: the spec names the entry
(``entry(scale_add_one_split)``), declares ``tmp`` a ``Workspace`` and flyship launches both kernels per
call, ``tmp`` allocated by the loader and passed to both. ``scale_and_add_one`` feeds phase 2 a declared
output of phase 1 instead (``scaled``, returned too).

The kernels are twophase.py's (one row tile of ``TILE_N`` columns per workgroup, tails predicated); the
last dim must be contiguous (the layout fixes stride 1).
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from twophase import add_one_phase, scale_phase

TILE_N = 256


def _grid(x):
    M, N = x.shape.unpack()
    return (M * ((N + TILE_N - 1) // TILE_N), 1, 1)


@flyc.jit
def scale_launcher(x: fx.Tensor, tmp: fx.Tensor, alpha: fx.Float32, stream: fx.Stream = fx.Stream(None)):
    """Phase 1: tmp = alpha * x."""
    scale_phase(x, tmp, alpha, TILE_N).launch(grid=_grid(x), block=(TILE_N, 1, 1), stream=stream)


@flyc.jit
def add_one_launcher(src: fx.Tensor, out: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    """Phase 2: out = src + 1."""
    add_one_phase(src, out, TILE_N).launch(grid=_grid(src), block=(TILE_N, 1, 1), stream=stream)


def scale_add_one_split(x, out, alpha, stream=None):
    """out = alpha * x + 1 through a buffer the entry allocates (flyship: a Workspace)."""
    tmp = torch.empty_like(x)
    scale_launcher(x, tmp, alpha, fx.Stream(stream))
    add_one_launcher(tmp, out, fx.Stream(stream))


def scale_and_add_one(x, scaled, out, alpha, stream=None):
    """scaled = alpha * x, then out = scaled + 1: phase 2 reads phase 1's output."""
    scale_launcher(x, scaled, alpha, fx.Stream(stream))
    add_one_launcher(scaled, out, fx.Stream(stream))
