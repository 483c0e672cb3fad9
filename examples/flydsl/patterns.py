"""flyship spec: FlyDSL launcher shapes from issue 9 (``flyc-build examples/flydsl/patterns.py -o OUT --arch gfx942``).

Each op shows launcher patterns that upstream FlyDSL builders use and flyship builds as they are:

* ``scale`` (scale.py): a ``stream: fx.Stream`` parameter with no default (1), a runtime ``fx.Float32``
  scalar declared ``Scalar(..., "float")`` (12), a constexpr named in a constraint (12), and a grid the
  launcher computes in 32-bit integers, which the guard keeps below the wrap (11); a second specialization
  traced with a column-major example (``x = w.t()``): FlyDSL folds the unit stride of dim 0 into the code,
  so its guard admits exactly column-major inputs and the kernel gets the stride of dim 1 (3).
* ``scale_cfg`` (scale.py): the same kernel configured by an ``@fx.struct`` of constexpr fields, declared
  ``Constexpr("cfg")`` with ``constexprs={"cfg": ScaleConfig(256)}`` (5).
* ``add_one_rows`` (rows.py): a runtime ``fx.Int32`` row count bound to ``Value("m", "x.shape[0]")`` and
  a row length the builder bakes in (``N``), declared as a constraint naming the constexpr (4).
* ``add_one_ptr`` (pointers.py): the same computation with ``fx.Pointer`` launcher parameters (bare pointers,
  no shape or stride reaches the kernel): declared as the tensors they point into, bound to their data
  pointers, dtype and alignment guarded, the view's sizes declared as constraints (4).
* ``divide`` (divide.py): the builder returns a plain Python entry point that compiles the launcher under
  fast-math hints; the spec names that entry (``entry(build_divide())``) and flyship traces it as the user
  calls it (2).
* ``scale_add_one`` (twophase.py): one launcher launches two kernels in sequence through a buffer ``tmp``
  the call allocates, declared ``Workspace("tmp", ...)``: the manifest holds both launches in order, each
  proved against FlyDSL's own code object and its kernargs checked against its metadata (6).
* ``scale_add_one_split`` / ``scale_and_add_one`` (twolaunchers.py): an entry point that calls two
  ``@flyc.jit`` launchers in sequence, each its own FlyDSL compile and code object: the buffer the entry
  allocates between them is a declared ``Workspace`` bound in both, and a declared output of phase 1 may be
  phase 2's input (6).
* ``scale_stream_first`` / ``scale_rewrapped`` / ``add_one_64_rows`` (orders.py): a launcher whose stream and
  constexpr come before runtime parameters (every argument is passed by name), an entry that re-wraps its
  tensors with ``flyc.from_torch_tensor(t).mark_layout_dynamic()``, and an entry that passes a literal
  (declared ``Value("m", "64")``).
* ``fused_add_rmsnorm`` (fused_add_rmsnorm.py): a kernel that writes an input in place: ``residual += x`` is
  stored back into ``residual`` (declared ``Tensor("residual", rank=2, mutable=True)``: ``Tensor(a!)`` in the
  schema, no fresh output for it) and the normed ``out`` is a fresh output (7).
* ``colsum`` (colsum.py): a kernel that accumulates into its output with global atomic adds from every row's
  workgroups: declared ``Output("out", ..., zero=True)``, so the loader allocates it zero-filled (and zeroes an
  ``out=`` tensor); flyc-build refuses such a kernel when the output is not declared so.
"""

from colsum import colsum
from divide import build_divide, launch_divide
from orders import add_one_64_rows, scale_rewrapped, scale_stream_first
from fused_add_rmsnorm import fused_add_rmsnorm
from pointers import add_one_ptr
from rows import ROWS_MAX, add_one_rows
from scale import ScaleConfig, scale, scale_cfg
from twolaunchers import scale_add_one_split, scale_and_add_one
from twophase import scale_add_one

