"""Dispatch decisions without a GPU: the C++ guards choose a specialization and variant per device
target, or say why nothing fits (the fallback reason). CPU tensors stand in for GPU ones."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cpu


def pair(n: int = 4096, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n).to(dtype), torch.randn(n).to(dtype)


@pytest.mark.parametrize("target, variant", [
    ("gfx942", "gfx942"),
    ("gfx942:sramecc+:xnack-", "gfx942"),
    ("gfx950", "gfx950"),
    ("sm_90", "sm_90a"),
])
def test_float32_inputs_run_the_f32_specialization_on_each_target(tiny, target, variant):
    d = tiny.add.dispatch(*pair(), target=target)
    assert (d.spec, d.target, d.reason) == ("f32", variant, "")


def test_float16_inputs_run_the_f16_specialization(tiny):
    assert tiny.add.dispatch(*pair(dtype=torch.float16), target="gfx942").spec == "f16"


def test_a_specialization_without_code_for_the_device_does_not_fit(tiny):
    d = tiny.add.dispatch(*pair(dtype=torch.float16), target="gfx950")
    assert d.spec is None
    assert d.reason == "f32: dtype x=float16; f16: no code object for gfx950; bundle has gfx942"


def test_a_device_with_no_code_object_names_its_target_and_the_bundles(tiny):
    d = tiny.add.dispatch(*pair(), target="gfx90a:sramecc+:xnack-")
    assert d.reason == ("f32: no code object for gfx90a:sramecc+:xnack-; bundle has gfx942, gfx950; "
                        "f16: no code object for gfx90a:sramecc+:xnack-; bundle has gfx942")
    d = tiny.scale_rows.dispatch(torch.randn(4, 8), 1.0, 0, target="sm_80")
    assert d.reason == "no code object for sm_80; bundle has sm_90a"


def test_an_unlisted_dtype_is_the_reason(tiny):
    assert tiny.add.dispatch(*pair(dtype=torch.float64), target="gfx942").reason == "dtype x=float64"


def test_a_false_constraint_is_the_reason(tiny):
    x, _ = pair(4096)
    _, y = pair(4000)
    d = tiny.add.dispatch(x, y, target="gfx942")
    assert d.reason == "f32: constraint 'x.shape[0] == y.shape[0]' false; f16: dtype x=float32"


def test_a_misaligned_pointer_is_the_reason(tiny):
    base = torch.randn(4097)
    x = base[1:]  # 4 bytes past a 64-byte-aligned allocation
    assert x.data_ptr() % 16 != 0
    d = tiny.add.dispatch(x, torch.randn(4096), target="gfx942")
    assert d.reason.startswith("f32: alignment x not 16-byte aligned")


def test_a_strided_tensor_whose_stride_the_kernel_does_not_take_falls_back(tiny):
    x, y = pair(8192)
    d = tiny.add.dispatch(x[::2], y[::2], target="gfx942")
    assert d.reason.startswith("f32: constraint 'x.shape[0] <= 1 or x.stride[0] == 1' false")


def test_a_strided_tensor_whose_strides_the_kernel_takes_still_fits(tiny):
    x = torch.randn(300, 200).t()  # strides (1, 200)
    d = tiny.scale_rows.dispatch(x, 2.0, 3, target="gfx942")
    assert (d.spec, d.target) == ("f32", "gfx942")


def test_a_shape_guard_sends_large_inputs_to_the_fallback(tiny):
    x = torch.empty(65536, 1)
    assert tiny.scale_rows.dispatch(x, 1.0, 0, target="gfx942").reason == "constraint 'x.shape[0] <= 65535' false"
    assert tiny.scale_rows.dispatch(x[:65535], 1.0, 0, target="gfx942").spec == "f32"


def test_an_out_tensor_with_a_layout_the_kernel_cannot_write_falls_back(tiny):
    x = torch.randn(16, 32)
    good = torch.empty(16, 32)
    assert tiny.scale_rows.dispatch(x, 1.0, 0, target="gfx942", out=(good,)).spec == "f32"
    bad = torch.empty(32, 16).t()  # the kernel takes out.stride[0] only, so stride[1] must be 1
    d = tiny.scale_rows.dispatch(x, 1.0, 0, target="gfx942", out=(bad,))
    assert d.reason == "constraint 'out.shape[1] <= 1 or out.stride[1] == 1' false"


def test_wrong_rank_and_wrong_out_shape_are_errors_not_fallbacks(tiny):
    with pytest.raises(RuntimeError, match=r"expected 'x' of rank 1, got rank 2 \(shape \[2, 3\]\)"):
        tiny.add.dispatch(torch.randn(2, 3), torch.randn(2, 3), target="gfx942")
    with pytest.raises(RuntimeError, match=r"expected out tensor 'out' of shape \[8\] and dtype float32, got "
                                           r"shape \[9\]"):
        tiny.add.dispatch(*pair(8), target="gfx942", out=(torch.empty(9),))
    # A one-element tensor is a float to torch's parser (and so to the call and dispatch); two elements are not.
    with pytest.raises(TypeError, match=r"scale_rows.dispatch: expected .alpha. to be a float, got a tensor of shape \[2\]"):
        tiny.scale_rows.dispatch(torch.randn(2, 3), torch.tensor([2.0, 3.0]), 0, target="gfx942")


def test_multi_output_ops_decide_on_all_their_arguments(tiny):
    x, y = pair(3000)
    assert tiny.addsub.dispatch(x, y, target="sm_90").target == "sm_90a"
    outs = (torch.empty(3000), torch.empty(6000)[::2])
    assert tiny.addsub.dispatch(x, y, target="gfx942", out=outs).reason == (
        "constraint 'diff.shape[0] <= 1 or diff.stride[0] == 1' false")


def test_example_inputs_fit_their_own_specialization_on_their_own_targets(example_bundle, ext):
    import flyship
    from flyship.loader.tools.verify import example_inputs

    ops = flyship.load(example_bundle)
    checked = 0
    for handle in ops:
        for spec in handle.manifest.specializations:
            inputs = example_inputs(handle.manifest, spec, "cpu")
            for v in spec.variants:
                d = handle.dispatch(*inputs, target=v.target)
                # An earlier specialization may take the example too; then it must be that one's turn.
                names = handle.specializations
                assert d.spec is not None and names.index(d.spec) <= names.index(spec.name), (handle.name, spec.name, d)
                checked += 1
    assert checked > 0


def test_dispatch_takes_one_out_tensor_as_the_out_variant_does(tiny):
    x, y = pair()
    assert tiny.add.dispatch(x, y, target="sm_90", out=torch.empty(4096)).spec == "f32"
    assert tiny.add.dispatch(x, y, target="sm_90", out=torch.empty(4096)) == \
        tiny.add.dispatch(x, y, target="sm_90", out=(torch.empty(4096),))
