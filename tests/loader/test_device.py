"""Device-facing paths on a machine without a GPU: the runtime's own errors come through, as Python
exceptions, with no crash or hang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flyship.loader import VerificationError

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present; these tests prove the no-GPU errors")


@no_gpu
def test_loading_a_code_object_without_a_gpu_raises_the_runtime_error(tiny_bundle, ext):
    # In a child process with a time limit: a crash or a hang in the runtime would fail the test.
    code = f"""
import flyship
ops = flyship.load({str(tiny_bundle)!r})
target = "gfx942" if ops.flavor == "hip" else "sm_90a"
try:
    ops.add.load_kernel("f32", target=target, device=0)
except RuntimeError as e:
    print(e)
    print("modules cached:", ops._ext.loaded_modules())
else:
    print("loaded")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    msg, cached = r.stdout.strip().splitlines()
    assert msg.startswith("flyship: loading code object add.f32.")
    assert "onto device 0 failed: " in msg
    # The runtime's own words: the API that failed and its error name (hipError... / CUDA_ERROR_...).
    api = "hip" if ext.flavor() == "hip" else "cu"
    assert f" {api}" in msg and ("hipError" in msg or "CUDA_ERROR" in msg), msg
    assert cached == "modules cached: 0"  # a failed load leaves nothing cached (and nothing to unload)


@no_gpu
@pytest.mark.parametrize("call", ["preload", "device_target"])
def test_reading_the_device_without_a_gpu_gives_the_runtime_error_and_what_to_do(tiny, ext, call):
    from flyship.errors import CallError

    with pytest.raises(CallError, match=rf"ops.{call}: expected a GPU the runtime can read at index 0, got the "
                                        r"runtime's refusal \(flyship: reading the properties of device 0 failed: "
                                        r"(hip|cu)\w+: (hipError|CUDA_ERROR)\w+.*\) and torch sees no GPU; run on a "
                                        r"machine with a GPU, or check HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES"):
        getattr(tiny, call)(0)


@no_gpu
def test_verification_without_a_gpu_says_it_needs_one(tiny, tiny_bundle):
    import flyship

    with pytest.raises(VerificationError, match=r"verify: expected a GPU .* got none; verification runs each kernel"):
        tiny.verify()
    with pytest.raises(VerificationError, match="expected a GPU"):
        flyship.load(tiny_bundle, verify=True)


def test_a_report_fails_on_a_mismatch_and_when_nothing_could_run():
    from flyship.loader.tools.verify import Report, Row

    good = Row("add", "f32", "gfx942", 0.0, 0.0, True)
    skipped = Row("add", "f16", None, float("nan"), float("nan"), True, "no code object for gfx950", skipped=True)
    bad = Row("add", "bf16", "gfx942", 0.5, 0.1, False)
    assert Report((good, skipped), "cuda:0").ok
    Report((good, skipped), "cuda:0").raise_on_failure()
    with pytest.raises(VerificationError, match="1 failing"):
        Report((good, bad), "cuda:0").raise_on_failure()
    with pytest.raises(VerificationError, match="expected code for this GPU in at least one specialization"):
        Report((skipped,), "cuda:0").raise_on_failure()
    assert "skipped (no code object for gfx950)" in Report((skipped,), "cuda:0").table()


def test_preload_takes_a_device_as_torch_device_reads_it(recorded_tiny):
    ops = recorded_tiny(target="gfx942")
    n = ops.preload(0)
    assert n > 0
    assert ops.preload("cuda:0") == ops.preload(torch.device("cuda", 0)) == n
    assert ops.device_target("cuda:0") == ops.device_target(0)


@pytest.mark.parametrize("device, message", [
    (3.5, r"expected a GPU device, got 3.5 \(float\)"),
    (True, r"expected a GPU device, got True \(bool\)"),
    (None, r"expected a GPU device, got None \(NoneType\)"),
    (-1, r"expected a GPU index in 0..63, got -1"),
    ("cpu", r"expected a GPU device, got 'cpu' \(a cpu device\)"),
    ("gpu zero", r"expected a GPU device, got 'gpu zero', which torch.device refuses"),
])
def test_preload_refuses_what_is_not_a_gpu_device_with_a_config_error(tiny, device, message):
    from flyship.errors import ConfigError

    with pytest.raises(ConfigError, match=r"ops.preload: " + message + r".*; pass a GPU index \(0\), a string "
                                          r"\('cuda:0'\) or a torch.device"):
        tiny.preload(device)
