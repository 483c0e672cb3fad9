"""The Triton frontend on the CPU: every example op for sm_90 and gfx942, kernargs read back from the
binaries, hidden scratch pointers, specialization vs guard, refusals, and flyc-build end to end."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flyship.bundle import expr as E
from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.cubin import CubinFile

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile
triton = pytest.importorskip("triton", reason="needs triton 3.6 (the FlyDSL venv); it would compile Triton kernels")

from flyship.compiler import frontends  # noqa: E402
from flyship.compiler.frontends import BuildContext, FrontendError  # noqa: E402
from flyship.compiler.frontends.triton import compiling as tc  # noqa: E402
from flyship.compiler.frontends.triton import planning as tp  # noqa: E402
from flyship.compiler.spec import Constexpr, OpDecl, Output, Spec, Tensor, Value  # noqa: E402
from flyship.compiler.worker import load_spec_file  # noqa: E402

SPEC_FILE = ROOT / "examples" / "triton" / "ops.py"
TARGETS = ("sm_90", "gfx942")
WAVE = {"sm_90": 32, "gfx942": 64}


@pytest.fixture(scope="module")
def spec_file():
    return load_spec_file(str(SPEC_FILE))


@pytest.fixture(scope="module")
def ops(spec_file) -> dict[str, OpDecl]:
    return {o.name: o for o in spec_file.ops}


@pytest.fixture
def ctx(tmp_path) -> BuildContext:
    return BuildContext(workdir=tmp_path, toolchain=None, keep_ir=True)


def spec_of(op: OpDecl, name: str) -> Spec:
    return next(s for s in op.specs if s.name == name)


def build(op: OpDecl, spec: Spec, target: str, tmp: Path):
    return frontends.compile_variant(frontends.get("triton"), op, spec, target,
                                     BuildContext(workdir=tmp, toolchain=None, keep_ir=True))


# One specialization per op and target keeps this file fast; flyc-build below compiles every one.
SAMPLES = [("add", "f32"), ("add", "bf16"), ("softmax", "f16_n4096"), ("rmsnorm", "bf16_n1024"),
           ("gemm", "bf16_aligned"), ("gemm", "f16"), ("gemm_tma", "bf16")]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op_name,spec_name", SAMPLES)
def test_each_example_builds_with_a_layout_read_from_its_own_binary(ops, op_name, spec_name, target, tmp_path):
    op = ops[op_name]
    spec = spec_of(op, spec_name)
    v = build(op, spec, target, tmp_path)
    rules.check_layout(v.kernargs, v.metadata, f"{op_name}.{spec_name}.{target}")
    if target == "sm_90":
        assert v.format == "cubin" and v.target == "sm_90a" and v.code_object_version is None
        meta = CubinFile(v.code_object).kernel_metadata(v.symbol, names=[a.name for a in v.metadata.args],
                                                        pointer_ordinals=[i for i, a in enumerate(v.metadata.args)
                                                                          if a.value_kind == "global_buffer"])
        assert "ptxas" in v.toolchain and ".target sm_90a" in v.isa
    else:
        assert v.format == "hsaco" and v.target == "gfx942" and v.code_object_version in (5, 6)
        meta = CodeObjectFile(v.code_object).kernel_metadata(v.symbol)
        assert "amdgcn" in v.isa or ".amdhsa_kernel" in v.isa
    assert [(a.offset, a.size, a.value_kind) for a in meta.args] == \
        [(a.offset, a.size, a.value_kind) for a in v.metadata.args]
    # Kernel parameters in order, then Triton's two hidden pointers, each bound once.
    runtime = [a for a in op.args if not isinstance(a, Constexpr)]
    fields = sorted(v.kernargs.fields, key=lambda f: f.offset)
    assert [f.kernel_arg for f in fields] == [a.name for a in runtime] + ["global_scratch", "profile_scratch"]
    for f, a in zip(fields, runtime):
        if isinstance(a, Value):  # an exact size / stride is passed as such, so the loader sees the strides taken
            assert f.kind in ("shape", "stride", "expr") and f.type == a.type, (f, a)
            text = f.expr if f.kind == "expr" else f"{f.arg}.{f.kind}[{f.dim}]"
            assert E.canonical(text) == E.substitute(a.expr, spec.constexprs)
        else:
            assert f.kind == {Tensor: "pointer", Output: "pointer"}.get(type(a), "scalar"), (f, a)
            assert f.arg == a.name
    assert fields[-1].kind == "null"
    # Triton's own binary, unchanged.
    assert v.proof.method == "frontend-binary"
    assert v.proof.reference_sha256 == hashlib.sha256(v.code_object).hexdigest()
    assert v.toolchain["triton"] == triton.__version__


@pytest.mark.parametrize("target", TARGETS)
def test_block_is_num_warps_times_the_targets_warp_size(ops, target, tmp_path):
    for op_name, spec_name in [("add", "f16"), ("gemm", "bf16_aligned"), ("softmax", "f32_n16384")]:
        spec = spec_of(ops[op_name], spec_name)
        v = build(ops[op_name], spec, target, tmp_path / op_name)
        warps = tp.plan(ops[op_name], spec, target).num_warps
        assert v.launch.block == (warps * WAVE[target], 1, 1)
        assert v.metadata.wavefront_size == WAVE[target]
        if target == "sm_90":  # ptxas records .reqntid: the launch must use exactly that block
            assert v.metadata.reqd_workgroup_size == v.launch.block
        assert v.launch.block[0] <= v.metadata.max_flat_workgroup_size


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_shared_memory_is_tritons_shared_bytes(ops, target, tmp_path):
    op = ops["gemm_tma"]
    spec = spec_of(op, "bf16")
    v = build(op, spec, target, tmp_path / "v")
    p = tp.plan(op, spec, target)
    k = tc.run_triton(p, tc._targets.parse_target(target), BuildContext(workdir=tmp_path / "k", toolchain=None), "t")
    assert v.launch.dynamic_lds == str(k.metadata.shared) and int(k.metadata.shared) > 0


def test_grid_expressions_equal_tritons_own_grid_functions(spec_file, ops, tmp_path):
    import tl_elementwise as elementwise  # the spec file put examples/triton on sys.path
    import tl_gemm as gemm
    import tl_inplace as inplace
    import tl_rmsnorm as rmsnorm
    import tl_softmax as softmax

    own = {
        "add": lambda meta, sh: elementwise.add_grid(meta, sh["x"][0] * sh["x"][1]),
        "softmax": lambda meta, sh: softmax.softmax_grid(meta, sh["x"][0]),
        "softmax_bwd": lambda meta, sh: softmax.softmax_grid(meta, sh["y"][0]),  # one program per row too
        "rmsnorm": lambda meta, sh: rmsnorm.rmsnorm_grid(meta, sh["x"][0]),
        "gemm": lambda meta, sh: gemm.gemm_grid(meta, sh["a"][0], sh["b"][0]),
        "gemm_tma": lambda meta, sh: gemm.gemm_tma_grid(meta, sh["a"][0], sh["b"][0]),
        "fused_add_rmsnorm": lambda meta, sh: inplace.fused_add_rmsnorm_grid(meta, sh["x"][0]),
        "accumulate": lambda meta, sh: inplace.accumulate_grid(meta, sh["acc"][0]),
        "rowsum_atomic_out": lambda meta, sh: (sh["x"][0], 4),  # a row's 4 programs add into acc[r]
    }
    assert set(own) == set(ops)
    probes = [(1, 1), (7, 1000), (1000, 7), (129, 4097), (4096, 8192)]
    for op in spec_file.ops:
        for spec in op.specs:
            p = tp.plan(op, spec, "sm_90")
            for m, n in probes:
                shapes = {"x": (m, n), "y": (m, n), "dy": (m, n), "w": (n,), "a": (m, n), "b": (n, n),
                          "residual": (m, n), "acc": (m * n,)}
                shapes.update({o.name: tuple(E.evaluate_with_shapes(e, shapes) for e in op.output_shape(o))
                               for o in op.outputs})
                got = tuple(E.evaluate_with_shapes(g, shapes) for g in p.grid)
                want = tuple(own[op.name](spec.constexprs, shapes))
                assert got == want + (1,) * (3 - len(want)), (op.name, spec.name, m, n)
    v = build(ops["gemm"], spec_of(ops["gemm"], "bf16"), "gfx942", tmp_path)
    sh = ops["gemm"].example_shapes(spec_of(ops["gemm"], "bf16"))
    assert v.example_grid == (gemm.gemm_grid(spec_of(ops["gemm"], "bf16").constexprs, sh["a"][0], sh["b"][0])[0], 1, 1)


def test_a_tma_kernel_gets_scratch_on_sm90_and_null_on_gfx942(ops, tmp_path):
    op = ops["gemm_tma"]
    spec = spec_of(op, "f16")
    nv = build(op, spec, "sm_90", tmp_path / "nv")
    amd = build(op, spec, "gfx942", tmp_path / "amd")
    # What Triton itself would allocate: metadata.global_scratch_size per program, its alignment.
    k = tc.run_triton(tp.plan(op, spec, "sm_90"), tc._targets.parse_target("sm_90"),
                      BuildContext(workdir=tmp_path / "k", toolchain=None), "t")
    assert k.metadata.global_scratch_size > 0
    g = next(f for f in nv.kernargs.fields if f.kernel_arg == "global_scratch")
    assert (g.kind, g.bytes_per_program, g.align) == ("scratch", k.metadata.global_scratch_size,
                                                      k.metadata.global_scratch_align)
    assert g.bytes_per_program % 128 == 0  # whole TMA descriptors (128 bytes each)
    assert next(f for f in amd.kernargs.fields if f.kernel_arg == "global_scratch").kind == "null"
    for v in (nv, amd):
        assert next(f for f in v.kernargs.fields if f.kernel_arg == "profile_scratch").kind == "null"


@pytest.mark.parametrize("target", TARGETS)
def test_a_plain_kernel_passes_null_for_both_hidden_pointers(ops, target, tmp_path):
    v = build(ops["softmax"], spec_of(ops["softmax"], "bf16_n1024"), target, tmp_path)
    hidden = [f for f in v.kernargs.fields if f.kernel_arg in tc.HIDDEN_PARAMS]
    assert [(f.kind, f.type, f.size) for f in hidden] == [("null", "ptr", 8)] * 2


def test_divisibility_is_compiled_only_where_the_guard_demands_it(ops, tmp_path):
    # the generic specializations (options["specialize"] == "declared") compile exactly what the spec declares;
    # the JIT's variants before them are tests/compiler/test_triton_jit.py's
    op = ops["gemm"]
    for spec_name, want in [("bf16_aligned__generic", {"a", "b", "c", "stride_am", "stride_bn", "stride_cm"}),
                            ("bf16__generic", set())]:
        spec = spec_of(op, spec_name)
        p = tp.plan(op, spec, "sm_90")
        k = tc.run_triton(p, tc._targets.parse_target("sm_90"), BuildContext(workdir=tmp_path / spec_name,
                                                                            toolchain=None), "t")
        head = re.search(r"tt\.func public @gemm_kernel\((.*?)\)\s*(attributes|\{)", k.asm["ttir"], re.S).group(1)
        params = re.findall(r"%(\w+): [^{,]+(\{[^}]*\})?", head)
        names = [a.name for a in op.args if not isinstance(a, Constexpr)]
        assert len(params) == len(names)
        specialized = {n for n, (_, attrs) in zip(names, params) if "tt.divisibility = 16" in attrs}
        assert specialized == want
        v = build(op, spec, "sm_90", tmp_path / (spec_name + "v"))
        pointers = {n for n in want if n in ("a", "b", "c")}
        assert {k for k, a in v.alignment.items() if a >= 16} == pointers
        for n in want - pointers:
            expr = next(a.expr for a in op.args if a.name == n)
            assert f"{expr} % 16 == 0" in v.constraints


def test_ints_are_never_specialized_to_one_behind_the_guards_back(ops, tmp_path):
    # Triton's JIT would turn an int argument equal to 1 into a constant; the explicit signature keeps it a
    # parameter, so a kernel built from a 1-element example still reads n_elements at run time (in the generic
    # specialization; the JIT's variant guards n_elements == 1: tests/compiler/test_triton_jit.py).
    op = ops["add"]
    spec = dataclasses.replace(spec_of(op, "f32__generic"), shapes={"x": (1, 1), "y": (1, 1)})
    v = build(op, spec, "sm_90", tmp_path)
    f = next(f for f in v.kernargs.fields if f.kernel_arg == "n_elements")
    assert (f.kind, f.expr, f.type) == ("expr", "x.numel", "i32")
    assert v.example_grid == (1, 1, 1)


def test_32_bit_values_are_range_guarded(ops):
    p = tp.plan(ops["add"], spec_of(ops["add"], "f32"), "sm_90")
    assert "x.numel <= 2147483647" in p.constraints
    assert not any(">=" in c for c in p.constraints)  # numel is never negative: no lower bound needed
    assert tp._range_constraints("x.shape[0] - 5", "i32") == ["x.shape[0] - 5 >= -2147483648",
                                                              "x.shape[0] - 5 <= 2147483647"]
    assert tp._range_constraints("x.numel", "i64") == []


def test_per_target_options_override_the_common_ones(ops):
    spec = spec_of(ops["gemm"], "bf16_aligned")
    assert tp.plan(ops["gemm"], spec, "sm_90").options["num_stages"] == 3
    assert tp.plan(ops["gemm"], spec, "gfx942").options["num_stages"] == 2


def test_a_block_over_the_targets_limit_is_refused_before_compiling(ops):
    op = ops["softmax"]
    spec = dataclasses.replace(spec_of(op, "f32_n1024"), options={"num_warps": 32})
    with pytest.raises(FrontendError, match=r"num_warps=32 gives a block of 2048 threads \(32 x warp size 64\), "
                                            r"over the target's limit of 1024; use num_warps <= 16"):
        tp.plan(op, spec, "gfx942")
    assert tp.plan(op, spec, "sm_90").num_warps * 32 == 1024  # the same warps fit a 32-wide target
    with pytest.raises(FrontendError, match="block of 2048 threads"):
        tp.plan(op, dataclasses.replace(spec, options={"num_warps": 64}), "sm_90")


def test_too_much_shared_memory_is_refused_with_the_numbers(ops, tmp_path):
    op = ops["gemm_tma"]
    spec = dataclasses.replace(spec_of(op, "bf16"), constexprs={"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 128},
                               options={"num_warps": 8, "num_stages": 4})
    with pytest.raises(FrontendError, match=r"uses \d+ bytes of LDS / shared memory \(\d+ dynamic \+ \d+ static\), "
                                            r"over the target's 232448-byte per-workgroup limit; use smaller tiles "
                                            r"or fewer stages"):
        build(op, spec, "sm_90", tmp_path)


def test_a_kernel_that_spills_is_refused_unless_the_spec_allows_scratch(ops, tmp_path):
    op = ops["gemm"]
    spec = dataclasses.replace(spec_of(op, "bf16"), constexprs={"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128,
                                                                 "GROUP_M": 8},
                               options={"num_warps": 8, "num_stages": 4})
    with pytest.raises(FrontendError, match=r"spills to scratch / local memory \(\d+ bytes per work-item\); reduce "
                                            r"register pressure or set Spec\(allow_scratch=True\)"):
        build(op, spec, "gfx942", tmp_path / "refused")
    v = build(op, dataclasses.replace(spec, allow_scratch=True), "gfx942", tmp_path / "allowed")
    assert v.metadata.private_segment_fixed_size > 0


def test_options_the_bundle_cannot_launch_are_refused(ops):
    op = ops["add"]
    for opt, msg in [({"num_ctas": 2}, "num_ctas=2 is not supported"), ({"launch_pdl": True}, "launch_pdl"),
                     ({"num_warps": 3}, "power of two"), ({"bogus": 1}, r"options \['bogus'\] are not Triton"),
                     ({"num_warp": 8}, "did you mean 'num_warps' for 'num_warp'"),
                     ({"cuda": {"divisible_by_16": ["x"]}}, "must be the same for every target"),
                     ({"nvidia": {"num_warps": 8}}, "neither 'cuda' nor 'hip' nor a known target ID"),
                     ({"gfx0942": {"num_warps": 8}}, "did you mean 'gfx942'")]:
        spec = dataclasses.replace(spec_of(op, "f32"), options=opt)
        with pytest.raises(FrontendError, match=msg):
            tc.run_triton(tp.plan(op, spec, "sm_90"), tc._targets.parse_target("sm_90"),
                          BuildContext(workdir=Path("/nonexistent"), toolchain=None), "where")


def test_spec_args_must_be_the_kernels_parameters(ops):
    op = ops["add"]
    bad = dataclasses.replace(op, args=(op.args[1], op.args[0], *op.args[2:]))
    with pytest.raises(FrontendError, match=r"args \['y', 'x', 'out', 'n_elements', 'BLOCK'\] must be the kernel "
                                            r"add_kernel's parameters \['x', 'y', 'out', 'n_elements', 'BLOCK'\]"):
        tp.plan(bad, spec_of(op, "f32"), "sm_90")


def test_an_example_outside_its_own_guard_is_refused(ops, tmp_path):
    op = ops["softmax"]
    spec = dataclasses.replace(spec_of(op, "f32_n1024"), shapes={"x": (4, 2000)})
    with pytest.raises(FrontendError, match=r"violates the guard constraint 'x.shape\[1\] <= 1024'"):
        build(op, spec, "sm_90", tmp_path)


def test_an_autotuned_kernel_is_refused_with_what_to_do_instead():
    from triton.runtime.autotuner import Autotuner

    import tl_elementwise as elementwise

    tuned = triton.autotune(configs=[triton.Config({"BLOCK": 1024})], key=["n_elements"])(elementwise.add_kernel)
    assert isinstance(tuned, Autotuner)
    with pytest.raises(FrontendError, match="declare each config as a Spec"):
        tp.jit_function(tuned, "op add")


def test_flyc_build_writes_a_bundle_for_sm90_and_gfx942(tmp_path):
    out = tmp_path / "triton"
    run_build(SPEC_FILE, out, ["sm_90", "gfx942"], "-j", "2")
    m = M.read(out)
    assert m.namespace == "flyship_triton" and m.build.frontends == {"triton": triton.__version__}
    assert {o.name for o in m.ops} == {"add", "softmax", "softmax_bwd", "rmsnorm", "gemm", "gemm_tma",
                                            "fused_add_rmsnorm", "accumulate", "rowsum_atomic_out"}
    assert m.op("softmax").backward.op == "softmax_bwd"
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    scratch = set()
    for op in m.ops:
        assert op.frontend == "triton"
        for s in op.specializations:
            assert sorted(v.target for v in s.variants) == ["gfx942", "sm_90a"]  # Triton builds capability 90 as sm_90a
            for v in s.variants:
                data = (out / v.code_object.file).read_bytes()
                assert hashlib.sha256(data).hexdigest() == v.code_object.sha256 == v.proof.reference_sha256
                if v.code_object.format == "cubin":
                    meta = CubinFile(data).kernel_metadata(v.code_object.symbol)
                    sm = re.search(r"sm=(\w+)", subprocess.run([str(cuobjdump), "-elf", str(out / v.code_object.file)],
                                                                capture_output=True, text=True).stdout).group(1)
                    assert sm == "90a"
                else:
                    meta = CodeObjectFile(data).kernel_metadata(v.code_object.symbol)
                assert [(a.offset, a.size) for a in meta.args] == [(a.offset, a.size) for a in v.metadata.args]
                rules.check_layout(v.kernargs, v.metadata, f"{op.name}.{s.name}.{v.target}")
                scratch |= {(op.name, v.target) for f in v.kernargs.fields if f.kind == "scratch"}
            assert tuple(s.example.grid) == tuple(E.evaluate_with_shapes(g, s.example.shapes) for g in
                                                  s.variants[0].launch.grid)
    assert scratch == {("gemm_tma", "sm_90a")}


INTERPRET_SOFTMAX_BWD = """
import torch
from tl_softmax import softmax_bwd_kernel, softmax_kernel
import references as R
for dt in (torch.float32, torch.bfloat16):
    for m, n, block in ((5, 1000, 1024), (3, 3000, 4096), (2, 1, 1024)):
        dy, x = torch.randn(m, n).to(dt), torch.randn(m, n).to(dt)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        softmax_kernel[(m,)](x, y, x.stride(0), y.stride(0), n, BLOCK_N=block)
        softmax_bwd_kernel[(m,)](dy, y, dx, dy.stride(0), y.stride(0), dx.stride(0), n, BLOCK_N=block)
        torch.testing.assert_close(dx, R.softmax_bwd_ref(dy, y), **R.TOLERANCES[dt])
        xr = x.float().requires_grad_()
        (torch.softmax(xr, -1) * dy.float()).sum().backward()
        tol = R.TOLERANCES[dt] if dt == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(dx.float(), xr.grad, **tol)
print("ok")
"""


def test_the_softmax_backward_kernel_gives_autograds_gradient_under_tritons_interpreter():
    # TRITON_INTERPRET=1 runs the @triton.jit kernels on the CPU (read when the kernels are defined: a subprocess).
    r = subprocess.run([sys.executable, "-c", INTERPRET_SOFTMAX_BWD], cwd=ROOT / "examples" / "triton",
                       env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_a_constant_value_adds_no_guard_and_one_out_of_its_range_is_refused():
    assert tp._range_constraints("0", "i32") == []  # Value("x", "0"): no trivial "0 <= 2147483647" guard
    assert tp._range_constraints("x.shape[0] - 1", "i32") == ["x.shape[0] - 1 >= -2147483648",
                                                              "x.shape[0] - 1 <= 2147483647"]
    with pytest.raises(FrontendError, match=r"Value expression '3000000000' is 3000000000; expected a value in "
                                            r"-2147483648\.\.2147483647 for its type i32"):
        tp._range_constraints("3000000000", "i32")
