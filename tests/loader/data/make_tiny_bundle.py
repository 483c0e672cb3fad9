"""Regenerate ``tests/loader/data/tiny``: a small, real bundle of three Triton kernels.

Each kernel is compiled on the CPU by Triton 3.6 for AMD (hsaco, gfx942; ``add`` also gfx950) and for
NVIDIA (cubin, sm_90a); the code objects are Triton's own (proof method ``frontend-binary``). The
manifest is written with flyship.bundle's dataclasses; the metadata comes from the code objects
(flyship.bundle.codeobject for hsaco, flyship.bundle.cubin for cubins); a cubin's target is the one it
is built for (Triton compiles sm_90 kernels arch-specific: ``sm_90a``).

The ops:
  add(x, y) -> out              1-D, float32 and float16, 16-byte aligned pointers, n as an `expr`
  scale_rows(x, alpha=1.0, bias=0) -> out
                                2-D, strided input (shape, stride i64 and i32 fields, f32 and i32
                                scalars), a 2-D grid, a guard constraint; a never-taken device_print
                                gives the AMD code object real hidden arguments (hostcall buffer, ...)
  addsub(x, y) -> (sum, diff)   two outputs; its own backward (linear and self-adjoint:
                                d/dx = g_sum + g_diff, d/dy = g_sum - g_diff), an autograd pair

Run from the repository root with the FlyDSL/build venv (it has Triton):
    .venv-flydsl/bin/python tests/loader/data/make_tiny_bundle.py
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

ROOT = Path(__file__).resolve().parents[3]

from flyship.bundle import manifest as m  # noqa: E402
from flyship.bundle import rules  # noqa: E402
from flyship.bundle.codeobject import CodeObjectFile  # noqa: E402
from flyship.bundle.cubin import CubinFile  # noqa: E402
from flyship.bundle.expr import evaluate_with_shapes  # noqa: E402

OUT = Path(__file__).resolve().parent / "tiny"
NAMESPACE = "flyship_tiny"


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def scale_rows_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om, alpha, bias, BLOCK_N: tl.constexpr):
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (cols < N) & (row < M)
    if N < 0:  # never true for a real call; printf makes the AMD kernel use hidden arguments
        tl.device_print("flyship tiny: negative N", N)
    x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask)
    tl.store(out_ptr + row * stride_om + cols, x * alpha + bias, mask=mask)


@triton.jit
def addsub_kernel(x_ptr, y_ptr, sum_ptr, diff_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(sum_ptr + offs, x + y, mask=mask)
    tl.store(diff_ptr + offs, x - y, mask=mask)


TARGETS = {
    "gfx942": GPUTarget("hip", "gfx942", 64),
    "gfx950": GPUTarget("hip", "gfx950", 64),
    "sm_90": GPUTarget("cuda", 90, 32),
}
def compile_variant(fn, signature: dict, constexprs: dict, attrs: dict, target: str,
                    bindings: list[dict], grid: tuple[str, str, str], op: str, spec: str) -> m.Variant:
    """Compile one kernel for one target and describe it as a manifest variant.

    ``bindings`` gives, per explicit kernel argument in order, the kernarg field keys (kind, type, arg, ...).
    """
    k = triton.compile(triton.compiler.ASTSource(fn, signature, constexprs, attrs), target=TARGETS[target])
    md = k.metadata
    block = md.num_warps * md.warp_size
    if target.startswith("gfx"):
        data, fmt, ext = k.asm["hsaco"], "hsaco", "hsaco"
        co = CodeObjectFile(data, target)
        meta = co.kernel_metadata(md.name)
        cov = co.code_object_version
    else:
        data, fmt, ext = k.asm["cubin"], "cubin", "cubin"
        cubin = CubinFile(data, target)
        target = cubin.target  # what the cubin is built for: Triton makes sm_90a for sm_90
        pointers = [i for i, b in enumerate(bindings) if b["type"] == "ptr"]
        meta = cubin.kernel_metadata(md.name, pointer_ordinals=pointers)
        cov = None
    fname = f"{op}.{spec}.{target.replace(':', '_')}"
    explicit = [a for a in meta.args if not a.hidden]
    if len(explicit) != len(bindings):
        raise SystemExit(f"{fname}: {len(explicit)} explicit kernel args, {len(bindings)} bindings")
    fields = tuple(m.KernargField(offset=a.offset, size=m.FIELD_TYPES[b["type"]], kernel_arg=b.get("name"), **{
        k_: v_ for k_, v_ in b.items() if k_ != "name"}) for a, b in zip(explicit, bindings))
    layout = m.KernargLayout(size=max(a.offset + a.size for a in explicit), alignment=meta.kernarg_segment_align,
                             fields=fields)
    (OUT / f"{fname}.{ext}").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    return m.Variant(
        target=target,
        code_object=m.CodeObject(file=f"{fname}.{ext}", sha256=sha, format=fmt, target=target, symbol=md.name,
                                 code_object_version=cov),
        metadata=meta,
        kernargs=layout,
        launch=m.Launch(grid=grid, block=(block, 1, 1), dynamic_lds=str(md.shared)),
        proof=m.Proof(method="frontend-binary", reference_sha256=sha, identical_sections=(), kernel_descriptor="n/a",
                      metadata="n/a"),
        toolchain={"triton": triton.__version__},
    )


def ptr(name: str, arg: str) -> dict:
    return {"name": name, "kind": "pointer", "type": "ptr", "arg": arg}


NULLS = [{"name": "global_scratch", "kind": "null", "type": "ptr"},
         {"name": "profile_scratch", "kind": "null", "type": "ptr"}]
ALIGN16 = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}


def example(shapes: dict, scalars: dict, grid: tuple[str, str, str]) -> m.Example:
    ints = {k: v for k, v in scalars.items() if isinstance(v, int)}
    g = tuple(evaluate_with_shapes(e, shapes, ints) for e in grid)
    return m.Example(shapes={k: tuple(v) for k, v in shapes.items()}, scalars=scalars, grid=g)


def add_op() -> m.Op:
    grid = ("cdiv(x.shape[0], 1024)", "1", "1")
    bindings = [ptr("x_ptr", "x"), ptr("y_ptr", "y"), ptr("out_ptr", "out"),
                {"name": "n", "kind": "expr", "type": "i32", "expr": "x.numel"}, *NULLS]
    specs = []
    for spec, ty, dtype, targets in (("f32", "*fp32", "float32", ("gfx942", "gfx950", "sm_90")),
                                     ("f16", "*fp16", "float16", ("gfx942", "sm_90"))):
        sig = {"x_ptr": ty, "y_ptr": ty, "out_ptr": ty, "n": "i32", "BLOCK": "constexpr"}
        variants = tuple(compile_variant(add_kernel, sig, {"BLOCK": 1024}, ALIGN16, t, bindings, grid, "add", spec)
                         for t in targets)
        specs.append(m.Specialization(
            name=spec,
            guard=m.Guard(dtypes={"x": dtype, "y": dtype}, constraints=("x.shape[0] == y.shape[0]",),
                          alignment={"x": 16, "y": 16, "out": 16}),
            example=example({"x": (4096,), "y": (4096,)}, {}, grid),
            variants=variants))
    return m.Op(name="add", frontend="triton", doc="elementwise x + y of two 1-D tensors",
                args=(m.Arg("x", "tensor", 1, ("float32", "float16")), m.Arg("y", "tensor", 1, ("float32", "float16"))),
                outputs=(m.Output("out", ("x.shape[0]",), "x"),), reference="add", specializations=tuple(specs))


def scale_rows_op() -> m.Op:
    grid = ("cdiv(x.shape[1], 256)", "x.shape[0]", "1")
    sig = {"x_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32", "stride_xm": "i64", "stride_xn": "i32",
           "stride_om": "i64", "alpha": "fp32", "bias": "i32", "BLOCK_N": "constexpr"}
    bindings = [ptr("x_ptr", "x"), ptr("out_ptr", "out"),
                {"name": "M", "kind": "shape", "type": "i32", "arg": "x", "dim": 0},
                {"name": "N", "kind": "shape", "type": "i32", "arg": "x", "dim": 1},
                {"name": "stride_xm", "kind": "stride", "type": "i64", "arg": "x", "dim": 0},
                {"name": "stride_xn", "kind": "stride", "type": "i32", "arg": "x", "dim": 1},
                {"name": "stride_om", "kind": "stride", "type": "i64", "arg": "out", "dim": 0},
                {"name": "alpha", "kind": "scalar", "type": "f32", "arg": "alpha"},
                {"name": "bias", "kind": "scalar", "type": "i32", "arg": "bias"}, *NULLS]
    variants = tuple(compile_variant(scale_rows_kernel, sig, {"BLOCK_N": 256}, {}, t, bindings, grid, "scale_rows",
                                     "f32") for t in ("gfx942", "sm_90"))
    spec = m.Specialization(
        name="f32",
        guard=m.Guard(dtypes={"x": "float32"}, constraints=("x.shape[0] <= 65535",)),
        example=example({"x": (64, 1000)}, {"alpha": 2.0, "bias": 1}, grid),
        variants=variants)
    return m.Op(name="scale_rows", frontend="triton", doc="x * alpha + bias over a (possibly strided) 2-D tensor",
                args=(m.Arg("x", "tensor", 2, ("float32",)), m.Arg("alpha", "float", default=1.0),
                      m.Arg("bias", "int", default=0)),
                outputs=(m.Output("out", ("x.shape[0]", "x.shape[1]"), "x"),), reference="scale_rows",
                specializations=(spec,))


def addsub_op() -> m.Op:
    grid = ("cdiv(x.shape[0], 1024)", "1", "1")
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "sum_ptr": "*fp32", "diff_ptr": "*fp32", "n": "i32",
           "BLOCK": "constexpr"}
    bindings = [ptr("x_ptr", "x"), ptr("y_ptr", "y"), ptr("sum_ptr", "sum"), ptr("diff_ptr", "diff"),
                {"name": "n", "kind": "shape", "type": "i32", "arg": "x", "dim": 0}, *NULLS]
    variants = tuple(compile_variant(addsub_kernel, sig, {"BLOCK": 1024}, {}, t, bindings, grid, "addsub", "f32")
                     for t in ("gfx942", "sm_90"))
    spec = m.Specialization(
        name="f32",
        guard=m.Guard(dtypes={"x": "float32", "y": "float32"}, constraints=("x.shape[0] == y.shape[0]",)),
        example=example({"x": (3000,), "y": (3000,)}, {}, grid),
        variants=variants)
    return m.Op(name="addsub", frontend="triton", doc="(x + y, x - y) of two 1-D tensors",
                args=(m.Arg("x", "tensor", 1, ("float32",)), m.Arg("y", "tensor", 1, ("float32",))),
                outputs=(m.Output("sum", ("x.shape[0]",), "x"), m.Output("diff", ("x.shape[0]",), "x")),
                reference="addsub", specializations=(spec,),
                backward=m.Backward(op="addsub", inputs={"x": "grad:sum", "y": "grad:diff"},
                                    grads={"x": "sum", "y": "diff"}))


REFERENCES = '''"""PyTorch references of the tiny test bundle's ops (imports torch only)."""

import torch


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def scale_rows(x: torch.Tensor, alpha: float = 1.0, bias: int = 0) -> torch.Tensor:
    return x * alpha + bias


def addsub(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + y, x - y
'''


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    ops = (add_op(), scale_rows_op(), addsub_op())
    manifest = m.Manifest(
        schema_version=m.SCHEMA_VERSION, namespace=NAMESPACE,
        build=m.BuildInfo(flyship_version="0.1.0", frontends={"triton": triton.__version__},
                          python=platform.python_version(), tools={}),
        references="references.py", ops=ops,
        references_sha256=hashlib.sha256(REFERENCES.encode()).hexdigest())
    rules.check_manifest(manifest)
    (OUT / "references.py").write_text(REFERENCES)
    m.write(manifest, OUT / m.MANIFEST_NAME)
    m.read(OUT)  # round trip
    print(f"wrote {OUT}: {', '.join(p.name for p in sorted(OUT.iterdir()))}")


if __name__ == "__main__":
    main()
