"""Bad bundles are refused with clear messages before anything is launched: the manifest at load, a code object
when its variant is first loaded (``Ops.check`` checks them all now)."""

from __future__ import annotations

import json
import uuid

import pytest

import flyship
from flyship.bundle.errors import BundleError, CodeObjectError, ManifestVersionError

pytestmark = pytest.mark.cpu


def op_json(data: dict, name: str) -> dict:
    return next(o for o in data["ops"] if o["name"] == name)


def variant_json(data: dict, op: str, spec: str, target: str) -> dict:
    s = next(s for s in op_json(data, op)["specializations"] if s["name"] == spec)
    return next(v for v in s["variants"] if v["target"] == target)


def load(path):
    """Load and check every code object (load alone checks the manifest; a code object is checked when its
    variant is first loaded onto a device, test_load_time.py shows that path)."""
    ops = flyship.load(path, namespace=f"flyship_t{uuid.uuid4().hex[:8]}")
    ops.check()
    return ops


def test_an_unknown_major_version_is_refused_naming_both_versions(bundle_copy):
    root = bundle_copy(lambda d: d.update(schema_version="7.0"))
    with pytest.raises(ManifestVersionError,
                       match=r"schema version 7\.0 .* reads 1\.x \(up to 1\.5\) and 2\.x \(up to 2\.3\) and 3\.x "
                             r"\(up to 3\.2\) and 4\.x \(up to 4\.1\) and 5\.x \(up to 5\.0\) and 6\.x "
                             r"\(up to 6\.0\)"):
        load(root)


def test_a_changed_code_object_is_refused_by_its_sha256(bundle_copy):
    root = bundle_copy()
    path = root / "add.f32.gfx942.hsaco"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"add\.f32\.gfx942\.hsaco\): sha256 mismatch: the manifest says "
                                          r"[0-9a-f]{64}, the file has [0-9a-f]{64}"):
        load(root)


def test_a_missing_code_object_is_refused(bundle_copy):
    root = bundle_copy()
    (root / "addsub.f32.sm_90a.cubin").unlink()
    with pytest.raises(BundleError, match=r"expected the code object at .*addsub\.f32\.sm_90a\.cubin, found nothing"):
        load(root)


def test_a_block_that_differs_from_the_required_workgroup_size_is_refused(bundle_copy):
    def edit(d):
        v = variant_json(d, "add", "f32", "gfx942")
        v["metadata"]["reqd_workgroup_size"] = [128, 1, 1]  # launch.block stays 256

    with pytest.raises(BundleError, match=r"launch block \[256, 1, 1\] differs from the code object's required "
                                          r"workgroup size \[128, 1, 1\]"):
        load(bundle_copy(edit))


def test_a_manifest_that_agrees_with_itself_but_not_with_the_code_object_is_refused(bundle_copy):
    def edit(d):  # a plausible manifest (check() passes) whose metadata is not the file's
        variant_json(d, "add", "f32", "gfx942")["metadata"]["kernarg_segment_size"] = 56

    with pytest.raises(BundleError, match="kernarg_segment_size is 48 in the code object, 56 in the manifest"):
        load(bundle_copy(edit))


def test_a_required_workgroup_size_from_the_code_object_is_enforced(example_bundle, bundle_copy, tmp_path):
    # Needs a code object that carries .reqd_workgroup_size (FlyDSL kernels do; Triton's do not).
    from flyship.bundle import manifest as m
    from flyship.bundle.codeobject import CodeObjectFile

    man = m.read(example_bundle)
    found = None
    for op in man.ops:
        for s in op.specializations:
            for v in s.variants:
                if v.code_object.format == "hsaco":
                    data = (example_bundle / v.code_object.file).read_bytes()
                    meta = CodeObjectFile(data).kernel_metadata(v.code_object.symbol)
                    if meta.reqd_workgroup_size:
                        found = (op.name, s.name, v.target, meta.reqd_workgroup_size)
    if found is None:
        pytest.skip("the example bundle has no code object with .reqd_workgroup_size (the Triton stub has none); "
                    "with FlyDSL's this proves a manifest that lies about it is refused")
    import shutil

    root = tmp_path / "lying"
    shutil.copytree(example_bundle, root)
    data = json.loads((root / "manifest.json").read_text())
    op, spec, target, req = found
    v = variant_json(data, op, spec, target)
    other = [req[0] * 2, 1, 1]
    v["metadata"]["reqd_workgroup_size"] = other
    v["launch"]["block"] = other
    v["metadata"]["max_flat_workgroup_size"] = max(v["metadata"]["max_flat_workgroup_size"], other[0])
    (root / "manifest.json").write_text(json.dumps(data, sort_keys=True, indent=1) + "\n")
    with pytest.raises(BundleError, match="required workgroup size|reqd_workgroup_size|differs"):
        load(root)


def test_a_kernarg_field_outside_the_metadata_arguments_is_refused(bundle_copy):
    def edit(d):
        v = variant_json(d, "add", "f32", "gfx942")
        v["kernargs"]["fields"] = [f for f in v["kernargs"]["fields"] if f["offset"] != 24]

    with pytest.raises(BundleError, match=r"kernel argument .* at offset 24 \(size 4, by_value\) has no kernarg field"):
        load(bundle_copy(edit))


