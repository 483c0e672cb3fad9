"""Calls and plans that must be refused (or fall back with a reason) before anything runs: issue 10's C++
side, on the recording driver. Each would have been a silent wrong result or a crash."""

from __future__ import annotations

import re

import pytest
import torch

from flyship.bundle import manifest as _m
from flyship.bundle import rules as _rules
from flyship.loader import blame as _blame
from flyship.loader import plan as _plan
from flyship.loader.selection import make_selector

pytestmark = pytest.mark.cpu


def edit_add_f32(change):
    """A manifest edit applying ``change`` to the add op and its f32 gfx942 variant."""

    def edit(data: dict) -> None:
        op = next(o for o in data["ops"] if o["name"] == "add")
        spec = next(s for s in op["specializations"] if s["name"] == "f32")
        change(op, next(v for v in spec["variants"] if v["target"] == "gfx942"))

    return edit


def test_a_grid_that_rounds_to_zero_for_a_non_empty_output_falls_back_instead_of_returning_garbage(
        bundle_copy, recorded, launches):
    def zero_grid(op, v):
        v["launch"]["grid"][0] = "x.shape[0] // 4096"

    ops = recorded(bundle_copy(edit_add_f32(zero_grid)))
    x, y = torch.randn(1000), torch.randn(1000)
    with pytest.warns(UserWarning, match=re.escape("grid 'x.shape[0] // 4096' gives 0 workgroups, but output 'out' "
                                                   "holds 1000 elements")):
        out = ops.add(x, y)
    torch.testing.assert_close(out, x + y)
    assert launches() == [] and ops.add.stats()["empty"] == 0


def test_empty_outputs_launch_nothing_and_count_as_empty(recorded_tiny, launches):
    ops = recorded_tiny()
    assert ops.add(torch.empty(0), torch.empty(0)).shape == (0,)
    assert launches() == [] and ops.add.stats()["empty"] == 1 and ops.add.stats()["fallbacks"] == {}


def test_an_output_shape_that_overflows_int64_is_refused(bundle_copy, recorded, launches):
    def huge(op, v):
        op["outputs"][0]["shape"] = ["x.shape[0] * 4611686018427387904"]

    ops = recorded(bundle_copy(edit_add_f32(huge)))
    with pytest.raises(RuntimeError, match=re.escape("output 'out' shape expression 'x.shape[0] * 4611686018427387904'"
                                                     " overflows int64")):
        ops.add(torch.randn(3), torch.randn(3))
    with pytest.raises(RuntimeError, match=r"output 'out' of shape \[4611686018427387904\] and dtype float32 overflows"):
        ops.add(torch.randn(1), torch.randn(1))  # 2**62 elements fit int64; their bytes do not
    assert launches() == []


def test_a_grid_that_overflows_falls_back_with_the_reason(bundle_copy, recorded, launches):
    def huge(op, v):
        v["launch"]["grid"][0] = "x.numel * 4611686018427387904 // 2"

    ops = recorded(bundle_copy(edit_add_f32(huge)), fallback=False)
    with pytest.raises(RuntimeError, match=re.escape("grid 'x.numel * 4611686018427387904 // 2' overflows int64")):
        ops.add(torch.randn(3), torch.randn(3))
    assert launches() == []


def test_scratch_bytes_that_overflow_are_refused(bundle_copy, recorded, launches):
    def scratch(op, v):  # the largest scratch the rule book allows, times 4 x 4294963200 programs
        f = next(f for f in v["kernargs"]["fields"] if f["offset"] == 32)
        f.update(kind="scratch", bytes_per_program=2**30, align=256)
        v["launch"]["grid"][1] = "x.shape[0] * 1048575"

    ops = recorded(bundle_copy(edit_add_f32(scratch)), fallback=False)
    with pytest.raises(RuntimeError, match=r"scratch .* 1073741824 bytes x 17179852800 programs overflows int64"):
        ops.add(torch.randn(4096), torch.randn(4096))
    assert launches() == []


def test_an_int_scalar_its_kernarg_cannot_hold_falls_back_before_anything_is_allocated(recorded_tiny, launches):
    ops = recorded_tiny()
    x = torch.randn(4, 8, dtype=torch.float32)
    reason = r"kernel argument bias \(offset \d+, i32\) cannot hold the value 1099511627776"
    with pytest.warns(UserWarning, match=reason):
        torch.testing.assert_close(ops.scale_rows(x, 2.0, 2**40), x * 2.0 + 2**40)
    assert launches() == []
    with pytest.raises(RuntimeError, match=reason + r"\) and the fallback is off"):
        recorded_tiny(fallback=False).scale_rows(x, 2.0, 2**40)
    ops.scale_rows(x, 2.0, 2**31 - 1)  # the largest value it holds launches
    assert len(launches()) == 1


