"""Workspaces sized by the device, declared aligned, and launches bound by position (issue 23, items 3 and 5):
examples/triton/workspaces.py builds for sm_90 and gfx942, and the refusals name what to change."""

from __future__ import annotations

import dataclasses

import pytest

# The compile tier: its Python (the FlyDSL venv) has Triton; the workload venv has none.
pytestmark = pytest.mark.compile
pytest.importorskip("triton")

from flyship.bundle import manifest as M  # noqa: E402
from flyship.bundle import rules  # noqa: E402
from flyship.bundle.errors import BundleError  # noqa: E402
from flyship.compiler.frontends.base import FrontendError  # noqa: E402
from flyship.compiler.frontends.triton import planning as tp  # noqa: E402
from flyship.compiler.spec import Launch  # noqa: E402
from flyship.compiler.worker import load_spec_file  # noqa: E402
from tests.conftest import ROOT, run_build  # noqa: E402

SPEC_FILE = ROOT / "examples" / "triton" / "workspaces.py"


@pytest.fixture(scope="module")
def ws_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("ws") / "workspaces"
    r = run_build(SPEC_FILE, out, ["sm_90", "gfx942"], "-j", "2", "-v")  # -v: every variant's note
    return out, r


@pytest.fixture(scope="module")
def ws_ops():
    return {o.name: o for o in load_spec_file(str(SPEC_FILE)).ops}


def spec_named(op, name):
    return next(s for s in op.specs if s.name == name)


def test_a_workspace_of_one_row_per_cu_builds_and_its_guards_follow_each_targets_example(ws_bundle):
    bundle, _ = ws_bundle
    m = M.read(bundle)
    op = m.op("rmsnorm_bwd")
    names = [s.name for s in op.specializations]
    # the example's rows per program and device.cu_count evaluate per target (132 SMs, 304 CUs): one guard each
    assert names[:3] == ["f32_n4096__gfx942", "f32_n4096__sm_90", "f32_n4096__generic"]
    by = {s.name: s for s in op.specializations}
    assert "cdiv(x.shape[0], device.cu_count) % 16 == 0" in by["f32_n4096__sm_90"].guard.constraints
    assert "device.cu_count % 16 == 0" in by["f32_n4096__gfx942"].guard.constraints  # 304 CUs, as the JIT sees it
    for s in op.specializations:
        assert "partial" not in s.guard.alignment  # the loader allocates the workspace: no guard to hold
        for v in s.variants:
            assert v.workspaces == (M.Workspace("partial", ("device.cu_count", "x.shape[1]"), "float32"),)
            assert v.launch.grid[0] == "device.cu_count"
            n_parts = next(f for f in v.then[0].kernargs.fields if f.kernel_arg == "n_parts")
            assert (n_parts.kind, n_parts.expr) == ("expr", "device.cu_count")
            assert {f.arg for t in v.launches for f in t.kernargs.fields if f.kind == "workspace"} == {"partial"}


def test_a_workspace_sized_by_the_device_is_a_must_understand_key_of_4x(ws_bundle):
    # Loaders of 3.x and older refuse a workspace whose shape reads the device as a bundle mistake ("an output's
    # shape must not read the device"); written as 4.0, they refuse it with their version message instead.
    bundle, _ = ws_bundle
    m = M.read(bundle)
    assert "device_workspaces" in M.must_understand(m) and m.schema_version == "4.1"
    with pytest.raises(BundleError, match=r"expected 4\.1 for a bundle that uses device_workspaces, got '2\.2'"):
        rules.check_must_understand(dataclasses.replace(m, schema_version="2.2"))


def test_the_declared_aligned_workspace_is_compiled_divisible_in_the_generic_specialization(ws_ops):
    op = ws_ops["rmsnorm_bwd"]
    spec = spec_named(op, "f32_n4096__generic")
    assert spec.options["divisible_by_16"] == ["partial"]
    for launch, index in zip(op.launches, (4, 0)):  # partial is parameter 4 of kernel 1, 0 of kernel 2
        p = tp.plan(op.launch_view(launch), spec, "sm_90", op)
        assert p.attrs == {(index,): [["tt.divisibility", 16]]} and p.alignment == {}