from flyship.compiler.spec import (Constexpr, Output, Scalar, Spec, Tensor, Value, Workspace, entry, namespace, op,
                                   references)

namespace("flyship_patterns")
references("references.py")

op(
    "scale",
    kernel=scale,
    args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=2.0), Constexpr("TILE_N")],
    reference="scale_ref",
    doc="out = alpha * x (float32), launcher with a stream parameter that has no default",
    specs=[
        # A constraint may name a constexpr: flyship writes its value in (the guard reads x.shape[1] >= 256).
        Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)}, constexprs={"TILE_N": 256},
             constraints=("x.shape[1] >= TILE_N",)),
        # A column-major x (a transposed (512, 1000) tensor): traced with those strides, guarded for them.
        Spec("f32_colmajor", dtypes={"x": "float32"}, shapes={"x": (1000, 512)}, strides={"x": (1, 1000)},
             constexprs={"TILE_N": 256}),
    ],
)

op(
    "scale_cfg",
    kernel=scale_cfg,
    args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=2.0), Constexpr("cfg")],
    reference="scale_ref",
    doc="out = alpha * x (float32), configured by an @fx.struct constexpr",
    specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)}, constexprs={"cfg": ScaleConfig(256)})],
)

op(
    "add_one_rows",
    kernel=add_one_rows,
    args=[Tensor("x", rank=2), Output("out", like="x"), Value("m", "x.shape[0]"), Constexpr("N")],
    reference="add_one_rows_ref",
    doc="out = x + 1 (float32) with a runtime row count and a row length baked into the code",
    specs=[
        # The launcher views x and out as (ROWS_MAX, N):(N, 1): promises flyship cannot see in the host IR.
        Spec("n1024", dtypes={"x": "float32"}, shapes={"x": (300, 1024)}, constexprs={"N": 1024},
             constraints=("x.shape[1] == N", "x.stride[0] == N", "x.stride[1] == 1", f"x.shape[0] <= {ROWS_MAX}")),
    ],
)

op(
    "add_one_ptr",
    kernel=add_one_ptr,
    args=[Tensor("x", rank=2), Output("out", like="x"), Value("m", "x.shape[0]"), Constexpr("N")],
    reference="add_one_rows_ref",
    doc="out = x + 1 (float32) through fx.Pointer launcher parameters, row length baked in",
    specs=[
        # x and out reach the kernel as bare pointers: the view (ROWS_MAX, N):(N, 1) is the builder's promise.
        Spec("n1024", dtypes={"x": "float32"}, shapes={"x": (300, 1024)}, constexprs={"N": 1024},
             constraints=("x.shape[1] == N", "x.stride[0] == N", "x.stride[1] == 1", f"x.shape[0] <= {ROWS_MAX}")),
    ],
)

DIVIDE_ARGS = [Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=3.0)]
DIVIDE_SPECS = [Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 1000)})]

# The entry point, as users call it: built with the entry's fast-math hints, proven against FlyDSL's
# own code object from that call.
op("divide", kernel=entry(build_divide()), args=DIVIDE_ARGS, reference="divide_ref", specs=DIVIDE_SPECS,
   doc="out = x / alpha (float32) through the builder's entry point (fast-math)")

# The same launcher unwrapped by hand: no hints, IEEE division. Built here only so the tests can show that
# its code differs from what FlyDSL runs for the entry (never ship an unwrapped launcher in its place).
op("divide_unwrapped", kernel=launch_divide, args=DIVIDE_ARGS, reference="divide_ref", specs=DIVIDE_SPECS,
   doc="out = x / alpha (float32), the launcher named directly (no fast-math)")

# Two launches per call: tmp = alpha * x, then out = tmp + 1, through a workspace the loader allocates.
op("scale_add_one", kernel=scale_add_one, reference="scale_add_one_ref",
   doc="out = alpha * x + 1 (float32) in two kernel launches through a workspace",
   args=[Tensor("x", rank=2), Workspace("tmp", shape=("x.shape[0]", "x.shape[1]"), dtype="float32"),
         Output("out", like="x"), Scalar("alpha", "float", default=2.0), Constexpr("TILE_N")],
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)}, constexprs={"TILE_N": 256})])

