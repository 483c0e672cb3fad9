"""flyship spec: issue 33's silent cases (tests/loader/test_emulated_verify.py). Each builds, loads and passes the
example-only `flyship verify`; `flyship verify --emulate` refuses it, naming the case."""

from silent_kernels import capped_rows, shared_stride, wrap_rows

from flyship.compiler.spec import Output, Spec, Tensor, namespace, op, references

namespace("flyship_silent")
references("silent_references.py")

op("wrap_rows", kernel=wrap_rows, args=[Tensor("x", rank=2), Output("out", like="x")], reference="plus_one",
   doc="out = x + 1, wrong from row 256 (reads row r % 256)",
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 64)})])

op("capped_rows", kernel=capped_rows, args=[Tensor("x", rank=2), Output("out", like="x")], reference="plus_one",
   doc="out = x + 1, rows past 256 never written (a fixed grid)",
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 64)})])

op("shared_stride", kernel=shared_stride, args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x")],
   reference="add", doc="out = x + y, y read with x's strides",
   specs=[Spec("f32", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (64, 64), "y": (64, 64)},
               constraints=("y.shape[0] == x.shape[0]", "y.shape[1] == x.shape[1]"))])
