"""An output whose dtype differs per target (manifest ``outputs[].target_dtypes``, written as 6.0; issue 34 item 2:
an fp8 output that is float8_e4m3fnuz on gfx942 and float8_e4m3fn on gfx950 could not be declared under one op
name). The tiny bundle's ``add`` edited to such an output: the recording driver at each target allocates the
target's dtype (fresh outputs, fake kernels, ``out=`` checks, the reference's result), the host keeps ``dtype``, the
rule book refuses bad entries and a loader that reads up to 5.x refuses the bundle with its version message."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from flyship.bundle import manifest as _m
from flyship.bundle.errors import BundleError
from flyship.errors import ConfigError, ManifestVersionError

pytestmark = pytest.mark.cpu

FNUZ, FN = torch.float8_e4m3fnuz, torch.float8_e4m3fn
GFX942, GFX950 = "gfx942:sramecc+:xnack-", "gfx950"

REFERENCE = '''

def add_fp8(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x + y).to(torch.float8_e4m3fn)
'''


def per_target(bundle_copy, edit_output=None, version: str = "6.0") -> Path:
    """The tiny bundle with ``add``'s output float8_e4m3fn, float8_e4m3fnuz on gfx942 (its reference in fn)."""
    root = bundle_copy(None)
    refs = root / "references.py"
    refs.write_text(refs.read_text() + REFERENCE)
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    data["references_sha256"] = hashlib.sha256(refs.read_bytes()).hexdigest()
    add = next(o for o in data["ops"] if o["name"] == "add")
    add["reference"] = "add_fp8"
    add["outputs"][0].update(dtype="float8_e4m3fn", target_dtypes={"gfx942": "float8_e4m3fnuz"})
    if edit_output is not None:
        edit_output(add["outputs"][0])
    data["schema_version"] = version
    path.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n")
    return root


def test_the_manifest_carries_per_target_dtypes_as_a_6_0_must_understand_key(bundle_copy, tmp_path):
    m = _m.read(per_target(bundle_copy))
    out = m.op("add").outputs[0]
    assert out.target_dtypes == {"gfx942": "float8_e4m3fnuz"} and _m.must_understand(m) == ("target_dtypes",)
    assert _m.version_for(m) == "6.0"
    assert [_m.output_dtype(out, t) for t in (GFX942, "gfx942", GFX950, "sm_90a", None)] == [
        "float8_e4m3fnuz", "float8_e4m3fnuz", "float8_e4m3fn", "float8_e4m3fn", "float8_e4m3fn"]
    _m.write(m, tmp_path / "manifest.json")  # written back: the key stays; an output without one writes none
    written = json.loads((tmp_path / "manifest.json").read_text())
    ops = {o["name"]: o for o in written["ops"]}
    assert ops["add"]["outputs"][0]["target_dtypes"] == {"gfx942": "float8_e4m3fnuz"}
    assert "target_dtypes" not in ops["scale_rows"]["outputs"][0]


@pytest.mark.parametrize("target, want", [(GFX942, FNUZ), (GFX950, FN), ("sm_90a", FN)])
def test_the_recording_driver_allocates_the_dtype_of_its_target(bundle_copy, recorded, launches, target, want):
    ops = recorded(per_target(bundle_copy), target=target)
    x, y = torch.randn(1000), torch.randn(1000)
    assert ops.add(x, y).dtype == want
    assert [k["symbol"] for k in launches()] == ["add_kernel"]  # the kernel ran (recorded), not the reference
    good = torch.empty(1000, dtype=want)
    ops.add.out(x, y, out=good)
    with pytest.raises(Exception, match=rf"expected out tensor 'out' of shape \[1000\] and dtype "
                                        rf"{str(want).removeprefix('torch.')}"):
        ops.add.out(x, y, out=torch.empty(1000, dtype=FN if want == FNUZ else FNUZ))
    meta = getattr(torch.ops, ops.namespace).add(x.to("meta"), y.to("meta"))  # the fake kernel (torch.compile)
    assert meta.device.type == "meta" and meta.dtype == want


def test_the_reference_result_is_converted_to_the_targets_dtype(bundle_copy, recorded, launches):
    ops = recorded(per_target(bundle_copy), target=GFX942)
    x, y = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)  # no spec takes float64
    with pytest.warns(UserWarning, match=r"no specialization fits these inputs \(dtype x=float64\)"):
        got = ops.add(x, y)
    assert launches() == [] and got.dtype == FNUZ
    assert torch.equal(got.float(), (x + y).to(FN).to(FNUZ).float())


