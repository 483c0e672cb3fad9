"""Pattern 13 of issue 9 at build time: a persistent Triton op whose grid reads ``device.cu_count``
builds for gfx942 and gfx950 with its layout checked against each code object's metadata; the
example grid is evaluated at the target's usual CU count; a CU count baked into a spec becomes its guard."""

from __future__ import annotations

import dataclasses

import pytest

from flyship.bundle import expr as E
from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle import targets as T

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile
triton = pytest.importorskip("triton", reason="needs triton 3.6 (the FlyDSL venv); it would compile a Triton kernel "
                                              "whose grid reads the device")

from flyship.compiler import frontends  # noqa: E402
from flyship.compiler.frontends import BuildContext  # noqa: E402
from flyship.compiler.worker import load_spec_file  # noqa: E402

SPEC_FILE = ROOT / "examples" / "triton" / "persistent.py"


def test_a_persistent_grid_builds_for_gfx942_and_gfx950_with_the_device_in_its_grid(tmp_path):
    out = tmp_path / "persistent"
    run_build(SPEC_FILE, out, ["gfx942", "gfx950"])
    m = M.read(out)
    (op,) = m.ops
    spec, generic = op.specializations  # Triton's JIT variant for aligned inputs, then the generic one
    assert generic.name == spec.name + "__generic"
    assert sorted(v.target for v in spec.variants) == ["gfx942", "gfx950"]
    for v in spec.variants:
        assert v.launch.grid[0] == "min(x.shape[0], device.cu_count)"
        rules.check_layout(v.kernargs, v.metadata, f"rowsum.f32.{v.target}")
        assert {f.arg for f in v.kernargs.fields if f.kind == "pointer"} >= {"x", "out"}
        for cus in (80, 304):  # one target ID, two device sizes
            assert E.evaluate_with_shapes(v.launch.grid[0], {"x": (1000, 200)},
                                          device={"cu_count": cus}) == cus
    assert spec.example.grid[0] == min(1000, T.example_cu_count("gfx942"))


def test_a_baked_in_cu_count_becomes_a_guard_and_the_examples_device(tmp_path):
    op = next(o for o in load_spec_file(str(SPEC_FILE)).ops if o.name == "rowsum")
    spec = dataclasses.replace(op.specs[0], name="f32_mi308x", cu_count=80)
    assert "device.cu_count == 80" in spec.constraints
    v = frontends.compile_variant(frontends.get("triton"), op, spec, "gfx942",
                                  BuildContext(workdir=tmp_path, toolchain=None, keep_ir=True))
    assert v.example_grid[0] == 80  # min(1000 rows, the 80 CUs the spec names)


def test_a_spec_limited_to_gfx950_builds_only_there_and_says_so_when_gfx950_is_not_asked_for():
    from flyship.bundle.targets import parse_target
    from flyship.compiler.pipeline import plan

    sf = load_spec_file(str(SPEC_FILE))
    op = sf.ops[0]
    big = dataclasses.replace(op.specs[0], name="f32_big_lds", targets=("gfx950",))
    sf = dataclasses.replace(sf, ops=[dataclasses.replace(op, specs=(*op.specs, big))])
    notes: list[str] = []
    # A spec limited to a processor admits every target ID of it (Triton builds none with features: a FlyDSL
    # op would get gfx950:sramecc+:xnack- here).
    from flyship.compiler.spec import admits

    assert admits(("gfx950",), parse_target("gfx950:sramecc+:xnack-"))
    both = plan(sf, [parse_target("gfx942"), parse_target("gfx950")], notes.append)
    assert ("rowsum", "f32_big_lds", "gfx950") in both
    assert ("rowsum", "f32_big_lds", "gfx942") not in both and notes == []
    only942 = plan(sf, [parse_target("gfx942")], notes.append)
    assert [t for t in only942 if t[1] == "f32_big_lds"] == []
    assert notes and "rowsum.f32_big_lds is limited to gfx950" in notes[0] and "not built" in notes[0]
