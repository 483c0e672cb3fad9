"""flyship.dry_run (loader/record.py): the public, documented face of the recording driver, a bundle's real C++
call path on a CPU-only machine (issue 34, item 1: a user's harness imported the extension module's internals and
broke when they moved)."""

from __future__ import annotations

import struct

import pytest
import torch

import flyship
from flyship.bundle import manifest as M
from flyship.errors import ConfigError

pytestmark = pytest.mark.cpu


def _blocks(bundle, op: str, processor: str) -> set[tuple[int, int, int]]:
    """The blocks the op's variants for ``processor`` launch with (gfx942: 64-wide wavefronts; sm_90: 32-wide warps)."""
    return {tuple(t.launch.block) for s in M.read(bundle).op(op).specializations for v in s.variants
            if v.target.startswith(processor) for t in v.launches}


def test_a_dry_run_records_each_launch_with_its_kernarg_bytes_and_clears_on_read(tiny_bundle, record_ext):
    run = flyship.dry_run(tiny_bundle, target="gfx942:sramecc+:xnack-")
    assert isinstance(run, flyship.DryRun) and run.ops.flavor == "record" and run.target == "gfx942:sramecc+:xnack-"
    run.launches()  # whatever an earlier test left
    x, y = torch.randn(1025), torch.randn(1025)
    out = run.ops.add(x, y)
    (launch,) = run.launches()
    assert isinstance(launch, flyship.RecordedLaunch)
    assert launch.symbol == "add_kernel" and launch.block in _blocks(tiny_bundle, "add", "gfx942")
    assert launch.grid == (2, 1, 1) and launch.block[0] > 0 and launch.device == 0
    assert struct.unpack_from("<QQQ", launch.kernargs, 0) == (x.data_ptr(), y.data_ptr(), out.data_ptr())
    assert run.launches() == []  # read once
    run.ops.add(x, y)
    assert len(run.launches(clear=False)) == 1 and len(run.launches()) == 1 and run.launches() == []


def test_a_dry_run_chooses_variants_for_the_target_it_is_given(tiny_bundle, record_ext):
    run = flyship.dry_run(tiny_bundle, target="sm_90")
    run.launches()
    run.ops.add(torch.randn(64), torch.randn(64))
    (launch,) = run.launches()
    assert launch.block in _blocks(tiny_bundle, "add", "sm_90") and launch.block != (256, 1, 1)  # not gfx942's


def test_dry_run_refuses_a_bad_target_or_device_size_and_a_namespace_loaded_for_real(tiny_bundle, record_ext, ext):
    with pytest.raises(ConfigError, match="dry_run: expected target to be a target ID string"):
        flyship.dry_run(tiny_bundle, target=942)
    with pytest.raises(ConfigError, match="dry_run: expected cu_count to be an int >= 1, got 0"):
        flyship.dry_run(tiny_bundle, cu_count=0)
    real = flyship.load(tiny_bundle, namespace="flyship_dry_taken")
    if real.flavor == "record":
        pytest.skip("this process's GPU flavor is the recording driver (FLYSHIP_FLAVOR=record)")
    with pytest.raises(ConfigError, match="namespace 'flyship_dry_taken' is already loaded in this process on the"):
        flyship.dry_run(tiny_bundle, namespace="flyship_dry_taken")


def _rename_output(data: dict) -> None:
    """The tiny bundle's add with its one output named as a Triton tutorial's kernel names it (output_ptr)."""
    op = next(o for o in data["ops"] if o["name"] == "add")
    op["outputs"][0]["name"] = "output_ptr"
    for s in op["specializations"]:
        align = s["guard"]["alignment"]
        if "out" in align:
            align["output_ptr"] = align.pop("out")
        assert not any("out" in c for c in s["guard"]["constraints"])
        for v in s["variants"]:
            for f in v["kernargs"]["fields"]:
                if f["arg"] == "out":
                    f["arg"] = "output_ptr"


def test_out_of_an_op_whose_one_output_is_not_named_out_takes_the_fast_entry(bundle_copy, record_ext):
    # torch's out schema calls a lone output `out` (add.out(Tensor x, Tensor y, *, Tensor(a!) out)); the fast entry
    # knew the output by its own name only, so every .out(..., out=t) of such an op went through torch's __call__.
    run = flyship.dry_run(bundle_copy(_rename_output))
    assert run.ops.add.manifest.outputs[0].name == "output_ptr"
    x, y, o = torch.randn(1025), torch.randn(1025), torch.empty(1025)
    packet = getattr(torch.ops, run.ops.namespace).add
    run.launches()
    for call, obj in ((lambda: packet.out(x, y, out=o), packet.out),
                      (lambda: run.ops.add.out(x, y, out=o), run.ops.add.out)):
        before = record_ext.fast_call_counts(obj)["fast"]
        call()
        assert record_ext.fast_call_counts(obj)["fast"] == before + 1, obj
        (launch,) = run.launches()
        assert struct.unpack_from("<Q", launch.kernargs, 16) == (o.data_ptr(),)  # written into o
    assert run.ops.add.out(x, y, out=(o,)) is not None  # the handle's tuple form still works
    assert len(run.launches()) == 1
