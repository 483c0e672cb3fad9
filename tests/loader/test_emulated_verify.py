"""The emulated device runs the examples and refuses the silent cases (issue 33): FLYSHIP_FLAVOR=emulate op calls on
CPU tensors match the references on gfx942 and gfx950; `flyship verify --emulate` runs the examples' 9
specializations on both targets in both wave schedules; tests/loader/data/silent's kernels, each right on its
example, are refused naming op, specialization, target, case and the first wrong elements. Every result here is
emulated (flyship.loader.emulate), never a GPU's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_build

pytestmark = pytest.mark.cpu

TARGETS = ("gfx942", "gfx950")
SILENT = ROOT / "tests" / "loader" / "data" / "silent" / "silent.py"


@pytest.fixture(scope="module")
def emulate_ready() -> None:
    from flyship.loader import extension

    try:
        extension.extension("emulate")
    except extension.ExtensionBuildError as e:
        pytest.skip(f"the emulate extension cannot be built here, so nothing runs on the emulated device: {e}")


@pytest.fixture(scope="module")
def silent_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "silent"
    run_build(SILENT, out, ["gfx942"])
    return out


# Small calls of every example op (the emulator's cost grows with the elements): name -> argument factory.
def _calls(torch: Any) -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)

    def r(*shape: int, dtype: Any = torch.float32) -> Any:
        return torch.randn(shape, generator=g).to(dtype)

    return {
        "add": lambda dt: (r(9, 70, dtype=dt), r(9, 70, dtype=dt)),
        "softmax": lambda dt: (r(5, 200, dtype=dt),),
        "softmax_bwd": lambda dt: (r(5, 200, dtype=dt), torch.softmax(r(5, 200), -1).to(dt)),
        "rmsnorm": lambda dt: (r(3, 512, dtype=dt), r(512, dtype=dt), 1e-6),
        "gemm": lambda dt: (r(128, 64, dtype=torch.bfloat16), r(128, 64, dtype=torch.bfloat16)),
    }


@pytest.mark.parametrize("target", TARGETS)
def test_example_ops_run_on_the_emulated_device(example_bundle: Path, emulate_ready: None, target: str) -> None:
    import torch

    from flyship.loader import emulated_device
    from flyship.loader.tools import verify as _verify
    from flyship.loader.tools.verify_emulated import load_emulated

    ops = load_emulated(example_bundle, target)
    ran = set()
    for name, make in _calls(torch).items():
        for dt in ((torch.float32, torch.bfloat16) if name != "gemm" else (torch.bfloat16,)):
            args = make(dt)
            with emulated_device.stats() as log:
                got = getattr(ops, name)(*args)  # the user's call: flyship.load + op call on CPU tensors
            assert log and all(s.target == target and s.instructions > 0 for s in log), (name, dt, log)
            want = ops.reference(name)(*args)
            rtol, atol = _verify.TOLERANCES[str(dt).removeprefix("torch.")]
            torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, msg=f"{name} {dt} {target}")
            ran.add((name, str(dt)))
    assert len(ran) == 9  # every specialization of the examples


def test_verify_emulate_runs_every_example_specialization(example_bundle: Path, emulate_ready: None) -> None:
    from flyship.loader.tools.verify_emulated import verify_emulated

    report = verify_emulated(example_bundle, TARGETS, shapes=False, budget_s=600)
    assert report.ok, report.table()
    base = {(r.op, r.spec, r.target) for r in report.runs if r.result == "ok" and r.case.endswith("rows")}
    assert len(base) == 9 * len(TARGETS), report.table()  # each one's sentinel-output run matched, both schedules
    padded = [r for r in report.runs if "padded rows" in r.case]
    assert padded and all(r.result == "ok" for r in padded), report.table()
    assert all(r.instructions > 0 for r in report.runs if r.result == "ok")


def test_silent_cases_are_refused(silent_bundle: Path, emulate_ready: None) -> None:
    from flyship.loader.tools.verify_emulated import verify_emulated

    report = verify_emulated(silent_bundle, ("gfx942",))
    rows = {(r.op, r.case): r for r in report.runs}
    # each is right on its example: the example-only check would pass
    for op in ("wrap_rows", "capped_rows", "shared_stride"):
        assert rows[(op, "8 rows")].result == "ok", report.table()
        assert rows[(op, "the example: the example's shape")].result == "ok", report.table()
    wrap = rows[("wrap_rows", "past the base's grid: 259 rows")]
    assert wrap.result == "FAIL" and "output 'out': 192 of 16576 elements wrong, first [256, 0]" in wrap.note
    capped = rows[("capped_rows", "past the base's grid: 259 rows")]
    assert capped.result == "FAIL" and "192 of 16576 elements never written (first at [256, 0])" in capped.note
    padded_y = next(r for (op, case), r in rows.items() if op == "shared_stride" and "y with padded rows" in case)
    assert padded_y.result == "FAIL" and "elements wrong, first [1, 0]" in padded_y.note
    padded_x = next(r for (op, case), r in rows.items() if op == "shared_stride" and "x with padded rows" in case)
    assert padded_x.result == "FAIL" and "outside every region" in padded_x.note, padded_x.note
    assert "past the end of y [" in padded_x.note, padded_x.note  # the region it strayed from, by argument


def test_cli_exits_1_naming_the_case(silent_bundle: Path, emulate_ready: None) -> None:
    r = subprocess.run([sys.executable, "-m", "flyship.loader.tools.cli", "verify", "--emulate", str(silent_bundle),
                        "--op", "wrap_rows", "--target", "gfx942"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "FLYSHIP_FLAVOR": ""})
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("op 'wrap_rows', specialization 'f32', gfx942, past the base's grid: 259 rows: forward: output 'out': "
            "192 of 16576 elements wrong, first [256, 0]") in r.stderr, r.stderr
    assert "emulated device:" in r.stdout and "3 failed" in r.stdout  # 259, 513 and 1025 rows
    assert "wrap_rows        f32        gfx942   past 1024 rows: 1025 rows" in r.stdout, r.stdout


def test_triton_gfx942_code_runs_and_sm_cubins_are_said_not_executed(triton_examples_bundle: Path,
                                                                       emulate_ready: None) -> None:
    from flyship.loader.tools.verify_emulated import verify_emulated

    report = verify_emulated(triton_examples_bundle, ("gfx942",), shapes=False, ops=["accumulate"])
    ran = [r for r in report.runs if r.target == "gfx942" and r.result == "ok"]
    assert ran and all(r.instructions > 0 for r in ran), report.table()  # Triton's AMD code objects, emulated
    # only the asked target's lines; the sm_* code objects are said once, in the summary
    assert {r.target for r in report.runs} == {"gfx942"}, report.table()
    manifest = json.loads((triton_examples_bundle / "manifest.json").read_text())
    cubins = {(s["name"], v["target"]) for o in manifest["ops"] if o["name"] == "accumulate"
              for s in o["specializations"] for v in s["variants"] if v["target"].startswith("sm_")}
    assert cubins and f"{len(cubins)} sm_* code objects NOT executed" in report.summary(), report.summary()
    everything = verify_emulated(triton_examples_bundle, shapes=False, ops=["accumulate"], budget_s=0)
    listed = [r for r in everything.runs if r.target.startswith("sm_")]  # no target asked: each listed
    assert len(listed) == len(cubins) and all(r.result == "not executed" for r in listed), everything.table()


def test_a_float32_input_read_as_bfloat16_is_refused(tmp_path: Path, emulate_ready: None) -> None:
    from flyship.loader.tools.verify_emulated import verify_emulated

    out = tmp_path / "mixed"
    run_build(SILENT.parent / "mixed.py", out, ["gfx942"])  # it builds: nothing before the emulator sees the bug
    report = verify_emulated(out, ("gfx942",), shapes=False)
    first = report.runs[0]
    assert (first.op, first.spec, first.case, first.result) == ("bias_add", "mixed", "8 rows, fresh outputs", "FAIL")
    assert "output 'out':" in first.note and "elements wrong, first [0, 0]" in first.note, first.note
