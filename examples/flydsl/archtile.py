# SPDX-License-Identifier: Apache-2.0
"""A kernel module that fixes an arch-dependent constant when it is imported, as upstream builders do.

``TILE_N`` (the columns one workgroup scales) is read from ``get_rocm_arch()`` at import: 128 on gfx950, 256
elsewhere. flyc-build imports the spec file (and this module) once per target environment, so each target's
tasks follow the value its own import fixed (see archspec.py).
"""

from flydsl.runtime.device import get_rocm_arch
from scale import scale

ARCH = get_rocm_arch()
TILE_N = 128 if ARCH == "gfx950" else 256

__all__ = ["ARCH", "TILE_N", "scale"]
