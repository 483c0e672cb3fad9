"""Launches as the runtime receives them, recorded by the recording driver after the real C++ call path
(bind -> guards -> allocate -> grid -> pack -> launch) ran on CPU tensors, compared byte for byte with what
the code object's own metadata and the tensors imply.

The offsets and sizes come from the code object itself (the AMDGPU metadata note of a hsaco, the
``.nv.info`` parameter records of a cubin), never from the manifest or the loader's plan; the values from
the tensors, by each kernel's parameter list (see data/make_tiny_bundle.py).
"""

from __future__ import annotations

import re
import struct

import pytest
import torch

from flyship.bundle import expr
from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.cubin import CubinFile
from flyship.loader.tools.verify import example_inputs

pytestmark = pytest.mark.cpu

FMT = {("ptr", 8): "<Q", ("i32", 4): "<i", ("i64", 8): "<q", ("f32", 4): "<f"}

# Kernel parameters in order: (name, type, value from the call's tensors by name).
PARAMS = {
    "add": [
        ("x_ptr", "ptr", lambda t: t["x"].data_ptr()),
        ("y_ptr", "ptr", lambda t: t["y"].data_ptr()),
        ("out_ptr", "ptr", lambda t: t["out"].data_ptr()),
        ("n", "i32", lambda t: t["x"].numel()),
        ("global_scratch", "ptr", lambda t: 0),
        ("profile_scratch", "ptr", lambda t: 0),
    ],
    "scale_rows": [
        ("x_ptr", "ptr", lambda t: t["x"].data_ptr()),
        ("out_ptr", "ptr", lambda t: t["out"].data_ptr()),
        ("M", "i32", lambda t: t["x"].shape[0]),
        ("N", "i32", lambda t: t["x"].shape[1]),
        ("stride_xm", "i64", lambda t: t["x"].stride(0)),
        ("stride_xn", "i32", lambda t: t["x"].stride(1)),
        ("stride_om", "i64", lambda t: t["out"].stride(0)),
        ("alpha", "f32", lambda t: t["alpha"]),
        ("bias", "i32", lambda t: t["bias"]),
        ("global_scratch", "ptr", lambda t: 0),
        ("profile_scratch", "ptr", lambda t: 0),
    ],
    "addsub": [
        ("x_ptr", "ptr", lambda t: t["x"].data_ptr()),
        ("y_ptr", "ptr", lambda t: t["y"].data_ptr()),
        ("sum_ptr", "ptr", lambda t: t["sum"].data_ptr()),
        ("diff_ptr", "ptr", lambda t: t["diff"].data_ptr()),
        ("n", "i32", lambda t: t["x"].shape[0]),
        ("global_scratch", "ptr", lambda t: 0),
        ("profile_scratch", "ptr", lambda t: 0),
    ],
}


def calls() -> dict[str, dict]:
    x2 = torch.randn(300, 200).t()  # strided: strides (1, 200)
    return {
        "add": {"x": torch.randn(5000), "y": torch.randn(5000)},
        "scale_rows": {"x": x2, "alpha": -1.5, "bias": -7},
        "addsub": {"x": torch.randn(3000), "y": torch.randn(3000)},
    }


def code_object_args(bundle, variant):
    """Explicit and hidden kernel arguments as the code object itself records them (AMDGPU metadata note;
    a cubin's EIATTR_KPARAM_INFO)."""
    data = (bundle / variant.code_object.file).read_bytes()
    reader = CodeObjectFile(data) if variant.code_object.format == "hsaco" else CubinFile(data)
    meta = reader.kernel_metadata(variant.code_object.symbol)
    return [a for a in meta.args if not a.hidden], [a for a in meta.args if a.hidden]


# A device target per variant target of the tiny bundle (sm_90a cubins run on an sm_90 device).
DEVICE = {"gfx942": "gfx942:sramecc+:xnack-", "gfx950": "gfx950:sramecc+:xnack-", "sm_90a": "sm_90"}


