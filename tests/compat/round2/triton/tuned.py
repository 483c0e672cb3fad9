# SPDX-License-Identifier: Apache-2.0
"""Spec file of the tuned examples: config spaces, one spec for gfx942, gfx950 and sm_90 (Triton ops on all
three, the FlyDSL op on the AMD ones).

    flyc-build examples/triton/tuned.py -o artifacts/tuned --arch gfx942 --arch gfx950 --arch sm_90
    flyship tune artifacts/tuned --shapes examples/triton/tuned_shapes.json -o artifacts/tuned/tuning.json

Each op declares one base Spec and a config space (``configs=``); every config becomes a specialization
``<base>__<config>``. ``key=`` names every dimension the grid and guards depend on, so the tuning table can
pick a different config per shape regime (decode M=1..16, mid, prefill). See docs/tuning.md.
"""

import sys
from pathlib import Path

from tl_gemm import gemm_kernel
from tl_rmsnorm import rmsnorm_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "flydsl"))
from elementwise import add  # noqa: E402  (a FlyDSL launcher: add(x, y, out, VEC: Constexpr, stream))

from flyship.compiler.spec import Constexpr, Output, Scalar, Spec, Tensor, Value, namespace, op, references
from flyship.compiler.tuning import Config

namespace("flyship_tuned")
references("references.py")

GEMM_CONFIGS = [
    Config(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=2),
    Config(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=2),
    Config(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=2),
    Config(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=2),
    Config(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=2),
    Config(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=2),
]


def fits_shared_memory(configs, named_args):
    """Drop configs whose staged A and B tiles would not fit the target's LDS / shared memory."""
    elem = named_args["a"].element_size()
    return [c for c in configs
            if c.values["num_stages"] * (c.values["BLOCK_M"] + c.values["BLOCK_N"]) * c.values["BLOCK_K"] * elem
            <= named_args["lds_bytes"]]


op("gemm", kernel=gemm_kernel, reference="gemm_ref", doc="c = a @ b.T (b is (N, K)), tuned per shape regime",
   args=[Tensor("a", rank=2), Tensor("b", rank=2), Output("c", shape=("a.shape[0]", "b.shape[0]"), dtype="a"),
         Value("M", "a.shape[0]"), Value("N", "b.shape[0]"), Value("K", "a.shape[1]"),
         Value("stride_am", "a.stride[0]"), Value("stride_bn", "b.stride[0]"), Value("stride_cm", "c.stride[0]"),
         Constexpr("BLOCK_M"), Constexpr("BLOCK_N"), Constexpr("BLOCK_K"), Constexpr("GROUP_M")],
   grid=("cdiv(a.shape[0], BLOCK_M) * cdiv(b.shape[0], BLOCK_N)",),
   specs=[Spec("f16", dtypes={"a": "float16", "b": "float16"}, shapes={"a": (512, 384), "b": (256, 384)},
               constraints=("a.stride[1] == 1", "b.stride[1] == 1", "c.stride[1] == 1", "b.shape[1] == a.shape[1]"),
               constexprs={})],
   configs=GEMM_CONFIGS, key=("a.shape[0]", "b.shape[0]", "a.shape[1]"), prune=fits_shared_memory)

# A row reduction: one program per row; the winner's warp count depends on how many rows there are.
op("rmsnorm", kernel=rmsnorm_kernel, reference="rmsnorm_ref", doc="x * rsqrt(mean(x**2, -1) + eps) * w, tuned",
   args=[Tensor("x", rank=2), Tensor("w", rank=1), Output("out", like="x"), Value("x_row_stride", "x.stride[0]"),
         Value("out_row_stride", "out.stride[0]"), Value("n_cols", "x.shape[1]"), Scalar("eps", "float", 1e-6),
         Constexpr("BLOCK_N")],
   grid=("x.shape[0]",),
   specs=[Spec("f16", dtypes={"x": "float16", "w": "float16"}, shapes={"x": (64, 4000), "w": (4000,)},
               constexprs={"BLOCK_N": 4096},
               constraints=("x.stride[1] == 1", "out.stride[1] == 1", "w.stride[0] == 1", "w.shape[0] == x.shape[1]",
                            "x.shape[1] >= 1", "x.shape[1] <= 4096"))],
   configs=[Config(num_warps=w) for w in (1, 2, 4, 8, 16)], key=("x.shape[0]", "x.shape[1]"))

# A FlyDSL launcher's config space (AMD targets only): elements per thread. Its grid is
# (cdiv(M, 8), cdiv(N, 32 * VEC)), so the key names both dims.
op("add", kernel=add, reference="add_ref", doc="out = x + y (FlyDSL), tuned elements per thread",
   args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x"), Constexpr("VEC")],
   specs=[Spec("f16", dtypes={"x": "float16", "y": "float16"}, shapes={"x": (1000, 1000), "y": (1000, 1000)},
               constraints=("y.shape[0] == x.shape[0]", "y.shape[1] == x.shape[1]"))],
   configs=[Config(VEC=v) for v in (2, 4, 8)], key=("x.shape[0]", "x.shape[1]"))
