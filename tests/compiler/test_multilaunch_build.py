"""Ops that launch several kernels (issue 9, pattern 6) at build time: the two-phase Triton ops of
examples/triton/multilaunch.py build for gfx942, gfx950 and sm_90 with every launch's kernarg layout checked
against its own code object's metadata, workspace parameters bound as workspaces, and declaration mistakes
refused before anything compiles."""

from __future__ import annotations

from typing import Any

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import rules

from ..conftest import ROOT

pytestmark = pytest.mark.compile
triton = pytest.importorskip("triton", reason="needs triton 3.6 (the FlyDSL venv); it would compile the two-phase "
                                              "Triton ops")

from flyship.compiler.spec import (Constexpr, Launch, Output, Spec, SpecError, Tensor, Value,  # noqa: E402
                                   Workspace, namespace, op, run_spec_file)

SPEC_FILE = ROOT / "examples" / "triton" / "multilaunch.py"


def test_every_launch_builds_for_each_target_with_its_layout_checked_against_its_own_metadata(multilaunch_bundle):
    m = M.read(multilaunch_bundle)
    assert m.schema_version == "2.3"  # must-understand keys (docs/bundle-format.md)
    files = rules.check_bundle_files(multilaunch_bundle, m)  # every code object against its launch
    op = m.op("rowsum_split")
    assert [s.name for s in op.specializations] == [n + g for n in ("f32", "bf16", "f16") for g in ("", "__generic")]
    for s in op.specializations:
        assert sorted(v.target for v in s.variants) == ["gfx942", "gfx950", "sm_90a"]
        for v in s.variants:
            assert [t.code_object.symbol for t in v.launches] == ["rowsum_partial_kernel", "rowsum_combine_kernel"]
            assert v.code_object.file != v.then[0].code_object.file and v.then[0].code_object.file in files
            assert v.workspaces == (M.Workspace("partial", ("x.shape[0]", "8"), "float32", zero=False),)
            for t in v.launches:
                if t.code_object.format == "hsaco":
                    rules.check_layout(t.kernargs, t.metadata, f"{s.name} {t.code_object.symbol}")
                assert t.proof.method == "frontend-binary"
            kinds = [(f.kind, f.arg) for f in v.kernargs.fields if f.kind in ("pointer", "workspace")]
            assert kinds == [("pointer", "x"), ("workspace", "partial")]
            kinds = [(f.kind, f.arg) for f in v.then[0].kernargs.fields if f.kind in ("pointer", "workspace")]
            assert kinds == [("workspace", "partial"), ("pointer", "y")]
            assert v.launch.grid == ("x.shape[0]", "8", "1") and v.then[0].launch.grid == ("x.shape[0]", "1", "1")
        assert s.example.grid == (64, 8, 1)  # the first launch's grid at the example
        assert "x.stride[1] == 1" in s.guard.constraints


def test_a_zeroed_workspace_and_a_constexpr_in_a_grid_that_only_the_first_kernel_takes(multilaunch_bundle):
    s, generic = M.read(multilaunch_bundle).op("rowsum_atomic").specializations  # the JIT's variant, the generic
    assert generic.name == "f32__generic"
    for v in s.variants:
        assert v.workspaces[0].zero and v.workspaces[0].shape == ("x.shape[0]",)
        assert v.then[0].launch.grid[0] == "cdiv(x.shape[0], 256)"


def test_the_build_summary_shows_every_launch_with_its_own_symbol_registers_lds_and_occupancy(multilaunch_build):
    bundle, r = multilaunch_build
    lines = r.stdout.splitlines()
    head = lines[0].split()
    assert head[:5] == ["op", "spec", "arch", "launch", "kernel"]
    table = [ln.split(None, 8) for ln in lines[2:lines.index("")]]  # the last cell: kernarg, occupancy, compile s
    m = M.read(bundle)
    expected = sorted((o.name, s.name, v.target, f"{k}/{len(v.launches)}", t.code_object.symbol,
                       str(t.metadata.vgpr_count), str(t.metadata.sgpr_count), str(t.metadata.group_segment_fixed_size),
                       str(t.kernargs.size))
                      for o in m.ops for s in o.specializations for v in s.variants
                      for k, t in enumerate(v.launches, 1))
    assert len(expected) == 2 * sum(len(s.variants) for o in m.ops for s in o.specializations)
    assert sorted(tuple(c[:8]) + (c[8].split()[0],) for c in table) == expected
    for c in table:
        *_, compile_s = c[8].split()
        assert ("waves/SIMD" in c[8] or "blocks/SM" in c[8]) and (compile_s == "-") == (c[3] == "2/2")