def test_one_kernel_launched_twice_binds_each_launch_by_position(ws_bundle):
    bundle, _ = ws_bundle
    v = next(v for v in M.read(bundle).op("add3").specializations[0].variants if v.target == "sm_90a")
    assert [t.code_object.symbol for t in v.launches] == ["add_kernel", "add_kernel"]
    binds = [[(f.kernel_arg, f.kind, f.arg) for f in t.kernargs.fields if f.kind in ("pointer", "workspace")]
             for t in v.launches]
    assert binds == [[("x", "pointer", "x"), ("y", "pointer", "y"), ("out", "workspace", "xy")],
                     [("x", "workspace", "xy"), ("y", "pointer", "z"), ("out", "pointer", "out")]]
    files = rules.check_bundle_files(bundle, M.read(bundle))
    assert files


def test_the_table_notes_which_builds_differ_from_tritons_jit(ws_bundle):
    _, r = ws_bundle
    notes = r.stdout[r.stdout.index("notes:"):].splitlines()[1:]
    assert any(n.strip().startswith("add3 f32__generic sm_90a: differs from Triton's JIT") for n in notes)
    assert not any(" f32 sm_90a" in n or "f32_n4096__sm_90 " in n for n in notes)  # the JIT variants are the JIT's


def test_a_hint_naming_a_value_only_one_launch_takes_is_honoured_where_taken():
    ml = {o.name: o for o in load_spec_file(str(ROOT / "examples" / "triton" / "multilaunch.py")).ops}
    op = ml["rowsum_split"]
    base = spec_named(op, "f32__generic")
    spec = dataclasses.replace(base, options={**base.options, "divisible_by_16": ["x_row_stride"]})
    first, second = (tp.plan(op.launch_view(launch), spec, "sm_90", op) for launch in op.launches)
    assert (3,) in first.attrs and "x.stride[0] % 16 == 0" in first.constraints
    assert second.attrs == {}
    wrong = dataclasses.replace(base, options={**base.options, "divisible_by_16": ["nowhere"]})
    with pytest.raises(FrontendError, match=r"names 'nowhere', which is no tensor, output, scalar, Value or "
                                            r"workspace of the op \(\['chunk', 'n_cols', 'partial', 'x', "):
        tp.plan(op.launch_view(op.launches[1]), wrong, "sm_90", op)
    const = dataclasses.replace(base, options={**base.options, "divisible_by_16": ["SPLIT"]})
    with pytest.raises(FrontendError, match="names constexpr 'SPLIT'; a constexpr is compiled in"):
        tp.plan(op.launch_view(op.launches[0]), const, "sm_90", op)


def test_a_launch_binding_the_wrong_count_or_kind_is_refused_naming_the_parameter(ws_ops):
    op = ws_ops["add3"]
    spec = spec_named(op, "f32__generic")
    short = Launch(op.launches[0].kernel, args=["x", "y", "xy", "n"], grid=("1",))
    with pytest.raises(FrontendError, match=r"the Launch passes 4 arguments \['x', 'y', 'xy', 'n'\]; the kernel "
                                            r"add_kernel takes 5"):
        tp.plan(op.launch_view(short), spec, "sm_90", op)
    # A Constexpr may reach a runtime parameter (as in a single-launch op, CHANGELOG 0.2.0); a runtime value may not
    # reach a tl.constexpr: the swap is refused for the second, naming both.
    swapped = Launch(op.launches[0].kernel, args=["x", "y", "xy", "BLOCK", "n"], grid=("1",))
    with pytest.raises(FrontendError, match="passes runtime 'n' to the kernel's parameter 'BLOCK', which is a "
                                            "tl.constexpr; expected a Constexpr there"):
        tp.plan(op.launch_view(swapped), spec, "sm_90", op)


def test_the_rule_book_accepts_a_workspace_over_the_device_and_still_checks_its_expression():
    from flyship.bundle import expr as E

    slots = {"x": E.Slot(0, "tensor", 2)}
    rules.check_workspaces((M.Workspace("p", ("device.cu_count", "x.shape[1]"), "float32"),), slots, slots, "w")
    with pytest.raises(BundleError, match="y"):
        rules.check_workspaces((M.Workspace("p", ("device.cu_count", "y.shape[1]"), "float32"),), slots, slots, "w")
