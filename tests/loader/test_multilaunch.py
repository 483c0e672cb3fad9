"""Ops that launch several kernels per call (issue 9, pattern 6) on the recording driver: the real C++ call path
allocates the workspace and launches both kernels in order, and every recorded kernarg byte is what the
manifest says, workspace pointers included. Hostile manifests and inputs are refused before the first launch.

The bundle is examples/triton/multilaunch.py built by flyc-build (``multilaunch_bundle``).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from flyship.bundle import expr as E
from flyship.bundle import manifest as M
from flyship.errors import BundleError

pytestmark = pytest.mark.cpu

_FMT = {"ptr": "<Q", "u64": "<Q", "i64": "<q", "i32": "<i", "u32": "<I", "i16": "<h", "i8": "<b", "f64": "<d",
        "f32": "<f", "f16": "<e"}


def expected_kernargs(v: M.Variant, tensors: dict[str, torch.Tensor], workspaces: dict[str, int]) -> bytes:
    """The kernarg buffer of one launch, packed here from the manifest alone (an independent packer)."""
    shapes = {k: tuple(t.shape) for k, t in tensors.items()}
    strides = {k: tuple(t.stride()) for k, t in tensors.items()}
    buf = bytearray(v.kernargs.size)
    for f in v.kernargs.fields:
        if f.kind == "pointer":
            value = tensors[f.arg].data_ptr()
        elif f.kind == "workspace":
            value = workspaces[f.arg]
        elif f.kind == "shape":
            value = shapes[f.arg][f.dim]
        elif f.kind == "stride":
            value = strides[f.arg][f.dim]
        elif f.kind == "expr":
            value = E.evaluate_with_shapes(f.expr, shapes, {}, strides)
        elif f.kind == "null":
            value = 0
        else:
            raise AssertionError(f"no packer for a {f.kind} field in this test")
        struct.pack_into(_FMT[f.type], buf, f.offset, value)
    return bytes(buf)


def workspace_pointer(v: M.Variant, launch: dict, name: str) -> int:
    f = next(f for f in v.kernargs.fields if f.kind == "workspace" and f.arg == name)
    return struct.unpack_from("<Q", launch["kernargs"], f.offset)[0]


def variant(bundle: Path, op: str, spec: str, target: str) -> M.Variant:
    s = next(s for s in M.read(bundle).op(op).specializations if s.name == spec)
    return next(v for v in s.variants if v.target == target)


@pytest.fixture
def edited(tmp_path: Path, multilaunch_bundle: Path) -> Callable[[Callable[[dict], None]], Path]:
    """A copy of the multilaunch bundle whose manifest JSON a test changes (rowsum_split's first f32 variant)."""

    def make(edit: Callable[[dict], None]) -> Path:
        root = tmp_path / f"bundle_{uuid.uuid4().hex[:6]}"
        shutil.copytree(multilaunch_bundle, root)
        path = root / "manifest.json"
        data = json.loads(path.read_text())
        op = next(o for o in data["ops"] if o["name"] == "rowsum_split")
        # f32 and its generic specialization (docs/triton.md): the calls here take either, as their shapes say
        for spec in (s for s in op["specializations"] if s["name"] in ("f32", "f32__generic")):
            edit(next(v for v in spec["variants"] if v["target"] == "gfx942"))
        path.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n")
        return root

    return make


@pytest.mark.parametrize("target, device", [("gfx942", "gfx942:sramecc+:xnack-"), ("gfx950", "gfx950"),
                                            ("sm_90a", "sm_90")])
def test_a_two_phase_op_records_both_launches_in_order_with_every_byte_the_manifest_says(
        multilaunch_bundle, recorded, launches, target, device):
    ops = recorded(multilaunch_bundle, target=device)
    v = variant(multilaunch_bundle, "rowsum_split", "f32__generic", target)  # 1000 columns: not the JIT's class
    assert [t.code_object.symbol for t in v.launches] == ["rowsum_partial_kernel", "rowsum_combine_kernel"]
    x = torch.randn(37, 1000)
    y = ops.rowsum_split(x)
    got = launches()
    assert [g["symbol"] for g in got] == ["rowsum_partial_kernel", "rowsum_combine_kernel"]
    assert [g["grid"] for g in got] == [(37, 8, 1), (37, 1, 1)]
    assert [g["block"] for g in got] == [tuple(t.launch.block) for t in v.launches]
    assert len({g["stream"] for g in got}) == 1  # one stream for the whole call
    ws = workspace_pointer(v, got[0], "partial")
    assert ws == workspace_pointer(v.then[0], got[1], "partial") != 0  # phase 2 reads what phase 1 wrote
    assert ws not in (x.data_ptr(), y.data_ptr())
    tensors = {"x": x, "y": y}
    for t, g in zip(v.launches, got):
        assert g["kernargs"] == expected_kernargs(t, tensors, {"partial": ws}), t.code_object.symbol
    # chunk = cdiv(1000, SPLIT=8) = 125 columns per phase-1 program, packed as the kernel's i32
    chunk = next(f for f in v.kernargs.fields if f.kernel_arg == "chunk")
    assert struct.unpack_from("<i", got[0]["kernargs"], chunk.offset)[0] == 125
    launched = {k: n for k, n in ops.rowsum_split.stats()["launches"].items() if n}
    assert launched == {"f32__generic": 1}  # one call, both kernels


def test_a_workspace_is_fresh_per_call_and_sized_by_its_shape_rule(multilaunch_bundle, recorded, launches):
    ops = recorded(multilaunch_bundle)
    v = variant(multilaunch_bundle, "rowsum_atomic", "f32__generic", "gfx942")  # 300 columns: the generic one
    assert v.workspaces == (M.Workspace("acc", ("x.shape[0]",), "float32", zero=True),)
    x = torch.randn(5, 300)
    y = ops.rowsum_atomic(x)
    got = launches()
    assert [g["symbol"] for g in got] == ["rowsum_atomic_kernel", "rowsum_cast_kernel"]
    assert [g["grid"] for g in got] == [(5, 4, 1), (1, 1, 1)]
    ws = workspace_pointer(v, got[0], "acc")
    for t, g in zip(v.launches, got):
        assert g["kernargs"] == expected_kernargs(t, {"x": x, "y": y}, {"acc": ws})


def test_bf16_inputs_take_the_bf16_specialization_and_a_strided_input_its_row_stride(
        multilaunch_bundle, recorded, launches):
    ops = recorded(multilaunch_bundle)
    x = torch.randn(16, 600).to(torch.bfloat16)[:, :512]  # row stride 600, unit column stride: fits
    ops.rowsum_split(x)
    got = launches()
    assert len(got) == 2 and ops.rowsum_split.stats()["launches"]["bf16__generic"] == 1  # stride 600 % 16 != 0
    v = variant(multilaunch_bundle, "rowsum_split", "bf16__generic", "gfx942")
    stride = next(f for f in v.kernargs.fields if f.kernel_arg == "x_row_stride")
    assert struct.unpack_from("<i", got[0]["kernargs"], stride.offset)[0] == 600


def test_an_empty_input_launches_nothing_and_returns_an_empty_output(multilaunch_bundle, recorded, launches):
    ops = recorded(multilaunch_bundle)
    y = ops.rowsum_split(torch.randn(0, 64))
    assert y.shape == (0,) and launches() == []
    assert ops.rowsum_split.stats()["empty"] == 1


def test_a_workspace_whose_bytes_overflow_is_refused_before_any_launch(edited, recorded, launches):
    def huge(v):
        v["workspaces"][0]["shape"] = ["x.shape[0] * 1152921504606846976", "8"]

    ops = recorded(edited(huge), fallback=False)
    with pytest.raises(RuntimeError, match=re.escape("workspace partial bytes overflow int64 at size 'x.shape[0] * "
                                                     "1152921504606846976' = 4611686018427387904")):
        ops.rowsum_split(torch.randn(4, 64))
    assert launches() == []


def test_a_workspace_of_negative_size_falls_back_to_the_reference_with_the_reason(edited, recorded, launches):
    def negative(v):
        v["workspaces"][0]["shape"] = ["x.shape[0] - 100", "8"]

    ops = recorded(edited(negative))
    x = torch.randn(4, 64)
    with pytest.warns(UserWarning, match=re.escape("workspace partial size 'x.shape[0] - 100' is -96, expected >= 0")):
        torch.testing.assert_close(ops.rowsum_split(x), x.sum(1))
    assert launches() == []
    with pytest.raises(RuntimeError, match="is -96, expected >= 0"):
        recorded(edited(negative), fallback=False).rowsum_split(x)


def test_a_workspace_of_no_elements_while_its_kernels_run_falls_back_naming_its_shape(edited, recorded, launches):
    def no_elements(v):  # 0 rows for 4 input rows: the allocator gives no memory (a null pointer), the grid is 4x8
        v["workspaces"][0]["shape"] = ["x.shape[0] - 4", "8"]

    ops = recorded(edited(no_elements))
    x = torch.randn(4, 64)
    message = ("workspace partial has shape [0, 8] (sizes 'x.shape[0] - 4', '8') for these inputs, which holds no "
               "elements while its kernels run; expected at least one element")
    with pytest.warns(UserWarning, match=re.escape(message)):
        torch.testing.assert_close(ops.rowsum_split(x), x.sum(1))
    assert launches() == []
    with pytest.raises(RuntimeError, match=re.escape(message)):
        recorded(edited(no_elements), fallback=False).rowsum_split(x)
    assert launches() == []


def test_a_workspace_the_allocator_cannot_give_is_refused_naming_it(edited, recorded, launches):
    def huge(v):  # 4 TiB per input row: legal sizes, more memory than this machine has
        v["workspaces"][0]["shape"] = ["x.shape[0] * 1099511627776"]

    ops = recorded(edited(huge), fallback=False)
    with pytest.raises(RuntimeError, match=r"rowsum_split: allocating workspace 'partial' of shape \[4398046511104\] "
                                           r"and dtype float32 \(17592186044416 bytes\) on cpu failed: .*; free "
                                           r"memory or pass smaller inputs"):
        ops.rowsum_split(torch.randn(4, 64))
    assert launches() == []


def test_a_second_launch_that_cannot_run_stops_the_call_before_the_first_launch(edited, recorded, launches):
    def too_much_lds(v):  # the recording device allows 64 KiB per workgroup
        v["then"][0]["launch"]["dynamic_lds"] = "x.shape[0] * 4096"

    ops = recorded(edited(too_much_lds), fallback=False)
    ops.rowsum_split(torch.randn(2, 64))  # 8 KiB: both run
    assert [g["symbol"] for g in launches()] == ["rowsum_partial_kernel", "rowsum_combine_kernel"]
    with pytest.raises(RuntimeError, match=r"rowsum_combine_kernel.* needs \d+ bytes of static \+ 131072 bytes of "
                                           r"dynamic LDS"):
        ops.rowsum_split(torch.randn(32, 64))
    assert launches() == []  # never half run


def test_a_second_launch_whose_grid_overflows_is_the_fallback_reason(edited, recorded, launches):
    def huge(v):
        v["then"][0]["launch"]["grid"][0] = "x.shape[0] * 4611686018427387904"

    ops = recorded(edited(huge), fallback=False)
    with pytest.raises(RuntimeError, match=re.escape("launch 2 (rowsum_combine_kernel): grid 'x.shape[0] * "
                                                     "4611686018427387904' overflows int64")):
        ops.rowsum_split(torch.randn(4, 64))
    assert launches() == []


@pytest.mark.parametrize("edit, message", [
    (lambda v: v["then"][0]["kernargs"]["fields"][0].update(arg="nowhere"),
     "a workspace field names 'nowhere', expected a workspace of the variant (partial)"),
    (lambda v: v["then"][0].update(target="gfx950"), "a following launch runs on its variant's target gfx942"),
    (lambda v: v["then"][0].update(then=[dict(v["then"][0])]), "a following launch has no then or workspaces"),
    (lambda v: v["workspaces"].append({"name": "spare", "shape": ["4"], "dtype": "float32", "zero": False}),
     "workspaces ['spare'] are passed to no launch"),
    (lambda v: v["workspaces"][0].update(name="x"), "workspace name 'x' repeats an argument"),
    (lambda v: v["workspaces"][0].update(dtype="float128"), "expected a dtype name"),
    (lambda v: v["workspaces"][0].update(shape=["y.shape[0]"]), "y"),
    (lambda v: v["workspaces"][0].update(shape=["device.sm_count"]), "sm_count"),
    (lambda v: v["then"].extend([v["then"][0]] * 16), "expected at most 16 launches"),
])
def test_a_hostile_multi_launch_manifest_is_refused_at_load(edited, recorded, edit, message):
    with pytest.raises(BundleError, match=re.escape(message)):
        recorded(edited(edit))


def test_the_code_object_of_every_launch_is_checked_against_its_variant(edited, recorded, launches):
    def swap(v):  # launch 2 claims launch 1's code object: its symbol is not in that file
        v["then"][0]["code_object"]["file"] = v["code_object"]["file"]
        v["then"][0]["code_object"]["sha256"] = v["code_object"]["sha256"]

    ops = recorded(edited(swap), fallback=False)
    with pytest.raises(Exception, match="rowsum_combine_kernel"):
        ops.rowsum_split(torch.randn(4, 64))
    assert launches() == []


def test_a_1_1_manifest_still_loads_and_has_no_following_launches(tiny_bundle):
    m = M.read(tiny_bundle)
    assert m.schema_version == "1.1"
    assert all(v.then == () and v.workspaces == () and v.launches == (v,)
               for o in m.ops for s in o.specializations for v in s.variants)


def test_the_plan_tables_name_the_workspace_field_kind_as_the_manifest_does(record_ext):
    assert list(record_ext.PLAN_TABLES["field_kinds"]) == list(M.FIELD_KINDS)


def test_loading_a_multi_launch_variant_ahead_loads_the_code_object_of_every_launch(multilaunch_bundle, recorded,
                                                                                   record_ext):
    ops = recorded(multilaunch_bundle)
    before = record_ext.loaded_modules()  # modules are cached per (device, sha256): a device nothing used yet
    ops.rowsum_split.load_kernel("f16", target="gfx942", device=11)
    assert record_ext.loaded_modules() == before + 2  # rowsum_split.f16.gfx942.hsaco and its .2.hsaco


def test_a_bundle_with_following_launches_is_written_as_2_0_which_a_1_x_loader_refuses(multilaunch_bundle,
                                                                                        monkeypatch):
    from flyship.errors import ManifestVersionError

    m = M.read(multilaunch_bundle)
    assert m.schema_version == M.version_for(m) == "2.3"
    assert M.must_understand(m) == ("then", "workspaces")
    monkeypatch.setattr(M, "NEWEST_MINOR", {1: 2})  # a loader that knows only 1.x (as flyship before 2.0)
    with pytest.raises(ManifestVersionError, match=r"schema version 2\.3 is not readable .* reads 1\.x \(up to 1\.2\)"):
        M.read(multilaunch_bundle)


def test_a_1_x_manifest_that_uses_must_understand_keys_is_refused_saying_how_to_rebuild(tmp_path, multilaunch_bundle):
    root = tmp_path / "b"
    shutil.copytree(multilaunch_bundle, root)
    data = json.loads((root / "manifest.json").read_text())
    data["schema_version"] = "1.2"
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"expected 2\.3 for a bundle that uses then, workspaces, got '1\.2': a 1\.x loader would ignore those keys.*"
                                          r"rebuild the bundle with this flyc-build"):
        M.read(root)


def test_only_bundles_with_must_understand_keys_get_2_0(multilaunch_bundle):
    import dataclasses

    m = M.read(multilaunch_bundle)
    plain = dataclasses.replace(m, ops=tuple(
        dataclasses.replace(o, specializations=tuple(
            dataclasses.replace(s, variants=tuple(dataclasses.replace(v, then=(), workspaces=()) for v in s.variants))
            for s in o.specializations)) for o in m.ops))
    assert M.must_understand(plain) == () and M.version_for(plain) == "1.5"
    op = plain.ops[0]
    in_place = dataclasses.replace(plain, ops=(dataclasses.replace(
        op, args=(dataclasses.replace(op.args[0], mutable=True), *op.args[1:])),))
    assert M.must_understand(in_place) == ("mutable",) and M.version_for(in_place) == "2.3"