def declare(**kwargs) -> Any:
    """Declare one op in a throwaway spec file; returns its declaration."""

    def run() -> None:
        namespace("t")
        op("two", **kwargs)

    return run_spec_file("<test>", run).ops[0]


def _phase_kernels():
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "triton"))
    try:
        from tl_rowsum_split import rowsum_combine_kernel, rowsum_partial_kernel
    finally:
        sys.path.pop(0)
    return rowsum_partial_kernel, rowsum_combine_kernel


ARGS = [Tensor("x", rank=2), Output("y", shape=("x.shape[0]",), dtype="float32"),
        Workspace("partial", shape=("x.shape[0]", "SPLIT")), Value("n_cols", "x.shape[1]"),
        Value("x_row_stride", "x.stride[0]"), Value("chunk", "cdiv(x.shape[1], SPLIT)"), Constexpr("SPLIT"),
        Constexpr("BLOCK")]
SPECS = [Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 64)}, constexprs={"SPLIT": 2, "BLOCK": 64})]


def launches(first_args=("x", "partial", "n_cols", "x_row_stride", "chunk", "SPLIT", "BLOCK")):
    p1, p2 = _phase_kernels()
    return [Launch(p1, args=list(first_args), grid=("x.shape[0]", "SPLIT")),
            Launch(p2, args=["partial", "y", "SPLIT"], grid=("x.shape[0]",))]


def test_a_well_formed_two_launch_declaration_is_accepted():
    decl = declare(kernel=launches(), args=ARGS, specs=SPECS)
    assert decl.name == "two" and len(decl.kernel) == 2


@pytest.mark.parametrize("change, message", [
    (dict(kernel=launches(("x", "partial", "n_cols", "row_stride", "chunk", "SPLIT", "BLOCK"))),
     "names ['row_stride'], which the op's args do not declare"),
    (dict(args=[*ARGS, Value("spare", "x.shape[0]")]), "['spare'] are passed to no Launch"),
    (dict(args=[Workspace("partial", shape=("x.shape[0]",), dtype="float128") if a.name == "partial" else a
                for a in ARGS]), "workspace partial: dtype: expected a dtype name (float64, float32"),
    (dict(args=[Workspace("partial", shape=("z.shape[0]",)) if a.name == "partial" else a for a in ARGS]),
     "workspace partial: shape 'z.shape[0]'"),
    (dict(grid=("x.shape[0]",)), "each Launch declares its grid; remove the op's grid="),
    # judged by the rule book (one judge per rule, issue 31): the spec API asks it, with its words
    (dict(kernel=launches() * 9), "op two: kernel=[Launch(...), ...]: expected at most 16 launches, got 18"),
    (dict(args=[*ARGS, Tensor("x", rank=1)]), "argument names repeat: ['x', 'x', "),
    (dict(args=[Workspace("partial", shape=("0",)) if a.name == "partial" else a for a in ARGS]),
     "workspace partial: expected at least one element at the example, got shape [0] from ('0',); the loader "
     "cannot launch with an empty workspace (every call would fall back): for a dummy buffer declare shape=(\"1\",)"),
    (dict(args=[Workspace("partial", shape=("x.shape[0]", "SPLIT - 2")) if a.name == "partial" else a
                for a in ARGS]), "workspace partial: expected at least one element at the example, got shape [8, 0]"),
])
def test_declaration_mistakes_of_a_multi_launch_op_are_spec_errors(change, message):
    with pytest.raises(SpecError, match=__import__("re").escape(message)):
        declare(**{**dict(kernel=launches(), args=ARGS, specs=SPECS), **change})


def test_a_launch_entry_must_list_its_parameters_as_names():
    p1, _ = _phase_kernels()
    with pytest.raises(SpecError, match="args must be a list of strings"):
        Launch(p1, args="x, partial", grid=("1",))


