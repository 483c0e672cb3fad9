"""flyship spec: the mixed-dtype silent case (mixed_kernels.py; tests/loader/test_emulated_verify.py)."""

from mixed_kernels import bias_add
from flyship.compiler.spec import Output, Spec, Tensor, namespace, op, references
namespace("flyship_mixed")
references("silent_references.py")
op("bias_add", kernel=bias_add, args=[Tensor("x", rank=2), Tensor("b", rank=2), Output("out", like="x")],
   reference="bias_add", doc="out = x + b, x bf16, b f32 read as bf16",
   specs=[Spec("mixed", dtypes={"x": "bfloat16", "b": "float32"}, shapes={"x": (64, 64), "b": (64, 64)},
               constraints=("b.shape[0] == x.shape[0]", "b.shape[1] == x.shape[1]"))])
