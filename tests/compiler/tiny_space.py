"""A generated tuning-like space of tiny Triton kernels: many specializations that compile in a fraction of a
second each (for the build cache and distributed-build tests and bench/build_overhead.py).

The folder holds ``kernels.py`` (two ``@triton.jit`` kernels), ``helpers.py`` (a module ``kernels.py``
imports, so edits to it must reach the cache key), ``configs.json`` (read by the spec file at import, so
it is one of the build's recorded inputs) and ``ops.py`` (the spec file).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

KERNELS = '''\
import triton
import triton.language as tl

import helpers  # noqa: F401  (a user module the kernels' module imports)


@triton.jit
def scale_kernel(x, out, n, BLOCK: tl.constexpr, FACTOR: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * FACTOR, mask=m)


@triton.jit
def shift_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + 1, mask=m)
'''

HELPERS = '''\
"""Imported by kernels.py."""
VERSION = 1
'''

SPEC = '''\
import json
from pathlib import Path

from kernels import scale_kernel, shift_kernel

from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op

namespace("tiny")
CONFIGS = json.loads((Path(__file__).parent / "configs.json").read_text())
ARGS = [Tensor("x", rank=1), Output("out", like="x"), Value("n", "x.numel")]


def specs(kernel):
    # Many configs of one dtype share a guard; flyc-build refuses a specialization an earlier one always takes
    # (op(configs=...) is the tuned form of such a space). These build-throughput tests want plain
    # specializations, so each gets a distinct, always-true constraint that keeps it reachable by the rule. They
    # count one kernel per config: "specialize": "declared" builds only what each declares (no JIT variant first).
    return [Spec(c["name"], dtypes={"x": c["dtype"]}, shapes={"x": (4096,)},
                 options={"num_warps": c["warps"], "specialize": "declared"},
                 constexprs={k: v for k, v in c.items() if k.isupper()}, constraints=(f"x.numel >= {-1 - i}",))
            for i, c in enumerate(CONFIGS) if c["kernel"] == kernel]


if specs("scale"):
    op("scale", kernel=scale_kernel, args=[*ARGS, Constexpr("BLOCK"), Constexpr("FACTOR")],
       grid=("cdiv(x.numel, BLOCK)",), specs=specs("scale"))
if specs("shift"):
    op("shift", kernel=shift_kernel, args=[*ARGS, Constexpr("BLOCK")], grid=("cdiv(x.numel, BLOCK)",),
       specs=specs("shift"))
'''

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def configs(n: int) -> list[dict]:
    """``n`` configs, alternating between the two kernels (blocks x warps x dtypes x factors)."""
    scale = [{"kernel": "scale", "name": f"b{b}_w{w}_{d}_x{f}", "dtype": DTYPES[d], "warps": w, "BLOCK": b,
              "FACTOR": f} for f, b, w, d in itertools.product((2, 3), (64, 128, 256, 512, 1024, 2048, 4096, 8192),
                                                                (1, 2, 4, 8), DTYPES)]
    shift = [{"kernel": "shift", "name": f"b{b}_w{w}_{d}", "dtype": DTYPES[d], "warps": w, "BLOCK": b}
             for b, w, d in itertools.product((64, 128, 256, 512, 1024, 2048, 4096, 8192), (1, 2, 4, 8), DTYPES)]
    mixed = [c for pair in itertools.zip_longest(scale, shift) for c in pair if c is not None]
    if n > len(mixed):
        raise ValueError(f"tiny_space.configs: expected n <= {len(mixed)}, got {n}")
    return mixed[:n]


def write_space(folder: Path, n: int) -> Path:
    """Write the spec folder with ``n`` configs; returns the spec file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernels.py").write_text(KERNELS)
    (folder / "helpers.py").write_text(HELPERS)
    (folder / "configs.json").write_text(json.dumps(configs(n), indent=1))
    (folder / "ops.py").write_text(SPEC)
    return folder / "ops.py"
