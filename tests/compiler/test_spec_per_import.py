"""A spec file that declares other things per target at import (a constexpr a kernel module fixes from the arch,
an op declared for gfx950 only): each target's tasks follow that target's own import, so the bundle is the same
whatever the order of ``--arch`` (examples/flydsl/archspec.py)."""

from __future__ import annotations

import pytest

from flyship.bundle import manifest as M
from flyship.bundle.targets import parse_target
from flyship.compiler import declarations
from flyship.compiler.spec import Spec, SpecFile
from flyship.errors import CompileError

from ..conftest import ROOT, run_build

SPEC_FILE = ROOT / "examples" / "flydsl" / "archspec.py"


def _built(out) -> dict[tuple[str, str], tuple[list[str], tuple[int, int, int]]]:
    m = M.read(out)
    return {(o.name, s.name): ([v.target for v in s.variants], s.example.grid)
            for o in m.ops for s in o.specializations}


@pytest.mark.compile
def test_a_spec_that_declares_other_things_per_target_builds_the_same_bundle_in_either_arch_order(tmp_path):
    run_build(SPEC_FILE, tmp_path / "a", ["gfx942", "gfx950"], "-j", "2")
    run_build(SPEC_FILE, tmp_path / "b", ["gfx950", "gfx942"], "-j", "2")
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    assert _built(tmp_path / "a") == {
        # TILE_N fixed at import: 256 on gfx942 (4 tiles of a 1000-column row), 128 on gfx950 (8 tiles).
        ("scale_tiled", "f32__gfx942"): (["gfx942"], (400, 1, 1)),
        ("scale_tiled", "f32__gfx950"): (["gfx950"], (800, 1, 1)),
        ("scale_wide", "f32"): (["gfx950"], (200, 1, 1)),  # declared only by gfx950's import
    }


def _file(*specs: Spec, ns: str = "n") -> SpecFile:
    from flyship.compiler.spec import OpDecl, Output, Tensor

    op = OpDecl(name="k", kernel=None, args=(Tensor("x", rank=2), Output("out", like="x")), specs=specs,
                reference=None, doc="", grid=None, frontend="flydsl")
    return SpecFile(path="s.py", namespace=ns, ops=[op])


def _imports(**files: SpecFile) -> list[declarations.TargetImport]:
    return [declarations.TargetImport(k, (parse_target(k),), f) for k, f in sorted(files.items())]


F32 = dict(dtypes={"x": "float32"}, shapes={"x": (8, 8)})


@pytest.mark.cpu
def test_a_spec_declared_alike_on_every_target_is_kept_as_declared_and_one_declared_for_some_is_limited_to_them():
    same, extra = Spec("f32", **F32), Spec("wide", **F32)
    merged = declarations.merge(_imports(gfx942=_file(same), gfx950=_file(extra, Spec("f32", **F32))))
    (op,) = merged.ops
    assert [s.name for s in op.specs] == ["wide", "f32"]  # gfx950's order: wide is tried first there
    assert op.specs[1] is same
    assert op.specs[0].targets == ("gfx950",) and op.specs[0].for_target("gfx950").dtypes == {"x": "float32"}


@pytest.mark.cpu
def test_a_spec_that_differs_per_target_import_builds_each_targets_own_form():
    merged = declarations.merge(_imports(gfx942=_file(Spec("f", **F32, constexprs={"T": 256})),
                                         gfx950=_file(Spec("f", **F32, constexprs={"T": 128}))))
    (spec,) = merged.ops[0].specs
    assert spec.for_target("gfx942").constexprs == {"T": 256} and spec.for_target("gfx950").constexprs == {"T": 128}
    assert sorted(spec.targets) == ["gfx942", "gfx950"]


@pytest.mark.cpu
def test_imports_that_name_another_namespace_are_refused_naming_both_targets():
    with pytest.raises(CompileError, match="expected one namespace on every target, got 'a' when "
                                                             "imported for gfx942 and 'b' for gfx950"):
        declarations.merge(_imports(gfx942=_file(Spec("f", **F32), ns="a"), gfx950=_file(Spec("f", **F32), ns="b")))


@pytest.mark.cpu
def test_the_planning_groups_do_not_depend_on_the_arch_order():
    a = declarations.planning_groups([parse_target(t) for t in ("gfx950", "sm_90", "gfx942", "gfx942:xnack+")])
    b = declarations.planning_groups([parse_target(t) for t in ("gfx942:xnack+", "gfx942", "sm_90", "gfx950")])
    assert [k for k, _ in a] == [k for k, _ in b] == ["", "gfx942", "gfx950"]
