"""A composite that receives a workspace (schema 1.5, written as 5.0; issue 34 item 2: an Output cannot be sized by
``device.cu_count`` and a composite could not see a workspace, so a per-CU partial buffer had no way in): the loader
allocates it per call on the first tensor's device, sized by that device's CU count, and passes it after the
composite's arguments. Runs the real call path on the recording driver (``flyship.dry_run``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from flyship.bundle import manifest as _m
from flyship.bundle.errors import BundleError

pytestmark = pytest.mark.cpu

FUNCTION = '''

def per_cu(ops, x, partial, scratch):
    """y = x + x through the bundle's kernel; partial: one zeroed row per CU, handed back to show its shape."""
    assert scratch.dtype == torch.float16 and scratch.shape == (x.shape[0] // 4,)
    return ops.add(x, x), partial
'''

COMPOSITE = {"name": "per_cu", "doc": "a per-CU buffer", "function": "per_cu", "returns": ["y", "parts"],
             "args": [{"name": "x", "kind": "tensor", "rank": 1, "dtypes": [], "default": None}],
             "workspaces": [{"name": "partial", "shape": ["device.cu_count", "x.shape[0]"], "dtype": "float32",
                             "zero": True},
                            {"name": "scratch", "shape": ["x.shape[0] // 4"], "dtype": "float16", "zero": False}]}


def with_composite(bundle_copy, composite: dict = COMPOSITE, version: str = "5.0") -> Path:
    root = bundle_copy(None)
    refs = root / "references.py"
    refs.write_text(refs.read_text() + FUNCTION)
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    data["references_sha256"] = hashlib.sha256(refs.read_bytes()).hexdigest()
    data["composites"] = [composite]
    data["schema_version"] = version
    path.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n")
    return root


def test_a_composite_gets_a_workspace_of_one_row_per_cu_of_the_device_that_runs_the_call(bundle_copy):
    import flyship

    bundle = with_composite(bundle_copy)
    m = _m.read(bundle)
    assert _m.must_understand(m) == ("composites", "composite_workspaces") and _m.version_for(m) == "5.0"
    x = torch.randn(4096)
    for cu in (304, 80):  # an MI300X, then an MI308X: same target, other CU counts
        run = flyship.dry_run(bundle, cu_count=cu)
        run.launches()
        y, parts = run.ops.per_cu(x)
        assert parts.shape == (cu, 4096) and parts.dtype == torch.float32 and not parts.any()  # zero=True
        assert y.shape == x.shape and [(k.symbol, k.grid) for k in run.launches()] == [("add_kernel", (4, 1, 1))]


def test_a_composite_s_dispatch_is_a_flyship_refusal_saying_what_to_ask_instead(bundle_copy):
    # A trial user's ops.<composite>.dispatch(...) got torch's raw AttributeError from the op packet.
    import flyship
    from flyship.errors import CallTypeError

    run = flyship.dry_run(with_composite(bundle_copy), target="gfx942")
    with pytest.raises(CallTypeError, match=r"per_cu\.dispatch: expected an op with kernels, got a composite .*"
                                            r"ask dispatch\(\.\.\.\) of each op it calls"):
        run.ops.per_cu.dispatch(torch.randn(64), target="gfx942")
    assert run.ops.add.dispatch(torch.randn(64), torch.randn(64), target="gfx942").spec  # an op's still answers


def test_a_composite_s_workspace_on_cpu_tensors_of_a_gpu_flavor_has_one_row(bundle_copy, ext):
    import flyship
    import uuid
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU calls run the references
        ops = flyship.load(with_composite(bundle_copy), namespace=f"flyship_cw{uuid.uuid4().hex[:8]}")
        y, parts = ops.per_cu(torch.arange(8.0))
    if ops.flavor in ("record", "emulate"):
        pytest.skip("the default flavor here is a host device; the GPU flavors' CPU rule is what this checks")
    assert parts.shape == (1, 8) and torch.equal(y, torch.arange(8.0) * 2)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["workspaces"][0].update(name="x"), "workspace name 'x' repeats an argument, output or workspace"),
    (lambda c: c["workspaces"][0].update(name="parts"), "workspace name 'parts' repeats"),
    (lambda c: c["workspaces"][0].update(shape=["z.shape[0]"]), "composites[0].workspaces[0].shape[0]"),
    (lambda c: c["workspaces"][0].update(dtype="float128"), "composites[0].workspaces[0].dtype"),
])
def test_a_composite_workspace_the_rules_refuse_names_its_json_path(bundle_copy, edit, message):
    c = json.loads(json.dumps(COMPOSITE))
    edit(c)
    with pytest.raises(BundleError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _m.read(with_composite(bundle_copy, c))


def test_a_composite_with_workspaces_written_as_4_x_is_refused_by_the_must_understand_rule(bundle_copy):
    with pytest.raises(BundleError, match="composite_workspaces"):
        _m.read(with_composite(bundle_copy, version="4.1"))
