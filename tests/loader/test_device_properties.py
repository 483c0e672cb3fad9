"""Launch rules that read the device (issue 9, pattern 13): a persistent grid sized by ``device.cu_count``
follows the device the call runs on, read once per device by the loader; a CU count the kernel baked in
is a guard, so a kernel built for a 304-CU MI300X never runs silently on an 80-CU MI308X of the same
target ID. Runs the real C++ call path on the recording driver."""

from __future__ import annotations

import pytest
import torch

from flyship.bundle.errors import BundleError
from flyship.errors import ConfigError

pytestmark = pytest.mark.cpu

GFX942 = "gfx942:sramecc+:xnack-"


def _add_f32(data: dict) -> tuple[dict, dict]:
    op = next(o for o in data["ops"] if o["name"] == "add")
    spec = next(s for s in op["specializations"] if s["name"] == "f32")
    return op, spec


def _persistent_grid(data: dict) -> None:
    """add.f32: at most one program per CU, as a persistent kernel sizes its grid."""
    _, spec = _add_f32(data)
    for v in spec["variants"]:
        v["launch"]["grid"][0] = "min(cdiv(x.shape[0], 1024), device.cu_count)"


def _baked_in_304(data: dict) -> None:
    """add.f32 as built for a 304-CU device: the guard Spec(cu_count=304) adds."""
    _, spec = _add_f32(data)
    spec["guard"]["constraints"].append("device.cu_count == 304")


def test_a_persistent_grid_follows_the_devices_cu_count(bundle_copy, recorded, launches, record_ext):
    bundle = bundle_copy(_persistent_grid)
    x = torch.randn(1024 * 500)
    recorded(bundle).add(x, x)  # the recording device is a 304-CU MI300X unless told otherwise
    assert launches()[0]["grid"] == (304, 1, 1)
    ops = recorded(bundle)
    record_ext.set_recorded_device(0, GFX942, cu_count=80)  # an MI308X: same target ID, fewer CUs
    ops.add(x, x)
    assert launches()[0]["grid"] == (80, 1, 1)
    ops.add(x[:1024 * 3], x[:1024 * 3])
    assert launches()[0]["grid"] == (3, 1, 1)


@pytest.mark.parametrize("target, cus", [("sm_90", 132), ("gfx950", 256), (GFX942, 304)])
def test_a_dry_run_without_cu_count_describes_the_targets_usual_device(bundle_copy, recorded, launches, record_ext,
                                                                        target, cus):
    # A trial user's dry_run(target="sm_90") recorded grids for 304 CUs (an MI300X) while dispatch and the build
    # assume 132 for sm_90: the default follows the target (bundle.targets.usual_cu_count, the one owner).
    from flyship.bundle import targets

    assert targets.usual_cu_count(target) == cus
    x = torch.randn(1024 * 500)
    recorded(bundle_copy(_persistent_grid), target=target).add(x, x)
    assert launches()[0]["grid"] == (cus, 1, 1)


def test_a_kernel_built_for_304_cus_falls_back_on_an_80_cu_device_saying_why(bundle_copy, recorded, launches,
                                                                              record_ext):
    bundle = bundle_copy(_baked_in_304)
    x = torch.randn(4096)
    recorded(bundle).add(x, x)
    assert len(launches()) == 1  # 304 CUs: the kernel runs (the recording driver computes nothing)
    ops = recorded(bundle)
    record_ext.set_recorded_device(0, GFX942, cu_count=80)
    with pytest.warns(Warning, match="device.cu_count == 304"):
        y = ops.add(x, x)
    assert torch.equal(y, x + x) and launches() == []  # the reference ran; no kernel launched


def test_dispatch_decides_for_a_device_of_a_given_size(bundle_copy, recorded):
    ops = recorded(bundle_copy(_baked_in_304))
    x = torch.randn(4096)
    assert ops.add.dispatch(x, x, target=GFX942, cu_count=304).spec == "f32"
    d = ops.add.dispatch(x, x, target=GFX942, cu_count=80)
    assert d.spec is None and "device.cu_count == 304" in d.reason


def test_an_output_shape_that_reads_the_device_is_refused_at_load(bundle_copy, recorded):
    def edit(data: dict) -> None:
        op, _ = _add_f32(data)
        op["outputs"][0]["shape"] = ["min(x.shape[0], device.cu_count)"]

    with pytest.raises(BundleError, match="must not depend on which GPU"):
        recorded(bundle_copy(edit))


def _divides_by_cu_count(data: dict) -> None:
    """add.f32 guarded on an input that splits evenly over the CUs (a per-CU partition)."""
    _, spec = _add_f32(data)
    spec["guard"]["constraints"].append("x.shape[0] % device.cu_count == 0")


def test_dispatch_without_cu_count_on_an_op_that_reads_it_says_so_and_how_to_pass_it(bundle_copy, recorded):
    # Issue 34 item 2: dispatch(..., target="sm_90") on such a guard said "divides by zero" (it decided for 0 CUs).
    ops = recorded(bundle_copy(_divides_by_cu_count))
    x = torch.randn(304 * 4)
    with pytest.raises(ConfigError, match=r"add.dispatch: expected cu_count= for target 'gfx942', got none: the op "
                                          r"reads device.cu_count \(spec f32 guard\), which a dispatch without a "
                                          r"device does not know .* e.g. cu_count=304 \(a usual gfx942 device\)"):
        ops.add.dispatch(x, x, target="gfx942")
    with pytest.raises(ConfigError, match=r"cu_count=132 \(a usual sm_90 device\)"):
        ops.add.dispatch(x, x, target="sm_90")
    assert ops.add.dispatch(x, x, target="gfx942", cu_count=304).spec == "f32"
    d = ops.add.dispatch(x, x, target="gfx942", cu_count=80)  # 1216 is no multiple of 80
    assert d.spec is None and "device.cu_count" in d.reason and "divides by zero" not in d.reason
    with pytest.raises(ConfigError, match="expected cu_count to be an int >= 1 .*got 0"):
        ops.add.dispatch(x, x, target="gfx942", cu_count=0)


def test_dispatch_needs_no_cu_count_where_nothing_reads_the_device(bundle_copy, recorded):
    ops = recorded(bundle_copy(lambda data: None))
    x = torch.randn(4096)
    assert ops.add.dispatch(x, x, target="gfx942").spec == "f32"
