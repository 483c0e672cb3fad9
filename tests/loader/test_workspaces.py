"""Workspaces sized by the device and one kernel launched twice (issue 23, items 3 and 5) on the recording driver:
the C++ call path sizes the ``(device.cu_count, N)`` workspace and the persistent grid on the device it runs on,
and every recorded kernarg byte is what the manifest says. The bundle is examples/triton/workspaces.py built by
flyc-build for sm_90 and gfx942."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from flyship.bundle import expr as E
from flyship.bundle import manifest as M

from tests.conftest import ROOT, run_build

pytestmark = pytest.mark.cpu

_FMT = {"ptr": "<Q", "u64": "<Q", "i64": "<q", "i32": "<i", "u32": "<I", "f32": "<f"}


@pytest.fixture(scope="module")
def ws_bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ws") / "workspaces"
    run_build(ROOT / "examples" / "triton" / "workspaces.py", out, ["sm_90", "gfx942"], "-j", "2")
    return out


def packed(v: M.Variant, tensors: dict[str, torch.Tensor], scalars: dict[str, Any], workspaces: dict[str, int],
           cu_count: int) -> bytes:
    """One launch's kernarg buffer, packed here from the manifest alone (an independent packer)."""
    shapes = {k: tuple(t.shape) for k, t in tensors.items()}
    strides = {k: tuple(t.stride()) for k, t in tensors.items()}
    ints = {k: x for k, x in scalars.items() if isinstance(x, int)}
    buf = bytearray(v.kernargs.size)
    for f in v.kernargs.fields:
        value = {"pointer": lambda: tensors[f.arg].data_ptr(), "workspace": lambda: workspaces[f.arg],
                 "shape": lambda: shapes[f.arg][f.dim], "stride": lambda: strides[f.arg][f.dim],
                 "scalar": lambda: scalars[f.arg], "null": lambda: 0,
                 "expr": lambda: E.evaluate_with_shapes(f.expr, shapes, ints, strides,
                                                        device={"cu_count": cu_count})}[f.kind]()
        struct.pack_into(_FMT[f.type], buf, f.offset, value)
    return bytes(buf)


def pointer_of(v: M.Variant, launch: dict, name: str) -> int:
    f = next(f for f in v.kernargs.fields if f.arg == name and f.kind in ("workspace", "pointer"))
    return struct.unpack_from("<Q", launch["kernargs"], f.offset)[0]


def variant(bundle: Path, op: str, spec: str, target: str) -> M.Variant:
    s = next(s for s in M.read(bundle).op(op).specializations if s.name == spec)
    return next(v for v in s.variants if v.target == target)


@pytest.mark.parametrize("cu_count", [132, 114])  # an H200, an H100 PCIe: one target ID, two device sizes
def test_the_workspace_and_the_persistent_grid_follow_the_devices_sm_count(ws_bundle, record_ext, recorded, launches,
                                                                           cu_count):
    ops = recorded(ws_bundle, target="sm_90")
    record_ext.set_recorded_device(0, "sm_90", 227 * 1024, 1024, cu_count)
    rows = cu_count * 16  # 16 rows per program: the JIT variant's guard (as the example's 4096 rows on 132 SMs)
    x, dy, w = torch.randn(rows, 64), torch.randn(rows, 64), torch.randn(64)
    dx, dw = ops.rmsnorm_bwd(dy, x, w, 1e-5)
    spec = "f32_n4096__sm_90"
    assert ops.rmsnorm_bwd.stats()["launches"][spec] == 1
    v = variant(ws_bundle, "rmsnorm_bwd", spec, "sm_90a")
    got = launches()
    assert [g["symbol"] for g in got] == ["rmsnorm_bwd_dx_kernel", "sum_rows_kernel"]
    assert [g["grid"] for g in got] == [(cu_count, 1, 1), (1, 1, 1)]
    ws = pointer_of(v, got[0], "partial")
    assert ws == pointer_of(v.then[0], got[1], "partial") != 0 and ws % 16 == 0
    tensors = {"dy": dy, "x": x, "w": w, "dx": dx, "dw": dw}
    for t, g in zip(v.launches, got):
        assert g["kernargs"] == packed(t, tensors, {"eps": 1e-5}, {"partial": ws}, cu_count), t.code_object.symbol


def test_a_misaligned_input_or_another_row_count_takes_the_generic_specialization(ws_bundle, record_ext, recorded,
                                                                                  launches):
    ops = recorded(ws_bundle, target="sm_90")
    record_ext.set_recorded_device(0, "sm_90", 227 * 1024, 1024, 132)
    x = torch.randn(132 * 16 * 64 + 1)[1:].view(132 * 16, 64)  # 4 bytes past an aligned block
    ops.rmsnorm_bwd(torch.randn(132 * 16, 64), x, torch.randn(64), 1e-5)
    ops.rmsnorm_bwd(torch.randn(100, 64), torch.randn(100, 64), torch.randn(64), 1e-5)  # 1 row per program
    assert ops.rmsnorm_bwd.stats()["launches"]["f32_n4096__generic"] == 2
    assert len(launches()) == 4


def test_one_kernel_launched_twice_passes_the_workspace_it_wrote_to_the_second_launch(ws_bundle, recorded, launches):
    ops = recorded(ws_bundle, target="sm_90")
    x, y, z = torch.randn(4096), torch.randn(4096), torch.randn(4096)
    out = ops.add3(x, y, z)
    got = launches()
    v = variant(ws_bundle, "add3", "f32", "sm_90a")
    assert [g["symbol"] for g in got] == ["add_kernel", "add_kernel"]
    xy = pointer_of(v, got[0], "xy")
    assert xy == pointer_of(v.then[0], got[1], "xy") and xy not in (x.data_ptr(), out.data_ptr())
    tensors = {"x": x, "y": y, "z": z, "out": out}
    for t, g in zip(v.launches, got):
        assert g["kernargs"] == packed(t, tensors, {}, {"xy": xy}, 132)