# Two launchers per call, called by an entry: tmp = alpha * x (launcher 1), then out = tmp + 1 (launcher 2).
# The entry allocates tmp itself; flyship binds it to the declared workspace in both launches.
op("scale_add_one_split", kernel=entry(scale_add_one_split), reference="scale_add_one_ref",
   doc="out = alpha * x + 1 (float32) through an entry that calls two launchers sharing a workspace",
   args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=2.0),
         Workspace("tmp", shape=("x.shape[0]", "x.shape[1]"), dtype="float32")],
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)})])

# The same two launchers, phase 2 reading a declared output of phase 1.
op("scale_and_add_one", kernel=entry(scale_and_add_one), reference="scale_and_add_one_ref",
   doc="scaled = alpha * x; out = scaled + 1 (float32), two launchers, phase 2 reads phase 1's output",
   args=[Tensor("x", rank=2), Output("scaled", like="x"), Output("out", like="x"),
         Scalar("alpha", "float", default=2.0)],
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)})])

# An input the kernel writes in place (7): residual += x is stored into residual; out is fresh.
op(
    "fused_add_rmsnorm",
    kernel=fused_add_rmsnorm,
    args=[Tensor("x", rank=2), Tensor("residual", rank=2, mutable=True), Tensor("w", rank=1), Output("out", like="x"),
          Scalar("eps", "float", default=1e-6), Constexpr("MAX_N")],
    reference="fused_add_rmsnorm_ref",
    doc="residual += x (in place); out = rmsnorm(residual) * w (float32)",
    specs=[
        Spec("f32", dtypes={"x": "float32", "residual": "float32", "w": "float32"},
             shapes={"x": (64, 1000), "residual": (64, 1000), "w": (1000,)}, constexprs={"MAX_N": 4096},
             constraints=("x.shape[1] <= MAX_N", "residual.shape[0] == x.shape[0]", "residual.shape[1] == x.shape[1]",
                          "w.shape[0] == x.shape[1]")),
    ],
)

# A kernel that accumulates into its output with atomics: the output must start from zeros.
op("colsum", kernel=colsum, reference="colsum_ref", doc="out[n] = sum over m of x[m, n] by atomic adds (float32)",
   args=[Tensor("x", rank=2), Output("out", shape=("x.shape[1]",), dtype="x", zero=True)],
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (64, 1000)})])

# Launcher shapes bound by parameter name (orders.py).
SCALE_SPECS = [Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)}, constexprs={"TILE_N": 256})]
op("scale_stream_first", kernel=scale_stream_first, reference="scale_ref",
   doc="out = alpha * x (float32), launcher (x, stream, TILE_N, out, alpha)",
   args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=2.0), Constexpr("TILE_N")],
   specs=SCALE_SPECS)

op("scale_rewrapped", kernel=entry(scale_rewrapped), reference="scale_ref",
   doc="out = alpha * x (float32), an entry that re-wraps its tensors with dynamic layouts",
   args=[Tensor("x", rank=2), Output("out", like="x"), Scalar("alpha", "float", default=2.0)],
   specs=[Spec("f32", dtypes={"x": "float32"}, shapes={"x": (100, 1000)})])

op("add_one_64_rows", kernel=entry(add_one_64_rows), reference="add_one_rows_ref",
   doc="out = x + 1 (float32, (64, 1024)), an entry that passes the row count as a literal",
   args=[Tensor("x", rank=2), Output("out", like="x"), Value("m", "64")],
   specs=[Spec("r64", dtypes={"x": "float32"}, shapes={"x": (64, 1024)},
               constraints=("x.shape[0] == 64", "x.shape[1] == 1024", "x.stride[0] == 1024", "x.stride[1] == 1"))])
