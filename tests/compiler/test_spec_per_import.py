"""A spec file that declares other things per target at import: how the per-target imports merge into one spec file
(``compiler/declarations.py``), each target keeping its own form, whatever the order of ``--arch``. The build of
examples/flydsl/archspec.py in either arch order is in test_spec_per_import_build.py (compile tier)."""

from __future__ import annotations

import pytest

from flyship.bundle.targets import parse_target
from flyship.compiler import declarations
from flyship.compiler.spec import Spec, SpecFile
from flyship.errors import CompileError

pytestmark = pytest.mark.cpu


def _file(*specs: Spec, ns: str = "n") -> SpecFile:
    from flyship.compiler.spec import OpDecl, Output, Tensor

    op = OpDecl(name="k", kernel=None, args=(Tensor("x", rank=2), Output("out", like="x")), specs=specs,
                reference=None, doc="", grid=None, frontend="flydsl")
    return SpecFile(path="s.py", namespace=ns, ops=[op])


def _imports(**files: SpecFile) -> list[declarations.TargetImport]:
    return [declarations.TargetImport(k, (parse_target(k),), f) for k, f in sorted(files.items())]


F32 = dict(dtypes={"x": "float32"}, shapes={"x": (8, 8)})


def test_a_spec_declared_alike_on_every_target_is_kept_as_declared_and_one_declared_for_some_is_limited_to_them():
    same, extra = Spec("f32", **F32), Spec("wide", **F32)
    merged = declarations.merge(_imports(gfx942=_file(same), gfx950=_file(extra, Spec("f32", **F32))))
    (op,) = merged.ops
    assert [s.name for s in op.specs] == ["wide", "f32"]  # gfx950's order: wide is tried first there
    assert op.specs[1] is same
    assert op.specs[0].targets == ("gfx950",) and op.specs[0].for_target("gfx950").dtypes == {"x": "float32"}


def test_a_spec_that_differs_per_target_import_builds_each_targets_own_form():
    merged = declarations.merge(_imports(gfx942=_file(Spec("f", **F32, constexprs={"T": 256})),
                                         gfx950=_file(Spec("f", **F32, constexprs={"T": 128}))))
    (spec,) = merged.ops[0].specs
    assert spec.for_target("gfx942").constexprs == {"T": 256} and spec.for_target("gfx950").constexprs == {"T": 128}
    assert sorted(spec.targets) == ["gfx942", "gfx950"]


def test_imports_that_name_another_namespace_are_refused_naming_both_targets():
    with pytest.raises(CompileError, match="expected one namespace on every target, got 'a' when "
                                                             "imported for gfx942 and 'b' for gfx950"):
        declarations.merge(_imports(gfx942=_file(Spec("f", **F32), ns="a"), gfx950=_file(Spec("f", **F32), ns="b")))


def test_the_planning_groups_do_not_depend_on_the_arch_order():
    a = declarations.planning_groups([parse_target(t) for t in ("gfx950", "sm_90", "gfx942", "gfx942:xnack+")])
    b = declarations.planning_groups([parse_target(t) for t in ("gfx942:xnack+", "gfx942", "sm_90", "gfx950")])
    assert [k for k, _ in a] == [k for k, _ in b] == ["", "gfx942", "gfx950"]
