"""Triton's JIT speed without hints: a spec with no hints builds, first, what Triton's own JIT builds for its
example call with aligned pointers (checked here by running the JIT's own specialization, ``specialize_impl``
through ``create_function_from_signature`` and ``JITFunction._pack_args``, and compiling both on the CPU: the
cubins' ``.text`` are byte-identical), guarded so that only calls it is correct for reach it, then the generic
specialization (docs/triton.md, "What is compiled is what the guard admits")."""

from __future__ import annotations

import dataclasses
import io

import pytest

# The compile tier: its Python (the FlyDSL venv) has Triton; the workload venv has none.
pytestmark = pytest.mark.compile
pytest.importorskip("triton")

from elftools.elf.elffile import ELFFile  # noqa: E402

from flyship.compiler import frontends  # noqa: E402
from flyship.compiler.frontends.base import BuildContext  # noqa: E402
from flyship.compiler.frontends.triton import jitspec  # noqa: E402
from flyship.compiler.frontends.triton import planning as tp  # noqa: E402
from flyship.compiler.spec import Constexpr, OpDecl, Output, Scalar, Spec, Tensor, Value, Workspace  # noqa: E402
from tests.compiler.test_triton_frontend import build, ops, spec_file, spec_of  # noqa: E402,F401

TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def jit_cubin(op: OpDecl, spec: Spec, cache) -> bytes:
    """What Triton's JIT compiles for ``kernel[grid](*example call)`` on sm_90 (its binder and _pack_args, the
    example's tensors as fresh CPU tensors: 16-byte aligned pointers), in its own Triton cache folder."""
    import torch
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = tp.jit_function(op.kernel, "t")
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    shapes, strides = op.example_shapes(spec), op.example_strides(spec)
    ints = jitspec.example_ints(op, spec, "sm_90", None, "t")
    scalars = op.example_scalars(spec)
    call = []
    for a in op.args:
        if isinstance(a, (Tensor, Output)):
            dt = spec.dtypes[a.name] if isinstance(a, Tensor) else op.output_dtype_for(a, spec)
            call.append(torch.empty_strided(shapes[a.name], strides[a.name], dtype=getattr(torch, dt)))
        elif isinstance(a, Constexpr):
            call.append(spec.constexprs[a.name])
        elif isinstance(a, Value):
            call.append(ints[a.name])
        else:
            call.append(scalars[a.name])
    options, _div, _mode = tp.resolve_options(spec, tp._targets.parse_target("sm_90"), "t")
    kwargs = {**options, "debug": False}
    bound, specialization, opts = binder(*call, **kwargs)
    opts, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, opts)
    with knobs.cache.scope():
        knobs.cache.dir = str(cache)
        kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=opts.__dict__)
    return bytes(kernel.asm["cubin"])


def text_sections(cubin: bytes) -> dict[str, bytes]:
    elf = ELFFile(io.BytesIO(cubin))
    return {s.name: s.data() for s in elf.iter_sections() if s.name.startswith(".text")}


CASES = [  # (op, spec, example shapes): calls whose ints the JIT specializes in each of its ways
    ("rmsnorm", "f32_n4096", {"x": (64, 4096), "w": (4096,)}),   # row strides and n_cols % 16 == 0
    ("rmsnorm", "bf16_n1024", {"x": (64, 1000), "w": (1000,)}),  # n_cols = 1000: no hint on the ints
    ("add", "f32", {"x": (1, 1), "y": (1, 1)}),                  # n_elements == 1: the constant 1
    ("gemm", "bf16", {"a": (128, 64), "b": (96, 64)}),           # M, N, K and the strides % 16 == 0
]


@pytest.mark.parametrize("op_name, spec_name, shapes", CASES)
def test_the_jit_variant_is_the_cubin_tritons_jit_builds(ops, op_name, spec_name, shapes, tmp_path):
    op = ops[op_name]
    spec = dataclasses.replace(spec_of(op, spec_name), shapes=shapes)
    assert spec.options["specialize"] == "jit"
    ours = build(op, spec, "sm_90", tmp_path / "flyship").code_object
    theirs = jit_cubin(op, spec, tmp_path / "jit-cache")
    assert text_sections(ours) and text_sections(ours) == text_sections(theirs)
    generic = dataclasses.replace(spec_of(op, spec_name + jitspec.GENERIC_SUFFIX), shapes=shapes)
    plain = build(op, generic, "sm_90", tmp_path / "generic").code_object
    assert text_sections(plain) != text_sections(theirs)  # the comparison can fail: the generic one is not it


