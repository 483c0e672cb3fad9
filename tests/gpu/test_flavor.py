"""Which driver shim ran, and the runtime's refusals as Python exceptions, on a real GPU.

``scripts/gpu_check_hip_nvidia.sh`` runs the GPU tests twice on one NVIDIA GPU: through the CUDA shim and
through the HIP shim built for HIP's NVIDIA platform (the test-only ``hip-nvidia`` flavor). These tests pin
down that each run went through the shim it claims (``FLYSHIP_GPU_EXPECT_FLAVOR``, set by that script), and
that a code object the driver refuses comes back as a Python exception carrying the runtime's own words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flyship.bundle import targets

from ..conftest import ROOT

pytestmark = pytest.mark.gpu

RUNTIME_PREFIX = {"cuda": "CUDA driver", "hip": "HIP runtime", "hip-nvidia": "HIP runtime"}


def expected_flavor(torch) -> str:
    """The flavor this run asked for: the script's expectation, else FLYSHIP_FLAVOR, else from the torch build."""
    return (os.environ.get("FLYSHIP_GPU_EXPECT_FLAVOR") or os.environ.get("FLYSHIP_FLAVOR")
            or ("hip" if torch.version.hip else "cuda"))


def test_the_shim_that_ran_is_the_flavor_this_run_asked_for(gpu, ops):
    want = expected_flavor(gpu)
    assert ops.flavor == ops._ext.flavor() == want
    assert ops._ext.runtime_version().startswith(RUNTIME_PREFIX[want]), ops._ext.runtime_version()
    # The kernels the other GPU tests launch are this bundle's: on NVIDIA, cubins, whichever shim loads them.
    device = ops.device_target(gpu.cuda.current_device())
    assert targets.select(list(ops.targets), device) is not None


# In a child process with a time limit: a crash or a hang in the runtime fails the test instead of the run.
FOREIGN_LOAD = """
import json, sys, torch
import flyship
from flyship.bundle import targets
ops = flyship.load(sys.argv[1])
device = ops.device_target(0)
vendor = targets.parse_target(device).vendor
out = {"device": device}
for op in ops:
    for si, spec in enumerate(op.manifest.specializations):
        foreign = [v.target for v in spec.variants if targets.parse_target(v.target).vendor != vendor]
        if foreign and "error" not in out:
            before = ops._ext.loaded_modules()
            try:
                op.load_kernel(si, target=foreign[0], device=0)
                out["error"] = None
            except RuntimeError as e:
                out["error"] = str(e)
            out["foreign"] = foreign[0]
            out["modules_added"] = ops._ext.loaded_modules() - before
x = torch.randn(1000, 1000, device="cuda")
out["add_after_refusal_ok"] = bool(torch.equal(ops.add(x, x), x + x))
print(json.dumps(out))
"""


def test_a_code_object_the_driver_refuses_raises_the_runtimes_error_and_the_next_op_still_works(gpu, ops, bundle):
    r = subprocess.run([sys.executable, "-c", FOREIGN_LOAD, str(bundle)], cwd=ROOT, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    if "foreign" not in seen:
        pytest.skip(f"the bundle has no code object for another vendor than this GPU ({seen['device']}); the test "
                    "would load one and expect the runtime's refusal as a RuntimeError")
    flavor = expected_flavor(gpu)
    api = "cuModuleLoadData" if flavor == "cuda" else "hipModuleLoadData"
    error = seen["error"]
    assert error is not None, f"the driver loaded a {seen['foreign']} code object on {seen['device']}"
    assert error.startswith("flyship: loading code object ") and f" {api}: " in error, error
    # hip-nvidia: HIP's name for the call, CUDA's code and words (the mapping passes the driver's error through).
    assert ("CUDA_ERROR_" if flavor in ("cuda", "hip-nvidia") else "hipError") in error, error
    assert seen["modules_added"] == 0  # nothing cached for a failed load
    assert seen["add_after_refusal_ok"]
