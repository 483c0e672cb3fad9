"""``flyship inspect``: per kernel, symbol, kernargs, registers, LDS, scratch, spills and occupancy; no DSL."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flyship.loader.inspect import inspect_bundle

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
    r = subprocess.run([sys.executable, "-m", "flyship.loader.cli", "inspect", str(tiny_bundle)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "add / f32 / gfx942: add_kernel" in r.stdout and "waves/SIMD" in r.stdout and "blocks/SM" in r.stdout
    r = subprocess.run([sys.executable, "-m", "flyship.loader.cli", "inspect", "--json", str(tiny_bundle)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    code_objects = list(tiny_bundle.glob("*.hsaco")) + list(tiny_bundle.glob("*.cubin"))
    assert len(json.loads(r.stdout)["kernels"]) == len(code_objects)


def test_inspect_of_a_damaged_bundle_prints_one_line_not_a_traceback(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    r = subprocess.run([sys.executable, "-m", "flyship.loader.cli", "inspect", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "not valid JSON" in r.stderr