def test_a_symbol_the_code_object_lacks_is_refused(bundle_copy):
    def edit(d):
        variant_json(d, "add", "f32", "gfx942")["code_object"]["symbol"] = "no_such_kernel"
        variant_json(d, "add", "f32", "sm_90a")["code_object"]["symbol"] = "no_such_kernel"

    with pytest.raises(BundleError, match=r"no kernel 'no_such_kernel'; it has \['add_kernel'\]"):
        load(bundle_copy(edit))


def test_a_cubin_whose_parameters_differ_from_the_manifest_is_refused(bundle_copy):
    def edit(d):  # move the last two (null) parameters by 8 bytes in the manifest only
        v = variant_json(d, "add", "f32", "sm_90a")
        for a in v["metadata"]["args"][-2:]:
            a["offset"] += 8
        for f in v["kernargs"]["fields"][-2:]:
            f["offset"] += 8
        v["metadata"]["kernarg_segment_size"] += 8
        v["kernargs"]["size"] += 8

    with pytest.raises(BundleError, match=r"kernel parameters \(offset, size\) differ: cubin \[\(0, 8\), "
                                          r".*\(40, 8\)\], manifest \[\(0, 8\), .*\(48, 8\)\]"):
        load(bundle_copy(edit))


def test_a_cubin_without_the_symbol_is_refused(bundle_copy):
    def edit(d):
        variant_json(d, "addsub", "f32", "sm_90a")["code_object"]["symbol"] = "other_kernel"

    with pytest.raises(BundleError, match=r"the cubin defines no kernel 'other_kernel'; it has \['addsub_kernel'\]"):
        load(bundle_copy(edit))


def test_a_code_object_built_for_another_target_is_refused(bundle_copy):
    def edit(d):
        v = variant_json(d, "add", "f16", "gfx942")
        v["target"] = v["code_object"]["target"] = "gfx950"

    with pytest.raises(BundleError, match="the code object is built for gfx942, the manifest says gfx950"):
        load(bundle_copy(edit))


def test_a_missing_reference_function_is_refused_listing_the_defined_ones(bundle_copy):
    root = bundle_copy(lambda d: op_json(d, "addsub").update(reference="add_and_sub"))
    with pytest.raises(BundleError, match=r"has no function 'add_and_sub' for op addsub; it defines add, addsub, "
                                          r"scale_rows"):
        load(root)


def test_references_for_unknown_ops_are_refused(tiny_bundle, ext):
    with pytest.raises(BundleError, match=r"names ops \['mul'\] the bundle does not have"):
        flyship.load(tiny_bundle, namespace=f"flyship_t{uuid.uuid4().hex[:8]}", references={"mul": lambda x: x})


def test_a_second_bundle_cannot_take_a_loaded_namespace(tiny, bundle_copy):
    root = bundle_copy(lambda d: op_json(d, "add").update(doc="changed"))
    with pytest.raises(BundleError, match="namespace 'flyship_tiny' is already registered in this process by the bundle at"):
        flyship.load(root)


def test_load_refuses_torchs_own_namespaces(tiny_bundle, ext):
    with pytest.raises(BundleError, match=r"got 'aten', which is one of torch's own operator namespaces"):
        flyship.load(tiny_bundle, namespace="aten")


def test_a_changed_references_module_is_refused_at_load(bundle_copy):
    root = bundle_copy()
    with open(root / "references.py", "a") as f:
        f.write("\nprint('tampered')\n")
    with pytest.raises(BundleError, match=r"references\.py'.*sha256 mismatch: the manifest says [0-9a-f]{64}"):
        load(root)


def test_a_changed_references_module_is_refused_even_when_every_reference_is_overridden(bundle_copy, ext):
    """What ``flyship list``, pack and flyc-build refuse, load refuses too, whatever ``references=`` replaces."""
    root = bundle_copy()
    with open(root / "references.py", "a") as f:
        f.write("\nprint('tampered')\n")
    names = [o["name"] for o in json.loads((root / "manifest.json").read_text())["ops"]]
    overrides = {name: (lambda *a, **k: None) for name in names}
    with pytest.raises(BundleError, match=r"references\.py'.*sha256 mismatch"):
        flyship.load(root, namespace=f"flyship_t{uuid.uuid4().hex[:8]}", references=overrides)


def test_a_truncated_code_object_with_a_matching_sha256_is_refused_at_load(bundle_copy):
    import hashlib

    def edit(d):
        v = variant_json(d, "add", "f32", "gfx942")
        v["code_object"]["sha256"] = hashlib.sha256(cut).hexdigest()

    cut = (bundle_copy() / "add.f32.gfx942.hsaco").read_bytes()[:300]
    root = bundle_copy(edit)
    (root / "add.f32.gfx942.hsaco").write_bytes(cut)
    with pytest.raises(CodeObjectError, match=r"add\.f32\.gfx942\.hsaco\).*damaged"):
        load(root)
