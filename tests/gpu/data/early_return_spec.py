"""Two ops over the early-returning kernel (tests/gpu/test_verify_unwritten.py): ``skip_rows`` forgets
``zero=True`` (the spec mistake verify must report), ``skip_rows_zeroed`` declares it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from early_return_kernels import skip_rows_kernel  # noqa: E402

from flyship.compiler.spec import Constexpr, Output, Spec, Tensor, Value, namespace, op, references  # noqa: E402

namespace("early_return")
references(os.path.join(os.path.dirname(os.path.abspath(__file__)), "early_return_refs.py"))

for name, zero in (("skip_rows", False), ("skip_rows_zeroed", True)):
    op(name, kernel=skip_rows_kernel, reference="skip_rows_ref",
       args=[Tensor("x", rank=2), Tensor("t", rank=1), Output("out", like="x", zero=zero), Value("n", "x.shape[1]"),
             Constexpr("BLOCK")],
       grid=("x.shape[0]",),
       specs=[Spec("f32", dtypes={"x": "float32", "t": "int32"}, shapes={"x": (64, 100), "t": (64,)},
                   constexprs={"BLOCK": 128}, constraints=("x.shape[1] <= 128", "t.shape[0] == x.shape[0]"))])