def test_the_host_keeps_the_outputs_dtype(bundle_copy, ext):
    import uuid

    import flyship

    ops = flyship.load(per_target(bundle_copy), namespace=f"flyship_t{uuid.uuid4().hex[:10]}")
    if ops.flavor != "cpu" and torch.cuda.is_available():
        pytest.skip("a GPU is here: this test proves the host's (no GPU) dtype")
    x, y = torch.randn(100), torch.randn(100)
    got = ops.add(x, y)
    assert got.dtype == FN and torch.equal(got.float(), (x + y).to(FN).float())


def test_dispatch_with_out_on_a_target_of_another_dtype_is_refused(bundle_copy, recorded):
    ops = recorded(per_target(bundle_copy), target=GFX942)
    x, y = torch.randn(1000), torch.randn(1000)
    assert ops.add.dispatch(x, y, target=GFX950).spec == "f32"
    assert ops.add.dispatch(x, y, target=GFX942, out=torch.empty(1000, dtype=FNUZ)).spec == "f32"
    with pytest.raises(ConfigError, match=r"output out's dtype is float8_e4m3fn on gfx950 and float8_e4m3fnuz on "
                                          r"this process's devices"):
        ops.add.dispatch(x, y, target=GFX950, out=torch.empty(1000, dtype=FN))


def test_a_process_whose_gpus_need_two_dtypes_is_refused(bundle_copy):
    from flyship.loader import plancache, target_dtypes

    plan = plancache.BundlePlan.of(_m.read(per_target(bundle_copy)))
    one, target = target_dtypes.resolve(plan, lambda: [GFX942, "gfx942:sramecc-:xnack-"])
    assert target == GFX942 and one.head.op("add").outputs[0].dtype == "float8_e4m3fnuz"
    assert plan.head.op("add").outputs[0].target_dtypes  # the shared plan is unchanged
    with pytest.raises(ConfigError, match=r"op add output out: expected one dtype on every GPU of the process, got "
                                          r"gfx942:sramecc\+:xnack-: float8_e4m3fnuz, gfx950: float8_e4m3fn"):
        target_dtypes.resolve(plan, lambda: [GFX942, GFX950])


@pytest.mark.parametrize("edit, message", [
    (lambda o: o.update(target_dtypes={"gfx0942": "float8_e4m3fnuz"}),
     r"target_dtypes\.gfx0942: expected a known target .* did you mean 'gfx942'"),
    (lambda o: o.update(target_dtypes={"gfx942": "float9"}), r"output out dtype 'float9' is neither a dtype"),
    (lambda o: o.update(target_dtypes={"gfx942": "out"}), r"takes its dtype from 'out', which is a scalar or an "),
    (lambda o: o.update(target_dtypes={"gfx942": "float8_e4m3fn"}),
     r"target_dtypes\.gfx942: output out's dtype on gfx942 is 'float8_e4m3fn', its dtype everywhere"),
])
def test_the_rule_book_refuses_a_bad_per_target_dtype(bundle_copy, edit, message):
    with pytest.raises(BundleError, match=message):
        _m.read(per_target(bundle_copy, edit))


def test_a_5_0_manifest_with_per_target_dtypes_is_refused_naming_6_0(bundle_copy):
    with pytest.raises(BundleError, match=r"expected 6\.0 for a bundle that uses target_dtypes, got '5\.0': a 5\.x "
                                          r"loader would ignore that key"):
        _m.read(per_target(bundle_copy, version="5.0"))


@pytest.mark.parametrize("newest", [{1: 5, 2: 3, 3: 2, 4: 1, 5: 0}, {1: 4, 2: 2, 3: 1, 4: 0}])
def test_a_loader_that_reads_up_to_5_x_refuses_the_bundle_with_its_version_message(bundle_copy, monkeypatch, newest):
    bundle = per_target(bundle_copy)
    monkeypatch.setattr(_m, "NEWEST_MINOR", newest)  # as a flyship before target_dtypes (5.0), or before 5.0
    with pytest.raises(ManifestVersionError, match=r"schema version 6\.0 is not readable .* rebuild the bundle"):
        _m.read(bundle)


@pytest.mark.parametrize("target, want", [(GFX942, FNUZ), (GFX950, FN)])
def test_torch_compile_traces_the_targets_dtype(bundle_copy, recorded, target, want):
    ops = recorded(per_target(bundle_copy), target=target)
    seen = []

    def backend(gm, example_inputs):  # the graph dynamo traced through the op's fake kernel
        seen.extend(n.meta["example_value"].dtype for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    cf = torch.compile(lambda x, y: ops.add(x, y), backend=backend, fullgraph=True)
    assert cf(torch.randn(1000), torch.randn(1000)).dtype == want and seen == [want]
