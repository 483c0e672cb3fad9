"""A one-op Triton spec whose worker processes sleep before compiling when FLYSHIP_TEST_SLOW_MARKS names a
folder (each worker first drops a file named after its pid there): the hygiene tests kill the build while
its workers are busy. Without the variable it builds normally, in seconds."""

import multiprocessing
import os
import time
from pathlib import Path

import triton
import triton.language as tl

from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op

namespace("flyship_slow")


@triton.jit
def copy_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)


op("copy", kernel=copy_kernel, doc="out = x",
   args=[Tensor("x", rank=1), Output("out", like="x"), Value("n", "x.numel"), Constexpr("BLOCK")],
   grid=("cdiv(x.numel, BLOCK)",),
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (4096,)}, constexprs={"BLOCK": 1024},
               options={"specialize": "declared"},  # one task per target: one worker each
               constraints=("x.stride[0] == 1", "out.stride[0] == 1", "x.numel + 1024 <= 2147483647"))])

_marks = os.environ.get("FLYSHIP_TEST_SLOW_MARKS")
if _marks and multiprocessing.parent_process() is not None:  # in a worker, not in the planning import
    (Path(_marks) / str(os.getpid())).touch()
    time.sleep(float(os.environ.get("FLYSHIP_TEST_SLOW_SECONDS", "120")))
