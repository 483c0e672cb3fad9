"""``flyship inspect``: per kernel, symbol, kernargs, registers, LDS, scratch, spills and occupancy; no DSL."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from flyship.bundle import manifest as M
from flyship.loader.tools.inspect import inspect_bundle

pytestmark = pytest.mark.cpu


def test_inspect_lists_every_kernel_with_its_resources_and_occupancy(tiny_bundle):
    data = inspect_bundle(tiny_bundle)
    rows = {(k["op"], k["spec"], k["target"]): k for k in data["kernels"]}
    amd = rows[("add", "f32", "gfx942")]
    assert amd["symbol"] == "add_kernel" and amd["kernargs"]["size"] == 48
    first = amd["kernargs"]["fields"][0]
    assert (first["offset"], first["kind"], first["type"], first["arg"]) == (0, "pointer", "ptr", "x")
    assert amd["spills"] == {"vgpr_spills": 0, "sgpr_spills": 0}
    assert amd["occupancy"]["unit"] == "waves/SIMD" and 1 <= amd["occupancy"]["value"] <= 8
    nv = rows[("add", "f32", "sm_90a")]
    assert nv["occupancy"]["unit"] == "blocks/SM" and "stack_frame_bytes" in nv["spills"]


def test_the_inspect_command_prints_text_and_json_without_a_dsl(tiny_bundle):
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "inspect", str(tiny_bundle)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "add / f32 / gfx942: add_kernel" in r.stdout and "waves/SIMD" in r.stdout and "blocks/SM" in r.stdout
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "inspect", "--json", str(tiny_bundle)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    code_objects = list(tiny_bundle.glob("*.hsaco")) + list(tiny_bundle.glob("*.cubin"))
    assert len(json.loads(r.stdout)["kernels"]) == len(code_objects)


def test_inspect_of_a_damaged_bundle_prints_one_line_not_a_traceback(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "inspect", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "not valid JSON" in r.stderr


def run_inspect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "inspect", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("damage", ["changed", "missing", "not an ELF"])
def test_inspect_checks_every_code_object_marks_the_bad_one_and_exits_1(bundle_copy, damage):
    root = bundle_copy()
    bad = root / "add.f32.gfx942.hsaco"
    if damage == "changed":  # one byte in the middle: the ELF still reads, the sha256 does not match
        data = bytearray(bad.read_bytes())
        data[len(data) // 2] ^= 0xFF
        bad.write_bytes(bytes(data))
        why = "sha256 mismatch"
    elif damage == "missing":
        bad.unlink()
        why = "found nothing"
    else:  # the manifest's sha256 made to match, so only the ELF check can catch it
        bad.write_bytes(b"not an ELF file")
        manifest = json.loads((root / "manifest.json").read_text())
        for op in manifest["ops"]:
            for spec in op["specializations"]:
                for v in spec["variants"]:
                    if v["code_object"]["file"] == bad.name:
                        v["code_object"]["sha256"] = hashlib.sha256(b"not an ELF file").hexdigest()
        (root / "manifest.json").write_text(json.dumps(manifest))
        why = "damaged"
    data = inspect_bundle(root)
    assert not data["ok"]
    problems = {(k["op"], k["spec"], k["target"]): k["problem"] for k in data["kernels"]}
    assert why in problems.pop(("add", "f32", "gfx942"))
    assert set(problems.values()) == {None}  # the other code objects are fine and still shown
    r = run_inspect(str(root))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "add / f32 / gfx942: add_kernel (add.f32.gfx942.hsaco)\n  BAD CODE OBJECT: " in r.stdout
    assert r.stdout.count("BAD CODE OBJECT") == 1 and why in r.stdout
    assert r.stderr.strip() == (f"Error: inspect: expected every code object to match the manifest, got 1 of "
                                f"{len(data['kernels'])} that do not (their BAD CODE OBJECT lines above say why); "
                                "rebuild or re-copy the bundle")
    r = run_inspect("--json", str(root))
    assert r.returncode == 1 and json.loads(r.stdout) == data


def test_inspect_of_a_good_bundle_says_ok_for_every_code_object(tiny_bundle):
    data = inspect_bundle(tiny_bundle)
    assert data["ok"] and all(k["problem"] is None for k in data["kernels"])


def test_inspect_shows_every_launch_of_a_multi_launch_variant_in_text_and_json(multilaunch_bundle):
    m = M.read(multilaunch_bundle)
    data = inspect_bundle(multilaunch_bundle)
    assert data["ok"]
    launches = [(o.name, s.name, v.target, k, len(v.launches), t.code_object.symbol, t.metadata.vgpr_count,
                 t.metadata.group_segment_fixed_size)
                for o in m.ops for s in o.specializations for v in s.variants for k, t in enumerate(v.launches, 1)]
    assert [(k["op"], k["spec"], k["target"], k["launch"], k["launches"], k["symbol"], k["vgprs"], k["lds_static"])
            for k in data["kernels"]] == launches
    assert {n for (_, _, _, _, n, _, _, _) in launches} == {2}  # every variant of these ops launches two kernels
    assert all(k["occupancy"] is not None for k in data["kernels"])
    r = run_inspect(str(multilaunch_bundle))
    assert r.returncode == 0, r.stderr
    assert ("rowsum_split / f32 / gfx942 launch 1 of 2: rowsum_partial_kernel" in r.stdout
            and "rowsum_split / f32 / gfx942 launch 2 of 2: rowsum_combine_kernel" in r.stdout)
    assert r.stdout.count("  occupancy: ") == len(launches)
    r = run_inspect("--json", str(multilaunch_bundle))
    assert r.returncode == 0 and json.loads(r.stdout) == data


@pytest.mark.parametrize("target, field", [("gfx942", "vgpr_count"), ("gfx942", "sgpr_count"),
                                           ("gfx942", "agpr_count"), ("sm_90a", "vgpr_count"),
                                           ("sm_90a", "private_segment_fixed_size")])
def test_inspect_refuses_register_counts_the_code_object_does_not_state(bundle_copy, target, field):
    def edit(manifest):
        for op in manifest["ops"]:
            for spec in op["specializations"]:
                for v in spec["variants"]:
                    if (op["name"], spec["name"], v["target"]) == ("add", "f32", target):
                        v["metadata"][field] += 8  # a hand-edited or mixed manifest: the file says otherwise

    root = bundle_copy(edit)
    data = inspect_bundle(root)
    assert not data["ok"]
    problems = {(k["op"], k["spec"], k["target"]): k["problem"] for k in data["kernels"]}
    problem = problems.pop(("add", "f32", target))
    assert f"{field} is " in problem and " in the code object, " in problem
    assert "the manifest was edited, or mixed with another build's code objects); rebuild the bundle" in problem
    assert set(problems.values()) == {None}
    r = run_inspect(str(root))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "BAD CODE OBJECT" in r.stdout


def test_a_load_refuses_a_variant_whose_register_counts_differ_from_its_code_object(bundle_copy):
    from flyship.bundle import rules as R
    from flyship.errors import CodeObjectError

    root = bundle_copy(lambda m: m["ops"][0]["specializations"][0]["variants"][0]["metadata"].update(vgpr_count=200))
    m = M.read(root)
    v = m.ops[0].specializations[0].variants[0]
    with pytest.raises(CodeObjectError, match=r"vgpr_count is \d+ in the code object, 200 in the manifest"):
        R.check_variant_file(root, v, "test")