def test_the_jit_variant_is_guarded_by_what_it_assumed(ops):
    op = ops["rmsnorm"]
    spec = dataclasses.replace(spec_of(op, "f32_n4096"), shapes={"x": (64, 4096), "w": (4096,)})
    p = tp.plan(op, spec, "sm_90")
    assert p.alignment == {"x": 16, "w": 16, "out": 16}
    for c in ("x.stride[0] % 16 == 0", "out.stride[0] % 16 == 0", "x.shape[1] % 16 == 0"):
        assert c in p.constraints
    assert p.jit_difference == ""
    add = ops["add"]
    one = tp.plan(add, dataclasses.replace(spec_of(add, "f32"), shapes={"x": (1, 1), "y": (1, 1)}), "sm_90")
    assert "x.numel == 1" in one.constraints and "n_elements" not in [q.name for q in one.params]
    assert one.constexprs["n_elements"] == 1


def test_each_spec_is_followed_by_its_generic_specialization(ops):
    names = [s.name for s in ops["rmsnorm"].specs]
    assert names[:2] == ["f32_n1024", "f32_n1024__generic"]
    assert all(n.endswith("__generic") == (k % 2 == 1) for k, n in enumerate(names))
    gen = spec_of(ops["rmsnorm"], "f32_n1024__generic")
    assert gen.options["specialize"] == "declared"
    fe = frontends.get("triton")
    assert fe.build_note(ops["rmsnorm"], spec_of(ops["rmsnorm"], "f32_n1024"), "sm_90") == ""
    note = fe.build_note(ops["rmsnorm"], gen, "sm_90")
    assert "differs from Triton's JIT" in note and "out, w, x tt.divisibility=16" in note


def test_a_spec_can_ask_for_only_what_it_declares(ops):
    op = ops["rmsnorm"]
    base = spec_of(op, "f32_n1024__generic")
    spec = dataclasses.replace(base, name="mine", options={**base.options, "specialize": "declared"})
    decl = dataclasses.replace(op, specs=(spec,))
    assert frontends.get("triton").expand_specs(decl) == (spec,)
    bad = dataclasses.replace(spec, options={**spec.options, "specialize": "always"})
    with pytest.raises(tp.FrontendError, match=r"options\['specialize'\] must be one of \('jit', 'declared'\)"):
        tp.plan(op, bad, "sm_90")
    per_target = dataclasses.replace(spec, options={**spec.options, "cuda": {"specialize": "jit"}})
    with pytest.raises(tp.FrontendError, match=r"options\['cuda'\] sets specialize; it must be the same"):
        tp.plan(op, per_target, "sm_90")


def test_do_not_specialize_is_respected(tmp_path):
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["x", "m"])
    def k(x, y, n, m, o, BLOCK: tl.constexpr):
        pass

    decl = OpDecl(name="k", kernel=k, args=(Tensor("x", rank=1), Tensor("y", rank=1), Value("n", "x.shape[0]"),
                                            Value("m", "y.shape[0]"), Value("o", "y.numel"), Constexpr("BLOCK")),
                  specs=(), reference=None, doc="", grid=("1",), frontend="triton")
    spec = Spec("s", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (32,), "y": (32,)},
                constexprs={"BLOCK": 16})
    assert jitspec.jit_hints(decl, spec, "sm_90", tp.jit_function(k, "t")) == {"y": "D", "o": "D"}
    spec1 = dataclasses.replace(spec, shapes={"x": (1,), "y": (1,)})
    assert jitspec.jit_hints(decl, spec1, "sm_90", tp.jit_function(k, "t")) == {"y": "D", "m": "1", "o": "1"}


def test_a_workspace_declared_divisible_is_compiled_so_and_not_guarded(ops):
    # the loader allocates a workspace itself (torch's allocator: aligned), so its alignment is no guard fact
    # (which the rule book would refuse: a guard's alignment names the op's tensors)
    op = ops["rmsnorm"]
    ws_op = dataclasses.replace(op, args=tuple(Workspace("w", shape=("4096",)) if a.name == "w" else a
                                               for a in op.args))
    spec = dataclasses.replace(spec_of(op, "f32_n4096__generic"), options={"num_warps": 8, "specialize": "declared",
                                                                         "divisible_by_16": ["w"]})
    p = tp.plan(ws_op, spec, "sm_90")
    assert (1,) in p.attrs and "w" not in p.alignment


def test_a_value_typed_wider_than_the_jit_would_is_noted(ops):
    op = ops["add"]
    wide = dataclasses.replace(op, args=tuple(Value("n_elements", "x.numel", type="i64") if a.name == "n_elements"
                                              else a for a in op.args))
    p = tp.plan(wide, spec_of(op, "f32"), "sm_90")
    assert "the JIT would pass n_elements as i32 (compiled i64)" in p.jit_difference
    assert tp.plan(op, spec_of(op, "f32"), "sm_90").jit_difference == ""
