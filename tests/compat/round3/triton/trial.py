# Frozen compatibility corpus (tests/compat/README.md): do not edit.
"""A spec written against the round-3 docs the way issue 34's trial wrote one, using the three things that broke
in round 4's first build: a Launch passing a Constexpr to a runtime parameter (W_row_stride-style), a kernel launched
twice whose second launch never reads a stride the first reads, and a hand-hinted spec listed before a plain one."""

from tl_rows import rows_kernel

from flyship.compiler.spec import Constexpr, Launch, Output, Spec, Tensor, Value, namespace, op, references

namespace("compat_round3")
references("references.py")

ARGS = [Tensor("x", rank=2), Tensor("w", rank=2), Output("out", like="x"), Value("x_stride", "x.stride[0]"),
        Value("w_stride", "w.stride[0]"), Value("n", "x.shape[1]")]
SHAPES = {"x": (4, 100), "w": (4, 100)}
ROWS = ("x.shape[1] <= 128", "w.shape[1] == x.shape[1]", "w.shape[0] == x.shape[0]")

op("mul_inc",
   kernel=[Launch(rows_kernel, args=["x", "w", "out", "x_stride", "w_stride", "n", "MUL", "BLOCK"],
                  grid=("x.shape[0]",)),
           Launch(rows_kernel, args=["x", "w", "out", "x_stride", "ZERO", "n", "INC", "BLOCK"], grid=("x.shape[0]",))],
   args=[*ARGS, Constexpr("MUL"), Constexpr("INC"), Constexpr("ZERO"), Constexpr("BLOCK")],
   reference="mul_inc",
   specs=[Spec("f32", dtypes={"x": "float32", "w": "float32"}, shapes=SHAPES,
               constexprs={"MUL": 0, "INC": 1, "ZERO": 0, "BLOCK": 128}, constraints=ROWS)])

op("mul", kernel=rows_kernel, grid=("x.shape[0]",),
   args=[*ARGS, Constexpr("MODE"), Constexpr("BLOCK")],
   reference="mul",
   specs=[Spec("f32_a16", dtypes={"x": "float32", "w": "float32"}, shapes=SHAPES, constexprs={"MODE": 0, "BLOCK": 128},
               constraints=ROWS, options={"divisible_by_16": ["x", "w", "out"]}),
          Spec("f32", dtypes={"x": "float32", "w": "float32"}, shapes=SHAPES, constexprs={"MODE": 0, "BLOCK": 128},
               constraints=ROWS)])
