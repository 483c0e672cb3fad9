"""Kernarg packing, compared byte for byte with what the code object's own metadata and the tensors imply.

The offsets and sizes come from the code object itself (the AMDGPU metadata note of a hsaco, the
``.nv.info`` parameter records of a cubin), never from the manifest or the loader's plan; the values from
the tensors, by each kernel's parameter list (see data/make_tiny_bundle.py).
"""

from __future__ import annotations

import struct
import uuid

import pytest
import torch

import flyship
from flyship.bundle.codeobject import CodeObjectFile
from flyship.bundle.cubin import CubinFile
from flyship.loader.verify import example_inputs

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


@pytest.mark.parametrize("op_name", ["add", "scale_rows", "addsub"])
def test_packed_bytes_match_the_code_object_metadata_and_the_tensors(tiny, tiny_bundle, op_name):
    handle = tiny[op_name]
    call = calls()[op_name]
    args = [call[a.name] for a in handle.manifest.args]
    for spec in handle.manifest.specializations:
        if any(call[t].dtype != getattr(torch, d) for t, d in spec.guard.dtypes.items()):
            continue
        for v in spec.variants:
            packed = handle.pack_kernargs(spec.name, *args, target=v.target)
            values = dict(call)
            values.update({o.name: t for o, t in zip(handle.manifest.outputs, packed.outputs)})
            explicit, hidden = code_object_args(tiny_bundle, v)
            assert len(explicit) == len(PARAMS[op_name]), v.code_object.file
            assert len(packed.buffer) == explicit[-1].offset + explicit[-1].size
            covered = bytearray(len(packed.buffer))
            for a, (name, ty, value) in zip(explicit, PARAMS[op_name]):
                want = struct.pack(FMT[(ty, a.size)], value(values))
                got = packed.buffer[a.offset:a.offset + a.size]
                assert got == want, f"{v.code_object.file}: {name} at offset {a.offset}: {got.hex()} != {want.hex()}"
                covered[a.offset:a.offset + a.size] = b"\1" * a.size
            # Padding between arguments is zero; hidden arguments lie past the buffer (the runtime fills them).
            assert all(b == 0 for b, c in zip(packed.buffer, covered) if not c)
            assert all(h.offset >= len(packed.buffer) for h in hidden)
            assert packed.block == tuple(v.launch.block)


def test_the_strided_kernel_really_has_hidden_arguments_past_the_buffer(tiny, tiny_bundle):
    v = tiny.scale_rows.manifest.specializations[0].variants[0]
    explicit, hidden = code_object_args(tiny_bundle, v)
    kinds = {h.value_kind for h in hidden}
    assert {"hidden_block_count_x", "hidden_group_size_x", "hidden_hostcall_buffer"} <= kinds
    packed = tiny.scale_rows.pack_kernargs("f32", torch.randn(4, 8), 1.0, 0, target=v.target)
    assert len(packed.buffer) == v.kernargs.size < v.metadata.kernarg_segment_size


def test_grid_follows_the_shapes(tiny):
    p = tiny.scale_rows.pack_kernargs("f32", torch.randn(70, 1000), 1.0, 0, target="gfx942")
    assert p.grid == (4, 70, 1)  # cdiv(1000, 256) column blocks, one row per program in y
    p = tiny.add.pack_kernargs("f32", torch.randn(1025), torch.randn(1025), target="sm_90a")
    assert p.grid == (2, 1, 1)


def test_out_tensors_are_packed_instead_of_fresh_outputs(tiny):
    x, y = torch.randn(100), torch.randn(100)
    s, d = torch.empty(100), torch.empty(100)
    p = tiny.addsub.pack_kernargs("f32", x, y, target="gfx942", out=(s, d))
    assert struct.unpack_from("<QQ", p.buffer, 16) == (s.data_ptr(), d.data_ptr())
    assert p.outputs[0] is not None and p.outputs[0].data_ptr() == s.data_ptr()


def test_example_calls_pack_to_the_manifest_layout_and_grid(example_bundle, ext):
    ops = flyship.load(example_bundle)
    for handle in ops:
        for spec in handle.manifest.specializations:
            inputs = example_inputs(handle.manifest, spec, "cpu")
            tensors = {a.name: t for a, t in zip(handle.manifest.args, inputs)}
            for v in spec.variants:
                p = handle.pack_kernargs(spec.name, *inputs, target=v.target)
                tensors.update({o.name: t for o, t in zip(handle.manifest.outputs, p.outputs)})
                assert len(p.buffer) == v.kernargs.size
                assert p.grid == tuple(spec.example.grid), (handle.name, spec.name, v.target)
                for f in v.kernargs.fields:
                    if f.kind == "pointer":
                        assert struct.unpack_from("<Q", p.buffer, f.offset)[0] == tensors[f.arg].data_ptr()


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


def test_scratch_and_constant_fields_are_packed(bundle_copy, ext):
    ops = flyship.load(bundle_copy(_edit_add_fields), namespace=f"flyship_t{uuid.uuid4().hex[:8]}")
    p = ops.add.pack_kernargs("f32", torch.randn(4096), torch.randn(4096), target="gfx942")
    (scratch,) = p.scratch
    ptr = struct.unpack_from("<Q", p.buffer, 32)[0]
    assert ptr % 128 == 0
    assert scratch.data_ptr() <= ptr and ptr + 64 * 4 <= scratch.data_ptr() + scratch.numel()  # 64 B x 4 programs
    assert struct.unpack_from("<Q", p.buffer, 40)[0] == 7


def test_a_value_too_big_for_its_field_is_a_clear_error(tiny):
    n = 2**31 + 5  # i32 cannot hold it; expanded tensors need no memory
    x, y, out = (torch.empty(1).expand(n) for _ in range(3))
    with pytest.raises(RuntimeError, match=r"kernel argument n \(offset 24, i32\) .* cannot hold the value 2147483653"):
        tiny.add.pack_kernargs("f32", x, y, target="gfx942", out=(out,))
