"""Outputs a kernel accumulates into (``Output(..., zero=True)``, manifest ``outputs[].zero``) in the workload
Python, without a GPU: the C++ call path (recording driver) hands the kernel a zero-filled fresh output and zeroes
an ``out=`` tensor before the launch; the CPU path (the reference) and the fake kernel are unchanged; a 1.x
manifest that uses the key is refused (a 1.x loader would ignore it and hand the kernel garbage)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import flyship
from flyship.bundle import manifest as _m
from flyship.errors import FlyshipError

pytestmark = pytest.mark.cpu


def _zeroed(bundle_copy: Callable[..., Path], version: str = "3.0") -> Path:
    """The tiny bundle with its ``add`` and ``addsub`` ops' first output declared zero-filled."""

    def edit(d: dict) -> None:
        d["schema_version"] = version
        for op in d["ops"]:
            if op["name"] in ("add", "addsub"):
                op["outputs"][0]["zero"] = True

    return bundle_copy(edit)


def test_the_manifest_says_which_outputs_start_from_zeros_and_the_plan_carries_it(bundle_copy):
    from flyship.loader import plan as _plan

    m = _m.read(_zeroed(bundle_copy))
    addsub = m.op("addsub")
    assert [(o.name, o.zero) for o in addsub.outputs] == [("sum", True), ("diff", False)]
    assert _m.must_understand(m) == ("zero",) and _m.version_for(m) == "3.2"
    assert [o["zero"] for o in _plan.lower_op(addsub, m.namespace)["outputs"]] == [True, False]


@pytest.mark.parametrize("version", ["1.3", "2.1"])
def test_a_1_x_or_2_x_manifest_that_zero_fills_an_output_is_refused(bundle_copy, version):
    # flyship of schema 2.0 reads a newer 2.x minor leniently: zero-filled outputs need a major its readers refuse
    major = version.split(".")[0]
    with pytest.raises(FlyshipError, match=rf"expected 3\.2 for a bundle that uses zero, got '{version}': a {major}\.x "
                                           "loader would ignore that key"):
        flyship.load(_zeroed(bundle_copy, version=version), namespace=f"flyship_z{uuid.uuid4().hex[:8]}")


def test_a_zero_filling_bundle_is_refused_by_a_loader_that_knows_only_2_x(bundle_copy, monkeypatch):
    from flyship.errors import ManifestVersionError

    path = _zeroed(bundle_copy)
    monkeypatch.setattr(_m, "NEWEST_MINOR", {1: 3, 2: 0})  # as the flyship that wrote 2.0 for then/mutable
    with pytest.raises(ManifestVersionError, match=r"schema version 3\.0 is not readable"):
        _m.read(path)


def test_an_out_tensor_of_a_zero_output_is_zero_filled_before_the_launch(bundle_copy, recorded, launches):
    ops = recorded(_zeroed(bundle_copy))
    x, y = torch.randn(100), torch.randn(100)
    s, d = torch.full((100,), 7.0), torch.full((100,), 7.0)
    ops.addsub.out(x, y, sum=s, diff=d)
    assert len(launches()) == 1  # the recording driver runs no kernel: what the loader did is all that shows
    assert not s.any()  # zero=True: zeroed for the kernel to accumulate into
    assert bool((d == 7.0).all())  # an ordinary output is left to the kernel to write
    out = torch.full((100,), 7.0)
    torch.ops.__getattr__(ops.namespace).add.out(x, y, out=out)  # the dispatcher path, as the fast path
    assert not out.any()


def test_a_fresh_zero_output_is_allocated_zero_filled(bundle_copy, recorded, launches):
    ops = recorded(_zeroed(bundle_copy))
    for n in (100, 4096, 1 << 16):
        junk = torch.full((n,), float("nan"))  # freed memory the allocator may hand back
        del junk
        s, d = ops.addsub(torch.randn(n), torch.randn(n))
        assert not s.any() and not s.isnan().any()
    assert len(launches()) == 3


def test_on_cpu_tensors_the_reference_still_computes_a_zero_output(bundle_copy, ext):
    ops = flyship.load(_zeroed(bundle_copy), namespace=f"flyship_z{uuid.uuid4().hex[:8]}")
    x, y = torch.randn(100), torch.randn(100)
    torch.testing.assert_close(ops.add(x, y), x + y)
    out = torch.full((100,), 7.0)
    ops.add.out(x, y, out=out)
    torch.testing.assert_close(out, x + y)
    fake = torch.ops.__getattr__(ops.namespace).add(x.to("meta"), y.to("meta"))  # the fake kernel: shape only
    assert fake.shape == (100,) and fake.device.type == "meta"



def test_the_triton_atomic_rowsum_example_declares_its_output_zero_filled_and_runs_its_reference_on_cpu(
        triton_examples_bundle, ext):
    ops = flyship.load(triton_examples_bundle, namespace=f"flyship_z{uuid.uuid4().hex[:8]}")
    assert [(o.name, o.zero) for o in ops.rowsum_atomic_out.manifest.outputs] == [("acc", True)]
    x = torch.randn(16, 300)
    torch.testing.assert_close(ops.rowsum_atomic_out(x), x.sum(dim=1))