def test_a_real_tensor_mixed_with_a_meta_tensor_is_refused(recorded_tiny, launches):
    ops = recorded_tiny()
    real, meta = torch.randn(8), torch.randn(8, device="meta")
    with pytest.raises(RuntimeError, match="expected all tensors real or all meta, got cpu for 'x' and meta for 'y'"):
        ops.add.dispatch(real, meta, target="gfx942")
    with pytest.raises(RuntimeError, match="expected all tensors (on one device|real or all meta)"):
        ops.add(real, meta)
    with pytest.raises(RuntimeError, match="expected all tensors (on one device|real or all meta)"):
        ops.add.out(real, real.clone(), out=torch.empty(8, device="meta"))
    assert launches() == []


def lowered(tiny_bundle):
    """The tiny bundle's plan as load hands it to the core: op heads now, each op's specializations (``specs``,
    which a test may edit) when the core first uses the op."""
    manifest = _m.read(tiny_bundle)
    images = _rules.check_bundle_files(tiny_bundle, manifest)
    variants = [v for _, v in _rules.iter_variants(manifest)]
    specs = [_plan.lower_specs(op) for op in manifest.ops]
    heads = [_plan.lower_op(op, "flyship_plan_test") for op in manifest.ops]
    plan = _plan.lower_bundle(heads, "flyship_plan_test", [None] * len(manifest.ops), lambda k: specs[k],
                              lambda i: images[variants[i].code_object.file],
                              lambda k, *why: _blame.blame(manifest.ops[k], *why))
    return manifest, plan, specs


def test_the_core_refuses_a_dtype_rule_that_reads_a_scalars_slot(tiny_bundle, record_ext):
    manifest, plan, _ = lowered(tiny_bundle)
    op = next(o for o in plan["ops"] if o["name"] == "scale_rows")
    op["outputs"][0]["dtype_slot"] = 1  # alpha: a float scalar; reading it as a tensor would crash
    with pytest.raises(RuntimeError, match=r"output 'out' takes its dtype from slot 1, expected an input tensor's slot"):
        record_ext.Bundle(plan, make_selector(manifest), True)


def test_the_core_refuses_a_field_of_the_wrong_slot_kind_and_unknown_names_when_it_first_reads_the_op(
        tiny_bundle, record_ext):
    manifest, plan, specs = lowered(tiny_bundle)
    k = next(i for i, o in enumerate(plan["ops"]) if o["name"] == "scale_rows")
    pointer = next(f for f in specs[k][0]["variants"][0]["fields"] if f["kind"] == "pointer")
    pointer["slot"] = 1  # a pointer field over the float scalar alpha
    with pytest.raises(RuntimeError, match="slot kind does not fit"):
        record_ext.Bundle(plan, make_selector(manifest), True).stats(k)  # stats reads the op's specializations
    pointer["slot"], pointer["kind"] = 0, "pointr"
    with pytest.raises(RuntimeError, match=r"expected a field kind \(pointer, shape, .*\), got 'pointr'"):
        record_ext.Bundle(plan, make_selector(manifest), True).stats(k)
    pointer["kind"] = "pointer"
    core = record_ext.Bundle(plan, make_selector(manifest), True)
    assert core.stats(k)["launches"] == {s["name"]: 0 for s in specs[k]}  # the plan as lowered is accepted


def test_the_core_refuses_specializations_that_disagree_with_the_ops_head(tiny_bundle, record_ext):
    manifest, plan, specs = lowered(tiny_bundle)
    k = next(i for i, o in enumerate(plan["ops"]) if o["name"] == "scale_rows")
    specs[k][0]["variants"].pop()
    core = record_ext.Bundle(plan, make_selector(manifest), True)
    with pytest.raises(RuntimeError, match=r"specialization \w+ holds \d+ variants, the op's head announces \d+"):
        core.stats(k)
    specs[k].pop()
    with pytest.raises(RuntimeError, match=r"the op's head announces \d+ specializations, its specs hold \d+"):
        core.stats(k)
