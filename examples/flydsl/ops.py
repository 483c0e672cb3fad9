"""flyship spec: the FlyDSL example ops (``flyc-build examples/flydsl/ops.py -o artifacts/examples --arch gfx942``).

Run by ``flyc-build`` under the FlyDSL Python; each launcher's parameters are listed in order, and each
specialization names dtypes and the example shapes it is traced with. Shapes stay dynamic: the guard
constraints below (plus those flyship derives from the lowered layouts, such as ``x.stride[1] == 1``)
say which inputs a specialization accepts; others go to the reference at run time.
"""

from flyship.compiler.frontends.flydsl import requires

requires("0.5.0", "fx.struct in gemm.py; the examples are built and tested with 0.5.0")  # before the imports

from elementwise import add  # noqa: E402
from gemm import gemm  # noqa: E402
from rmsnorm import rmsnorm  # noqa: E402
from softmax import softmax, softmax_bwd  # noqa: E402

from flyship.compiler.spec import Backward, Output, Scalar, Spec, Tensor, namespace, op, references  # noqa: E402

namespace("flyship_examples")
references("references.py")

MAX_N = 8192  # softmax / rmsnorm hold a row in registers: N <= MAX_N (the kernels do not check it)

op(
    "add",
    kernel=add,
    args=[Tensor("x", rank=2), Tensor("y", rank=2), Output("out", like="x")],
    reference="add_ref",
    doc="out = x + y for 2-D tensors, predicated tails",
    specs=[
        Spec(name, dtypes={"x": dt, "y": dt}, shapes={"x": (1000, 1000), "y": (1000, 1000)},
             constraints=("y.shape[0] == x.shape[0]", "y.shape[1] == x.shape[1]"))
        for name, dt in (("f32", "float32"), ("bf16", "bfloat16"))
    ],
)

op(
    "softmax",
    kernel=softmax,
    args=[Tensor("x", rank=2), Output("out", like="x")],
    reference="softmax_ref",
    doc="row softmax over the last dim (max-subtracted, f32 accumulation)",
    # Trains: loss.backward() runs softmax_bwd on the gradient of out and the saved out.
    backward=Backward("softmax_bwd", inputs={"dy": "grad:out", "y": "out"}, grads={"x": "dx"}),
    specs=[
        Spec(name, dtypes={"x": dt}, shapes={"x": (512, 1000)}, constexprs={"MAX_N": MAX_N},
             constraints=(f"x.shape[1] <= {MAX_N}",))
        for name, dt in (("f32", "float32"), ("bf16", "bfloat16"))
    ],
)

op(
    "softmax_bwd",
    kernel=softmax_bwd,
    args=[Tensor("dy", rank=2), Tensor("y", rank=2), Output("dx", like="y")],
    reference="softmax_bwd_ref",
    doc="gradient of softmax's input: y * (dy - sum(dy * y, -1))",
    specs=[
        Spec(name, dtypes={"dy": dt, "y": dt}, shapes={"dy": (512, 1000), "y": (512, 1000)},
             constexprs={"MAX_N": MAX_N},
             constraints=(f"y.shape[1] <= {MAX_N}", "dy.shape[0] == y.shape[0]", "dy.shape[1] == y.shape[1]"))
        for name, dt in (("f32", "float32"), ("bf16", "bfloat16"))
    ],
)

op(
    "rmsnorm",
    kernel=rmsnorm,
    args=[Tensor("x", rank=2), Tensor("w", rank=1), Output("out", like="x"), Scalar("eps", "float", default=1e-6)],
    reference="rmsnorm_ref",
    doc="out = x * rsqrt(mean(x^2) + eps) * w over the last dim",
    specs=[
        Spec(name, dtypes={"x": dt, "w": dt}, shapes={"x": (256, 4096), "w": (4096,)},
             constexprs={"MAX_N": MAX_N},
             constraints=(f"x.shape[1] <= {MAX_N}", "w.shape[0] == x.shape[1]"))
        for name, dt in (("f32", "float32"), ("bf16", "bfloat16"))
    ],
)

op(
    "gemm",
    kernel=gemm,
    args=[Tensor("a", rank=2, alignment=16), Tensor("b", rank=2, alignment=16),
          Output("c", shape=("a.shape[0]", "b.shape[0]"), dtype="a")],
    reference="gemm_ref",
    doc="c = a @ b.T in bf16 with MFMA (f32 accumulate); b is [N, K] like nn.Linear's weight",
    specs=[
        Spec("bf16", dtypes={"a": "bfloat16", "b": "bfloat16"}, shapes={"a": (512, 512), "b": (512, 512)},
             constraints=("a.shape[0] % 128 == 0", "b.shape[0] % 128 == 0", "a.shape[1] % 32 == 0",
                          "a.shape[1] >= 32", "b.shape[1] == a.shape[1]")),
    ],
)