LAUNCH_OPTIONS_SPEC = """
import sys
sys.path.insert(0, {folder!r})
from tl_rowsum_split import rowsum_combine_kernel, rowsum_partial_kernel
from flyship.compiler.spec import Constexpr, Launch, Output, Spec, Tensor, Value, Workspace, namespace, op
namespace("t")
op("rowsum", kernel=[Launch(rowsum_partial_kernel, args=["x", "partial", "n_cols", "x_row_stride", "chunk", "SPLIT",
                                                         "BLOCK"], grid=("x.shape[0]", "SPLIT")),
                     Launch(rowsum_combine_kernel, args=["partial", "y", "SPLIT"], grid=("x.shape[0]",),
                            options={{"num_warps": 1}})],
   args=[Tensor("x", rank=2), Output("y", shape=("x.shape[0]",), dtype="float32"),
         Workspace("partial", shape=("x.shape[0]", "SPLIT")), Value("n_cols", "x.shape[1]"),
         Value("x_row_stride", "x.stride[0]"), Value("chunk", "cdiv(x.shape[1], SPLIT)"), Constexpr("SPLIT"),
         Constexpr("BLOCK")],
   specs=[Spec("f32", dtypes={{"x": "float32"}}, shapes={{"x": (8, 64)}}, constexprs={{"SPLIT": 2, "BLOCK": 64}},
               options={{"num_warps": 8, "specialize": "declared"}}, constraints=("x.stride[1] == 1",))])
"""


def test_each_launch_runs_with_its_own_num_warps_and_the_spec_s_is_the_default(tmp_path):
    # Issue 34 item 2: every launch took the spec's num_warps (a copy kernel ran with 32 warps).
    from ..conftest import run_build

    spec = tmp_path / "spec.py"
    spec.write_text(LAUNCH_OPTIONS_SPEC.format(folder=str(ROOT / "examples" / "triton")))
    run_build(spec, tmp_path / "o", ["gfx942"])
    (v,) = M.read(tmp_path / "o").op("rowsum").specializations[0].variants
    assert v.launch.block == (8 * 64, 1, 1)  # the spec's num_warps=8, on a 64-wide wavefront
    assert v.then[0].launch.block == (1 * 64, 1, 1)  # the Launch's own num_warps=1


def test_a_launch_s_options_are_laid_over_the_spec_s_for_that_kernel_only():
    from flyship.compiler.cache import task_key
    from flyship.compiler.frontends.triton import planning as tp

    p1, p2 = _phase_kernels()
    spec = Spec("f32", dtypes={"x": "float32"}, shapes={"x": (8, 64)}, constexprs={"SPLIT": 2, "BLOCK": 64},
                options={"num_warps": 8, "hip": {"num_stages": 1}})
    own = [Launch(p1, args=["x", "partial", "n_cols", "x_row_stride", "chunk", "SPLIT", "BLOCK"],
                  grid=("x.shape[0]", "SPLIT")),
           Launch(p2, args=["partial", "y", "SPLIT"], grid=("x.shape[0]",), options={"gfx942": {"num_warps": 2}})]
    decl = declare(kernel=own, args=ARGS, specs=[spec])
    first, second = (tp.plan(decl.launch_view(k), decl.specs[0], "gfx942", decl) for k in decl.launches)
    assert (first.num_warps, second.num_warps) == (8, 2) and second.options["num_stages"] == 1
    assert tp.plan(decl.launch_view(decl.launches[1]), decl.specs[0], "sm_90", decl).num_warps == 8  # gfx942 only
    plain = declare(kernel=launches(), args=ARGS, specs=[spec])
    keys = {task_key(d, d.specs[0], "gfx942", {}, {}) for d in (decl, plain)}
    assert len(keys) == 2  # a Launch's options are part of the build cache's key
    with pytest.raises(SpecError, match=r"options sets \['specialize'\], which belong to the whole specialization"):
        Launch(p2, args=["partial", "y", "SPLIT"], grid=("1",), options={"specialize": "jit"})
    with pytest.raises(SpecError, match=r"options must be a dict of launch options"):
        Launch(p2, args=["partial", "y", "SPLIT"], grid=("1",), options=[("num_warps", 2)])
