"""A spec file whose kernel cannot be traced twice in one process (test data for issue 9, pattern 9).

Some DSL kernels keep process-global state (a registry filled at the first trace, a cached module the
second trace collides with). This file stands in for such a kernel: its compile step refuses a second
trace of op ``fragile`` in the same process, as such a DSL would fail. flyc-build must retry a task that
failed in a reused worker once in a fresh process, so ``-j 1`` and ``-j 2`` give the same bundle.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "examples" / "triton"))

from tl_elementwise import add_kernel  # noqa: E402

from flyship.compiler.frontends.triton import frontend as _tf  # noqa: E402
from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op  # noqa: E402

_traced: list[str] = []
_compile = _tf.TritonFrontend.compile


def _compile_once(self, op_decl, spec, target, ctx):
    if op_decl.name == "fragile":
        if _traced:
            raise RuntimeError(f"fragile: this process already traced {_traced[0]}; the kernel keeps "
                               "process-global state and cannot be traced twice")
        _traced.append(spec.name)
    return _compile(self, op_decl, spec, target, ctx)


if getattr(_tf.TritonFrontend.compile, "__name__", "") != "_compile_once":
    _tf.TritonFrontend.compile = _compile_once

namespace("flyship_fragile")

op("fragile", kernel=add_kernel, doc="x + y, from a kernel that can be traced once per process",
   args=[Tensor("x", rank=1), Tensor("y", rank=1), Output("out", like="x"), Value("n_elements", "x.numel"),
         Constexpr("BLOCK")],
   grid=("cdiv(x.numel, BLOCK)",),
   specs=[Spec(f"f32_b{b}", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (4096,), "y": (4096,)},
               constexprs={"BLOCK": b}, options={"num_warps": 4},
               constraints=("x.stride[0] == 1", "y.stride[0] == 1", "out.stride[0] == 1",
                            "y.shape[0] == x.shape[0]", "x.numel + 1024 <= 2147483647", f"x.numel % {b} == 0"))
          for b in (1024, 512, 256)])  # the larger block first: each specialization is reachable
