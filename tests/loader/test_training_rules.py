"""The rule book on training bundles (schema 1.4 / 4.0 / 5.0): backward ops that consume buffers, composites, and the
version that makes an older loader refuse them instead of misreading them."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from flyship.bundle import manifest as _m
from flyship.bundle.errors import BundleError

pytestmark = pytest.mark.cpu


def _parse(training_bundle: Path, edit: Callable[[dict], None]) -> _m.Manifest:
    data = json.loads((training_bundle / "manifest.json").read_text())
    edit(data)
    return _m.parse(json.dumps(data).encode(), "edited manifest.json")


def _op(data: dict, name: str) -> dict:
    return next(o for o in data["ops"] if o["name"] == name)


def _set_backward(name: str, **changes: Any) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        _op(d, name)["backward"].update(changes)

    return edit


@pytest.mark.parametrize("edit, message", [
    (_set_backward("swiglu_fwd", inputs={"dc": "grad:c", "a": "a", "b": "a"}),
     r"input a = 'a' is written in place by swiglu_bwd, but 'a' also feeds b"),
    (_set_backward("swiglu_fwd", grads={"a": "a", "b": "a"}), r"both name buffer 'a'; one buffer holds one gradient"),
    (_set_backward("ce_fwd", grads={"target": "dlogits"}),
     r"'target' has rank 1 but the buffer 'dlogits' has rank 2; a gradient written in place has the shape"),
    (_set_backward("swiglu_fwd", grads={"a": "dc"}), r"expected a buffer swiglu_bwd gives: a \(written in "
                                                     r"place\), b \(written in place\)"),
])
def test_a_backward_that_consumes_buffers_wrongly_is_refused_when_read(training_bundle, edit, message):
    with pytest.raises(BundleError, match=message):
        _parse(training_bundle, edit)


def test_grad_of_an_input_is_refused_unless_the_forward_writes_that_input_in_place(training_bundle):
    # rope_inplace's backward reads grad:q (q is written in place); rope_fwd's q is not written, so grad:q is refused
    def edit(d: dict) -> None:
        _op(d, "rope_fwd")["backward"]["inputs"]["dq"] = "grad:q"

    with pytest.raises(BundleError, match=r"input dq = 'grad:q': expected 'grad:' of an output or of an input "
                                          r"rope_fwd writes in place \(out\)"):
        _parse(training_bundle, edit)
    assert _parse(training_bundle, lambda d: None).op("rope_inplace").backward.inputs["dq"] == "grad:q"


@pytest.mark.parametrize("version, late", [("3.1", "consumes, composites, dirty"), ("4.0", "dirty")])
def test_an_older_major_manifest_with_an_in_place_forward_pair_is_refused_naming_5_0(training_bundle, version, late):
    def edit(d: dict) -> None:
        d["schema_version"] = version

    major = version[0]
    with pytest.raises(BundleError, match=rf"expected 5\.0 for a bundle that uses {late}, got '{version}': a "
                                          rf"{major}\.x loader would ignore th.*rebuild the bundle"):
        _parse(training_bundle, edit)


def test_a_4_0_manifest_without_in_place_forward_pairs_still_reads(training_bundle):
    def edit(d: dict) -> None:  # the bundle as the last flyship wrote it: no pair's forward writes in place
        d["ops"] = [o for o in d["ops"] if o["name"] not in ("rope_inplace", "ce_fwd_inplace")]
        d["schema_version"] = "4.0"

    m = _parse(training_bundle, edit)
    assert m.schema_version == "4.0" and "dirty" not in _m.must_understand(m)
    assert _m.version_for(m) == "4.1"  # a 4.0 manifest reads; this flyship writes 4.1


def test_a_loader_that_reads_up_to_4_x_refuses_the_5_0_bundle_with_its_version_message(training_bundle, monkeypatch):
    from flyship.errors import ManifestVersionError

    monkeypatch.setattr(_m, "NEWEST_MINOR", {1: 4, 2: 2, 3: 1, 4: 0})
    with pytest.raises(ManifestVersionError, match=r"schema version 5\.0 is not readable .* rebuild the bundle"):
        _m.read(training_bundle)


@pytest.mark.parametrize("change, message", [
    ({"name": "swiglu_fwd"}, r"composites\[\d\]\.name: expected a name no op or composite of the bundle has"),
    ({"returns": ["a"]}, r"returned names must be unique and differ from the arguments'"),
    ({"returns": []}, r"expected at least one returned tensor"),
    ({"function": "not-a-name"}, r"composites\[\d\]\.function"),
])
def test_a_composite_that_breaks_a_rule_is_refused_when_read(training_bundle, change, message):
    def edit(d: dict) -> None:
        next(c for c in d["composites"] if c["name"] == "swiglu").update(change)

    with pytest.raises(BundleError, match=message):
        _parse(training_bundle, edit)


def test_a_composite_needs_the_references_module_it_runs_from(training_bundle):
    def edit(d: dict) -> None:
        d["references"] = d["references_sha256"] = None
        for op in d["ops"]:
            op["reference"] = None

    with pytest.raises(BundleError, match=r"runs 'scale_bwd' of the references module, but the manifest names no "
                                          r"references file"):
        _parse(training_bundle, edit)


def _copy(training_bundle: Path, tmp_path: Path, extra_source: str, edit: Callable[[dict], None]) -> Path:
    root = tmp_path / "b"
    shutil.copytree(training_bundle, root)
    refs = root / "references.py"
    refs.write_text(refs.read_text() + extra_source)
    data = json.loads((root / "manifest.json").read_text())
    data["references_sha256"] = hashlib.sha256(refs.read_bytes()).hexdigest()
    edit(data)
    (root / "manifest.json").write_text(json.dumps(data))
    return root


def test_a_composite_whose_function_returns_the_wrong_thing_names_itself(training_bundle, tmp_path, ext):
    import torch

    import flyship
    from flyship.errors import CallError

    def edit(d: dict) -> None:
        next(c for c in d["composites"] if c["name"] == "rope")["function"] = "bad_rope"

    root = _copy(training_bundle, tmp_path, "\n\ndef bad_rope(ops, q, k, cos, sin):\n    return q\n", edit)
    ops = flyship.load(root, namespace=f"flyship_tr{uuid.uuid4().hex[:8]}")
    q = torch.randn(2, 1, 4)
    with pytest.raises(CallError, match=r"::rope: expected its function to return a tuple of 2 Tensors \(q_out, "
                                        r"k_out\), got Tensor"):
        ops.rope(q, q, torch.randn(2, 2), torch.randn(2, 2))


def test_loading_refuses_a_composite_whose_function_the_references_module_lacks(training_bundle, tmp_path, ext):
    import flyship

    def edit(d: dict) -> None:
        next(c for c in d["composites"] if c["name"] == "rope")["function"] = "missing"

    root = _copy(training_bundle, tmp_path, "", edit)
    with pytest.raises(BundleError, match=r"composite rope runs 'missing', which references\.py does not define"):
        flyship.load(root, namespace=f"flyship_tr{uuid.uuid4().hex[:8]}")