@pytest.mark.parametrize("variant_target", ["gfx942", "gfx950", "sm_90a"])
def test_recorded_launches_match_the_code_object_metadata_and_the_tensors(tiny_bundle, recorded, launches,
                                                                          variant_target):
    ops = recorded(tiny_bundle, target=DEVICE[variant_target])
    checked = 0
    for op_name, call in calls().items():
        handle = ops[op_name]
        if not any(v.target == variant_target for s in handle.manifest.specializations for v in s.variants):
            continue  # the tiny bundle has only add for gfx950
        args = [call[a.name] for a in handle.manifest.args]
        result = handle(*args)
        outputs = result if isinstance(result, tuple) else (result,)
        (launch,) = launches()
        spec = next(s for s in handle.manifest.specializations if handle.stats()["launches"][s.name])
        v = next(v for v in spec.variants if v.target == variant_target)
        values = dict(call)
        values.update({o.name: t for o, t in zip(handle.manifest.outputs, outputs)})
        explicit, hidden = code_object_args(tiny_bundle, v)
        assert (launch["symbol"], launch["block"], launch["stream"], launch["device"]) == (
            v.code_object.symbol, tuple(v.launch.block), 0, 0)
        shapes = {k: tuple(t.shape) for k, t in values.items() if isinstance(t, torch.Tensor)}
        scalars = {k: t for k, t in values.items() if isinstance(t, int)}
        assert launch["grid"] == tuple(expr.evaluate_with_shapes(g, shapes, scalars) for g in v.launch.grid)
        buf = launch["kernargs"]
        assert len(explicit) == len(PARAMS[op_name]), v.code_object.file
        assert len(buf) == explicit[-1].offset + explicit[-1].size
        covered = bytearray(len(buf))
        for a, (name, ty, value) in zip(explicit, PARAMS[op_name]):
            want = struct.pack(FMT[(ty, a.size)], value(values))
            got = buf[a.offset:a.offset + a.size]
            assert got == want, f"{v.code_object.file}: {name} at offset {a.offset}: {got.hex()} != {want.hex()}"
            covered[a.offset:a.offset + a.size] = b"\1" * a.size
        # Padding between arguments is zero; hidden arguments lie past the buffer (the runtime fills them).
        assert all(b == 0 for b, c in zip(buf, covered) if not c)
        assert all(h.offset >= len(buf) for h in hidden)
        checked += 1
    assert checked == (1 if variant_target == "gfx950" else 3)


def test_the_strided_kernel_really_has_hidden_arguments_past_the_buffer(tiny, tiny_bundle):
    v = tiny.scale_rows.manifest.specializations[0].variants[0]
    explicit, hidden = code_object_args(tiny_bundle, v)
    kinds = {h.value_kind for h in hidden}
    assert {"hidden_block_count_x", "hidden_group_size_x", "hidden_hostcall_buffer"} <= kinds
    assert explicit[-1].offset + explicit[-1].size == v.kernargs.size < v.metadata.kernarg_segment_size


def test_grid_follows_the_shapes(tiny_bundle, recorded, launches):
    recorded(tiny_bundle).scale_rows(torch.randn(70, 1000), 1.0, 0)
    assert launches()[0]["grid"] == (4, 70, 1)  # cdiv(1000, 256) column blocks, one row per program in y
    recorded(tiny_bundle, target="sm_90").add(torch.randn(1025), torch.randn(1025))
    assert launches()[0]["grid"] == (2, 1, 1)


def test_out_tensors_are_packed_instead_of_fresh_outputs(recorded_tiny, launches):
    x, y = torch.randn(100), torch.randn(100)
    s, d = torch.empty(100), torch.empty(100)
    recorded_tiny().addsub.out(x, y, sum=s, diff=d)
    assert struct.unpack_from("<QQ", launches()[0]["kernargs"], 16) == (s.data_ptr(), d.data_ptr())


