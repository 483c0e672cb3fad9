"""flyship spec: a kernel right on every shape (the control of silent.py): `flyc-build --verify` passes it."""

from silent_kernels import plus_one

from flyship.compiler.spec import Output, Spec, Tensor, namespace, op, references

namespace("flyship_right")
references("silent_references.py")

op("plus_one", kernel=plus_one, args=[Tensor("x", rank=2), Output("out", like="x")], reference="plus_one",
   doc="out = x + 1", specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 64)})])
