"""Hostile bundles: everything wrong with a bundle is a BundleError naming the file and the JSON path,
refused fast, before anything reaches torch or the C++ core. Bundle tier: stdlib, msgpack, pyelftools."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from flyship.bundle import limits as L
from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.bundle.errors import BundleError, CodeObjectError

pytestmark = pytest.mark.cpu

TINY = Path(__file__).resolve().parents[1] / "loader" / "data" / "tiny"


def base() -> dict:
    return json.loads((TINY / M.MANIFEST_NAME).read_text())


def parse(data: dict | bytes | str) -> M.Manifest:
    if isinstance(data, dict):
        data = json.dumps(data)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return M.parse(data, "bad/manifest.json")


def edited(edit: Callable[[dict], Any]) -> dict:
    d = base()
    edit(d)
    return d


def op(d: dict, name: str) -> dict:
    return next(o for o in d["ops"] if o["name"] == name)


def variant(d: dict, name: str = "add", target: str = "gfx942") -> dict:
    return next(v for v in op(d, name)["specializations"][0]["variants"] if v["target"] == target)


@pytest.fixture
def copy_bundle(tmp_path: Path) -> Callable[..., Path]:
    def make(edit: Callable[[dict], Any] | None = None) -> Path:
        root = tmp_path / "bundle"
        shutil.copytree(TINY, root)
        if edit is not None:
            (root / M.MANIFEST_NAME).write_text(json.dumps(edited(edit), sort_keys=True, indent=1))
        return root

    return make


# --- malformed JSON of any shape or encoding ---------------------------------------------------------------------


@pytest.mark.parametrize("raw, why", [
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b"[1, 2, 3]", "expected a JSON object"),
    (b'"flyship-bundle"', "expected a JSON object"),
    (b"{", "not valid JSON"),
    (b"", "not valid JSON"),
    (b'{"format": "flyship-bundle", "schema_version": NaN}', "not valid JSON"),
    (b'{"format": "flyship-bundle", "x": Infinity}', "not valid JSON"),
    (b'{"format": "flyship-bundle", "x": ' + b"9" * 5000 + b"}", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (b'{"format": "flyship-bundle", "schema_version": 1.0}', "expected schema_version 'MAJOR.MINOR'"),
    (b'{"format": "flyship-bundle", "schema_version": "\xd9\xa1.0"}', "expected schema_version 'MAJOR.MINOR'"),
])
def test_malformed_json_is_a_bundle_error_naming_the_file(raw, why):
    with pytest.raises(BundleError, match=f"bad/manifest.json.*{why}|{why}.*bad/manifest.json"):
        M.parse(raw, "bad/manifest.json")


@pytest.mark.parametrize("edit, path", [
    (lambda d: d.update(namespace=5), r"\.namespace: expected a string, got int"),
    (lambda d: op(d, "add").update(name=["add"]), r"\.ops\[0\]\.name: expected a string, got list"),
    (lambda d: variant(d)["launch"].update(block=[256.0, 1, 1]), r"launch\.block\[0\]: expected an integer, got float"),
    (lambda d: variant(d)["kernargs"]["fields"][0].update(offset=2**64), r"fields\[0\]\.offset: expected an integer "
                                                                         r"within int64"),
    (lambda d: variant(d)["kernargs"]["fields"][0].update(value=[1]), r"fields\[0\]\.value: expected a number or a "
                                                                      r"bool, got list"),
    (lambda d: op(d, "add").update(doc="x" * (L.MAX_STRING + 1)), r"\.doc: expected at most 4096 characters"),
    (lambda d: op(d, "add").update(doc="\ud800"), r"\.doc: the string holds an unpaired surrogate"),
    (lambda d: d["build"]["tools"].update({str(i): "" for i in range(L.MAX_ITEMS + 1)}),
     r"\.build\.tools: expected at most 4096 items"),
])
def test_a_value_of_the_wrong_type_or_size_is_refused_naming_its_json_path(edit, path):
    with pytest.raises(BundleError, match=r"bad/manifest\.json: (manifest )?.*" + path):  # (strings: the JSON reader)
        parse(edited(edit))


def test_a_number_too_large_for_a_double_is_refused_as_not_finite():
    d = edited(lambda d: variant(d)["kernargs"]["fields"][0].update(value=12345.5))
    raw = json.dumps(d).replace("12345.5", "1e999").encode()
    with pytest.raises(BundleError, match=r"bad/manifest\.json: manifest .*fields\[0\]\.value: expected a finite "
                                          r"number, got inf"):
        M.parse(raw, "bad/manifest.json")


def test_a_manifest_larger_than_the_limit_is_refused_without_parsing_it(tmp_path):
    p = tmp_path / M.MANIFEST_NAME
    with open(p, "wb") as f:
        f.write(b"{" + b" " * (L.MAX_MANIFEST_BYTES + 10) + b"}")
    with pytest.raises(BundleError, match=rf"at most {L.MAX_MANIFEST_BYTES} bytes"):
        M.read(tmp_path)


# --- values: scalars, alignments, blocks, grids, ranks, counts ----------------------------------------------------


def scale_rows_arg(d: dict, name: str) -> dict:
    return next(a for a in op(d, "scale_rows")["args"] if a["name"] == name)


@pytest.mark.parametrize("edit, message", [
    (lambda d: scale_rows_arg(d, "bias").update(default=1.5), r"args\[2\]\.default: expected a value of scalar "
                                                               r"type int, got 1\.5"),
    (lambda d: scale_rows_arg(d, "bias").update(default=True), r"args\[2\]\.default: expected a value of scalar type "
                                                                r"int, got True"),
    (lambda d: scale_rows_arg(d, "alpha").update(default="1"), r"alpha|default"),
    (lambda d: scale_rows_arg(d, "x").update(default=0), r"args\[0\]\.default: a tensor argument has no default"),
    (lambda d: op(d, "add")["specializations"][0]["guard"]["alignment"].update(x=24),
     r"guard\.alignment\.x: expected a power of two up to 4096, got 24"),
    (lambda d: op(d, "add")["specializations"][0]["guard"]["alignment"].update(x=0), r"power of two"),
    (lambda d: variant(d)["kernargs"].update(alignment=3), r"kernargs\.alignment: expected a power of two"),
    (lambda d: variant(d)["launch"].update(block=[0, 1, 1]), r"launch\.block: expected block dimensions in 1\.\.1024"),
    (lambda d: variant(d)["launch"].update(block=[-256, 1, 1]), r"launch\.block: expected block dimensions"),
    (lambda d: variant(d)["launch"].update(block=[2048, 1, 1]), r"launch\.block: expected block dimensions"),
    (lambda d: variant(d)["launch"].update(block=[32, 32, 2]), r"launch\.block: expected at most 1024 work-items"),
    (lambda d: variant(d)["launch"].update(grid=["99999999999999999999", "1", "1"]), r"launch\.grid\[0\]"),
    (lambda d: variant(d)["launch"].update(grid=["4294967296", "1", "1"]), r"launch\.grid\[0\]: expected a grid "
                                                                            r"dimension in 0\.\.2147483647"),
    (lambda d: variant(d)["launch"].update(grid=["-1", "1", "1"]), r"launch\.grid\[0\]: expected a grid dimension"),
    (lambda d: variant(d)["launch"].update(grid=["cdiv(x.shape[0], 99999999999999999999)", "1", "1"]),
     r"launch\.grid\[0\]: expression .*: literal 99999999999999999999 does not fit int64"),
    (lambda d: variant(d)["kernargs"]["fields"][3].update(expr="x.numel * 9223372036854775808"),
     r"fields\[3\]\.expr: expression .*does not fit int64"),
    (lambda d: op(d, "add")["specializations"][0]["example"].update(grid=[-1, 1, 1]), r"example\.grid: expected"),
    (lambda d: scale_rows_arg(d, "x").update(rank=L.MAX_RANK + 1), r"args\[0\]\.rank: expected a rank in 0\.\.16"),
    (lambda d: scale_rows_arg(d, "x").update(rank=-1), r"args\[0\]\.rank: expected a rank in 0\.\.16"),
    (lambda d: op(d, "add")["outputs"][0].update(shape=["1"] * (L.MAX_RANK + 1)), r"outputs\[0\]\.shape: expected a "
                                                                                  r"rank up to 16"),
    (lambda d: variant(d)["kernargs"]["fields"][3].update(kind="shape", arg="x", dim=5, expr=None),
     r"fields\[3\]\.dim: expected a dimension of 'x' \(rank 1\), got 5"),
    (lambda d: variant(d)["kernargs"]["fields"][0].update(kind="scalar"), r"fields\[0\]\.type: a scalar field has "
                                                                          r"type 'ptr'"),
    (lambda d: variant(d)["kernargs"]["fields"][3].update(kind="constant", value=2**40, expr=None),
     r"fields\[3\]\.value: expected an integer that fits i32"),
    (lambda d: variant(d)["kernargs"]["fields"][3].update(kind="constant", value=1.5, expr=None),
     r"fields\[3\]\.value: expected an integer that fits i32"),
    (lambda d: variant(d)["metadata"].update(max_flat_workgroup_size=0),
     r"max_flat_workgroup_size: expected 1\.\.1024"),
    (lambda d: op(d, "add")["specializations"].append(op(d, "add")["specializations"][0]), r"specialization name 'f32' "
                                                                                            r"is duplicated"),
    (lambda d: variant(d)["code_object"].update(sha256="XYZ"), r"code_object\.sha256: expected 64 lowercase hex"),
    (lambda d: variant(d)["code_object"].update(format="cubin"), r"a amd target takes hsaco code objects"),
])
def test_a_value_out_of_its_range_is_refused_naming_its_json_path(edit, message):
    with pytest.raises(BundleError, match=r"bad/manifest\.json: .*" + message):
        parse(edited(edit))


def test_a_rank_in_the_millions_is_refused_fast():
    for edit in (lambda d: scale_rows_arg(d, "x").update(rank=10**7),
                 lambda d: op(d, "add")["outputs"][0].update(shape=["1"] * 10**6),
                 lambda d: op(d, "add")["specializations"][0]["example"]["shapes"].update(x=[1] * 10**6)):
        raw = json.dumps(edited(edit)).encode()
        t0 = time.monotonic()
        with pytest.raises(BundleError, match="expected a rank in 0..16|expected at most 4096 items"):
            M.parse(raw, "bad/manifest.json")
        assert time.monotonic() - t0 < 5.0


def test_every_count_has_a_limit():
    d = base()
    d["ops"] = [dict(op(d, "add"), name=f"op{i}") for i in range(L.MAX_OPS + 1)]
    with pytest.raises(BundleError, match=r"manifest ops: expected at most 1024 ops, got 1025"):
        parse(d)


# --- names and dtype rules --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ns", ["aten", "prim", "prims", "_refs", "quantized", "torch"])
def test_a_bundle_cannot_register_ops_in_torchs_own_namespaces(ns):
    with pytest.raises(BundleError, match=rf"got {ns!r}, which is one of torch's own operator namespaces"):
        parse(edited(lambda d: d.update(namespace=ns)))
    with pytest.raises(BundleError, match="one of torch's own"):
        rules.check_namespace(ns, "load(namespace=...)")


@pytest.mark.parametrize("ns, why", [
    ("_", "is torch's wildcard namespace"),
    ("load_library", "names an attribute of torch.ops itself (torch.ops.load_library)"),
    ("loaded_libraries", "names an attribute of torch.ops itself"),
    ("import_module", "names an attribute of torch.ops itself"),
    ("__init__", "names an attribute of torch.ops itself (torch.ops.__init__)"),
    ("__class__", "names an attribute of torch.ops itself"),
])
def test_a_namespace_torch_ops_cannot_reach_is_refused_saying_why(ns, why):
    with pytest.raises(BundleError, match=re.escape(f"expected a namespace of your own, got {ns!r}, which {why}")):
        parse(edited(lambda d: d.update(namespace=ns)))
    with pytest.raises(BundleError, match=re.escape(f"got {ns!r}, which {why}")):
        rules.check_namespace(ns, "load(namespace=...)")


def test_a_non_ascii_or_overlong_name_is_refused():
    with pytest.raises(BundleError, match=r"ops\[0\]\.name: expected an ASCII identifier"):
        parse(edited(lambda d: op(d, "add").update(name="ädd")))
    with pytest.raises(BundleError, match=r"expected an ASCII identifier of at most 128"):
        parse(edited(lambda d: op(d, "add").update(name="a" * 200)))


def test_a_scalar_named_like_a_dtype_that_an_output_dtype_rule_names_is_refused():
    def edit(d):
        o = op(d, "scale_rows")
        scale_rows_arg(d, "alpha")["name"] = "float32"
        o["outputs"][0]["dtype"] = "float32"
        for v in o["specializations"][0]["variants"]:
            for f in v["kernargs"]["fields"]:
                if f.get("arg") == "alpha":
                    f["arg"] = "float32"

    with pytest.raises(BundleError, match=r"outputs\[0\]\.dtype: output out takes its dtype from 'float32', which is "
                                          r"a scalar or an output"):
        parse(edited(edit))


def test_an_input_tensor_named_like_a_dtype_makes_a_dtype_rule_ambiguous():
    def edit(d):
        o = op(d, "add")
        text = json.dumps(o).replace('"x"', '"float16"').replace("x.", "float16.")
        o.clear()
        o.update(json.loads(text))

    with pytest.raises(BundleError, match=r"dtype rule 'float16' is ambiguous"):
        parse(edited(edit))


def test_a_kernarg_field_of_the_wrong_kind_for_its_argument_is_refused():
    with pytest.raises(BundleError, match=r"fields\[0\]\.arg: a pointer field needs a tensor argument, 'bias' is a "
                                          r"scalar"):
        parse(edited(lambda d: variant(d, "scale_rows")["kernargs"]["fields"][0].update(arg="bias")))


# --- files: containment, size, integrity -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../outside.hsaco", "/etc/passwd", "a/../../b", "", "x\\..\\y"])
def test_a_code_object_path_outside_the_bundle_is_refused(path):
    with pytest.raises(BundleError, match=r"code_object\.file: expected a path inside the bundle"):
        parse(edited(lambda d: variant(d)["code_object"].update(file=path)))


def test_a_code_object_link_that_leads_out_of_the_bundle_is_refused(copy_bundle, tmp_path):
    root = copy_bundle()
    outside = tmp_path / "elsewhere.hsaco"
    shutil.move(root / "add.f32.gfx942.hsaco", outside)
    os.symlink(outside, root / "add.f32.gfx942.hsaco")
    with pytest.raises(BundleError, match=r"add\.f32\.gfx942\.hsaco' resolves to .*elsewhere\.hsaco \(a link leads "
                                          r"out\)"):
        rules.check_bundle_files(root, M.read(root))


def test_a_code_object_that_is_a_symlink_loop_is_refused_saying_so(copy_bundle):
    root = copy_bundle()
    (root / "add.f32.gfx942.hsaco").unlink()
    os.symlink("loop.b", root / "add.f32.gfx942.hsaco")
    os.symlink("add.f32.gfx942.hsaco", root / "loop.b")
    with pytest.raises(BundleError, match=r"add\.f32\.gfx942\.hsaco, found a symlink loop; re-copy the bundle"):
        rules.check_bundle_files(root, M.read(root))


def test_a_references_link_that_leads_out_of_the_bundle_is_refused(copy_bundle, tmp_path):
    root = copy_bundle()
    outside = tmp_path / "refs.py"
    shutil.move(root / "references.py", outside)
    os.symlink(outside, root / "references.py")
    with pytest.raises(BundleError, match=r"resolves to .*refs\.py \(a link leads out\)"):
        rules.references_source(root, M.read(root))


def test_a_changed_references_module_is_refused_by_its_sha256(copy_bundle):
    root = copy_bundle()
    with open(root / "references.py", "a") as f:
        f.write("\nimport os  # tampered\n")
    with pytest.raises(BundleError, match=r"references module.*sha256 mismatch|sha256 mismatch"):
        rules.references_source(root, M.read(root))


def test_a_1_0_bundle_without_a_references_sha256_loads_with_a_warning_to_rebuild(copy_bundle):
    root = copy_bundle(lambda d: (d.update(schema_version="1.0"), d.pop("references_sha256"),
                                  d.pop("offload_bundles_sha256")))
    m = M.read(root)
    with pytest.warns(UserWarning, match=r"records no sha256 for references\.py.*rebuild the bundle with flyc-build"):
        source = rules.references_source(root, m)
    assert source == (root / "references.py").read_bytes()


def test_a_code_object_over_the_size_limit_is_refused_before_it_is_read(copy_bundle, monkeypatch):
    root = copy_bundle()
    monkeypatch.setattr(L, "MAX_CODE_OBJECT_BYTES", 1000)
    opened = []
    real_read = rules.read_bundle_file

    def spy(*a, **k):
        opened.append(a[1])
        return real_read(*a, **k)

    monkeypatch.setattr(rules.files, "read_bundle_file", spy)  # the module that reads (flyship.bundle.rules.files)
    with pytest.raises(BundleError, match=r"expected at most 1000 bytes in .*, the file has \d+"):
        rules.check_bundle_files(root, M.read(root))
    assert len(opened) == 1


# --- code objects damaged behind a valid sha256 ------------------------------------------------------------------


def rehash(root: Path, file: str, data: bytes) -> None:
    (root / file).write_bytes(data)
    m = json.loads((root / M.MANIFEST_NAME).read_text())
    for o in m["ops"]:
        for s in o["specializations"]:
            for v in s["variants"]:
                if v["code_object"]["file"] == file:
                    v["code_object"]["sha256"] = hashlib.sha256(data).hexdigest()
    (root / M.MANIFEST_NAME).write_text(json.dumps(m, sort_keys=True, indent=1))


@pytest.mark.parametrize("file", ["add.f32.gfx942.hsaco", "add.f32.sm_90a.cubin"])
@pytest.mark.parametrize("cut", [0, 16, 64, 0.5, 0.9])
def test_a_truncated_code_object_with_a_valid_sha256_is_a_code_object_error(copy_bundle, file, cut):
    root = copy_bundle()
    data = (root / file).read_bytes()
    n = int(len(data) * cut) if isinstance(cut, float) else (len(data) + cut if cut < 0 else cut)
    rehash(root, file, data[:n])
    with pytest.raises(CodeObjectError, match=rf"\({file}\)"):
        rules.check_bundle_files(root, M.read(root))


# Regression cases the fuzzer found: single bit flips that made the raw readers (pyelftools, msgpack, our
# note and .nv.info parsers) raise something other than a flyship error; (file, byte offset, xor, what escaped).
FUZZ_REGRESSIONS: list[tuple[str, int, int, str]] = [
    ("scale_rows.f32.gfx942.hsaco", 9501, 128, "ELFError"),
    ("scale_rows.f32.gfx942.hsaco", 1064, 1, "KeyError"),
    ("add.f32.gfx942.hsaco", 837, 32, "TypeError"),
    ("add.f32.gfx942.hsaco", 1411, 4, "ELFParseError"),
    ("scale_rows.f32.sm_90a.cubin", 8695, 128, "OverflowError"),
    ("add.f16.gfx942.hsaco", 800, 128, "UnicodeDecodeError"),
    ("addsub.f32.sm_90a.cubin", 9614, 1, "AttributeError"),
    ("add.f32.sm_90a.cubin", 61, 2, "ELFError"),
    ("addsub.f32.gfx942.hsaco", 893, 4, "msgpack ExtraData"),
    ("addsub.f32.gfx942.hsaco", 516, 16, "msgpack ValueError"),
    ("add.f32.sm_90a.cubin", 45, 128, "ELFParseError"),
]


@pytest.mark.parametrize("file, offset, xor, escaped", FUZZ_REGRESSIONS)
def test_a_bit_flipped_code_object_with_a_valid_sha256_is_a_code_object_error(copy_bundle, file, offset, xor,
                                                                              escaped):
    root = copy_bundle()
    data = bytearray((root / file).read_bytes())
    data[offset] ^= xor
    rehash(root, file, bytes(data))
    with pytest.raises(CodeObjectError, match=rf"\({file}\).*damaged"):
        rules.check_bundle_files(root, M.read(root))


# --- failed kernels of a --keep-going build (schema 1.2) ------------------------------------------------------


def _failed(**kw) -> dict:
    entry = {"op": "add", "spec": "f32", "target": "gfx942", "reason": "ResourceError: over the LDS limit"}
    return edited(lambda d: d.update(schema_version="1.2", failed=[{**entry, **kw}]))


def test_a_failed_kernel_is_read_back_and_a_manifest_without_the_key_has_none():
    (f,) = parse(_failed()).failed
    assert (f.op, f.spec, f.target, f.reason) == ("add", "f32", "gfx942", "ResourceError: over the LDS limit")
    assert parse(base()).failed == ()


@pytest.mark.parametrize("kw, message", [
    ({"op": "nope"}, r"failed\[0\]\.op: expected an op of this bundle, got 'nope'"),
    ({"spec": "f 32"}, r"failed\[0\]\.spec: expected an ASCII identifier"),
    ({"target": "gfx942:xnack"}, r"failed\[0\]\.target: target ID 'gfx942:xnack'"),
    ({"reason": ""}, r"failed\[0\]\.reason: expected the build's message"),
])
def test_a_bad_failed_entry_is_refused_naming_it(kw, message):
    with pytest.raises(BundleError, match=message):
        parse(_failed(**kw))


def test_a_failed_kernel_listed_twice_is_refused():
    d = _failed()
    d["failed"] = d["failed"] * 2
    with pytest.raises(BundleError, match=r"\(add, f32, gfx942\) is listed twice"):
        parse(d)