def test_example_calls_launch_with_the_manifest_layout_and_grid(example_bundle, recorded, launches):
    from flyship.bundle import manifest as _m

    targets = sorted({v.target for op in _m.read(example_bundle).ops for s in op.specializations for v in s.variants})
    checked = 0
    for target in targets:
        ops = recorded(example_bundle, target=target)
        for handle in ops:
            for spec in handle.manifest.specializations:
                v = next((v for v in spec.variants if v.target == target), None)
                if v is None:
                    continue
                inputs = example_inputs(handle.manifest, spec, "cpu")
                d = handle.dispatch(*inputs, target=target)
                if d.spec != spec.name:
                    continue  # an earlier specialization takes this example (test_dispatch checks the order)
                result = handle(*inputs)
                outputs = result if isinstance(result, tuple) else (result,)
                (launch,) = launches()
                tensors = {a.name: t for a, t in zip(handle.manifest.args, inputs)}
                tensors.update({o.name: t for o, t in zip(handle.manifest.outputs, outputs)})
                assert (launch["symbol"], launch["grid"], launch["block"]) == (
                    v.code_object.symbol, tuple(spec.example.grid), tuple(v.launch.block)), (handle.name, spec.name)
                assert len(launch["kernargs"]) == v.kernargs.size
                for f in v.kernargs.fields:
                    if f.kind == "pointer":
                        assert struct.unpack_from("<Q", launch["kernargs"], f.offset)[0] == tensors[f.arg].data_ptr()
                checked += 1
    assert checked > 0


def _edit_add_fields(data: dict) -> None:
    """Turn add.f32.gfx942's two trailing null pointers into a scratch buffer and a constant."""
    op = next(o for o in data["ops"] if o["name"] == "add")
    spec = next(s for s in op["specializations"] if s["name"] == "f32")
    v = next(v for v in spec["variants"] if v["target"] == "gfx942")
    for f in v["kernargs"]["fields"]:
        if f["offset"] == 32:
            f.update(kind="scratch", bytes_per_program=64, align=128)
        elif f["offset"] == 40:
            f.update(kind="constant", type="u64", value=7)


def test_scratch_and_constant_fields_are_packed(bundle_copy, recorded, launches):
    ops = recorded(bundle_copy(_edit_add_fields))
    ops.add(torch.randn(4096), torch.randn(4096))
    (launch,) = launches()
    assert launch["grid"] == (4, 1, 1)
    ptr = struct.unpack_from("<Q", launch["kernargs"], 32)[0]
    assert ptr != 0 and ptr % 128 == 0  # 64 B x 4 programs of fresh memory, aligned
    assert struct.unpack_from("<Q", launch["kernargs"], 40)[0] == 7


def test_a_value_too_big_for_its_field_falls_back_before_anything_is_allocated(recorded_tiny, launches):
    n = 2**31 + 5  # the i32 N cannot hold it; an expanded tensor needs no memory (nor does the reference's result)
    x = torch.empty(1, 1).expand(1, n)
    reason = r"kernel argument N \(offset \d+, i32\) cannot hold the value 2147483653"
    assert re.fullmatch(reason, recorded_tiny().scale_rows.dispatch(x, 1.0, 0, target="gfx942").reason)
    seen = []

    def reference(a, alpha, bias):
        seen.append(tuple(a.shape))
        return torch.empty(1, 1).expand(1, n)

    ops = recorded_tiny(references={"scale_rows": reference})
    with pytest.warns(UserWarning, match=reason):
        ops.scale_rows(x, 1.0, 0)
    assert seen == [(1, n)] and launches() == []
    with pytest.raises(RuntimeError, match=reason + r".* and the fallback is off"):
        recorded_tiny(fallback=False).scale_rows(x, 1.0, 0)
    ((why, count),) = ops.scale_rows.stats()["fallbacks"].items()
    assert re.fullmatch(reason, why) and count == 1
