"""The test-only hip-nvidia flavor without a GPU: the HIP driver shim (csrc/driver_hip.cpp) compiled for HIP's
NVIDIA platform against tests/gpu/hip_nvidia/include, driven by a probe against a recording CUDA driver.

What this proves here: the mapping compiles against CUDA 13's cuda.h with -Werror; the shim reports
``hip-nvidia``; a failed call carries CUDA's code and the driver's own words; the kernarg buffer reaches
cuLaunchKernel through ``extra`` with its size read as a ``size_t``; a thread with no current context gets the
device's primary context (HIP has no contexts); the runtime-version check compares driver and headers. The GPU
run (scripts/gpu_check_hip_nvidia.sh) proves the same against the real driver with the real kernels.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flyship.errors import ConfigError
from flyship.loader import extension, toolkits

pytestmark = pytest.mark.hipnv

ROOT = Path(__file__).resolve().parents[2]
HIPNV = ROOT / "tests" / "gpu" / "hip_nvidia"


def cuda_include() -> Path | None:
    """``FLYSHIP_TEST_CUDA_INCLUDE``, else where the cuda flavor would look (CUDA_HOME, /usr/local/cuda, pip)."""
    if os.environ.get("FLYSHIP_TEST_CUDA_INCLUDE"):
        return Path(os.environ["FLYSHIP_TEST_CUDA_INCLUDE"])
    return toolkits.find_cuda_header()[0]


CUDA_INCLUDE = cuda_include()
needs_cuda_h = pytest.mark.skipif(
    CUDA_INCLUDE is None or not (CUDA_INCLUDE / "cuda.h").is_file() or shutil.which("c++") is None,
    reason="needs cuda.h and c++ to compile the HIP shim for HIP's NVIDIA platform; get the headers with "
           "scripts/fetch_cuda_headers.sh (PyPI's nvidia-cuda-runtime wheel) and set FLYSHIP_TEST_CUDA_INCLUDE")


def cuda_version() -> tuple[int, int]:
    """(major, minor) of the cuda.h the tests compile against."""
    text = (CUDA_INCLUDE / "cuda.h").read_text(errors="replace")
    v = int(re.search(r"^#define CUDA_VERSION (\d+)", text, re.M).group(1))
    return v // 1000, v % 1000 // 10


def hip_encoded(major: int, minor: int) -> int:
    return major * 10000000 + minor * 100000


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("hipnv") / "probe"
    cmd = ["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-D__HIP_PLATFORM_NVIDIA__",
           f"-I{HIPNV / 'include'}", f"-I{HIPNV}", f"-I{ROOT / 'csrc'}", f"-I{CUDA_INCLUDE}",
           str(ROOT / "csrc" / "driver_hip.cpp"), str(HIPNV / "recording_driver.cpp"), str(HIPNV / "probe.cpp"),
           "-pthread", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return exe


def run(exe: Path, *args: str, **knobs: str) -> dict:
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60, env=dict(os.environ, **knobs))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def seen(probe) -> dict:
    return run(probe)


@needs_cuda_h
def test_the_shim_reports_hip_nvidia_and_the_driver_version_against_the_headers(seen):
    assert seen["flavor"] == "hip-nvidia"
    major, minor = cuda_version()  # the recording driver reports the headers' CUDA version
    assert seen["runtime_version"] == f"HIP runtime {hip_encoded(major, minor)}, headers {major}.{minor}.0"


@needs_cuda_h
def test_device_properties_give_the_target_id_flyship_writes_for_nvidia(seen):
    dev = seen["device"]
    assert dev["status"]["code"] == 0
    assert dev["target"] == "sm_90" and dev["name"] == "Recording H200"
    assert dev["max_shared_per_block"] == 232448 and dev["max_threads_per_block"] == 1024  # the opt-in limit
    assert dev["cu_count"] == 132  # device.cu_count: the H200's SMs, read through hipDeviceProp_t


@needs_cuda_h
def test_failed_calls_carry_cuda_codes_and_the_drivers_words(seen):
    assert seen["missing_device"]["status"] == {
        "code": 101, "message": "hipGetDeviceProperties: CUDA_ERROR_INVALID_DEVICE (invalid device ordinal)"}
    assert seen["load_garbage"] == {
        "code": 200, "message": "hipModuleLoadData: CUDA_ERROR_INVALID_IMAGE (device kernel image is invalid)"}
    assert seen["function_missing"] == {
        "code": 500, "message": "hipModuleGetFunction: CUDA_ERROR_NOT_FOUND (named symbol not found)"}


@needs_cuda_h
def test_a_thread_without_a_context_loads_and_launches_in_the_primary_context(seen):
    assert seen["load"]["code"] == 0 and seen["function"]["code"] == 0 and seen["launch"]["code"] == 0
    assert seen["primary_retains"] == 1  # retained once, kept for the process


@needs_cuda_h
def test_the_kernarg_buffer_reaches_the_driver_with_its_size_as_a_size_t(seen):
    launched = seen["launched"]
    assert launched["grid"] == [70000, 3, 2] and launched["block"] == [256, 1, 1]
    assert launched["stream"] == "0x5eed"  # torch's stream pointer, untouched
    assert launched["params_null"] and not launched["extra_null"]
    assert launched["size"] == 20 and launched["bytes"] == [i * 7 + 1 for i in range(20)]


@needs_cuda_h
def test_dynamic_lds_above_48_kib_is_opted_in_as_hip_needs_no_opt_in(seen):
    assert seen["launched"]["shared"] == 65536 and seen["launched"]["max_dynamic_shared_attribute"] == 65536
    # Set once per new high-water mark: a later launch under CUDA-graph capture does not set it again.
    assert seen["launch_smaller"]["code"] == 0 and seen["attribute_calls"] == 1


@needs_cuda_h
def test_a_kernel_without_arguments_launches_with_no_extra_array(seen):
    assert seen["launch_no_args"]["code"] == 0
    assert seen["launched_no_args"]["extra_null"] and seen["launched_no_args"]["stream"] == "(nil)"


@needs_cuda_h
def test_a_driver_of_another_major_version_than_the_headers_is_refused(probe):
    major, minor = cuda_version()
    dev = run(probe, "device", FAKE_CUDA_DRIVER_VERSION=str((major - 1) * 1000 + 80))["device"]
    assert dev["status"]["code"] == -1
    assert (f"HIP runtime version {hip_encoded(major - 1, 8)} has another major version than the headers"
            in dev["status"]["message"])
    assert f"({major}.{minor})" in dev["status"]["message"]


@needs_cuda_h
def test_no_device_is_the_drivers_error_not_a_crash(probe):
    dev = run(probe, "device", FAKE_CUDA_INIT="100")["device"]
    assert dev["status"] == {
        "code": 100, "message": "hipGetDeviceProperties: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"}


def test_the_hip_nvidia_flavor_is_only_built_when_asked_for(monkeypatch):
    monkeypatch.delenv("FLYSHIP_FLAVOR", raising=False)
    try:
        chosen = extension.choose_flavor()
    except extension.ExtensionBuildError:  # a CPU-only torch without HIP headers: nothing is chosen at all
        chosen = None
    assert chosen in ("hip", "cuda", None)
    monkeypatch.setenv("FLYSHIP_FLAVOR", "hip-nvidia")
    assert extension.choose_flavor() == "hip-nvidia"
    monkeypatch.setenv("FLYSHIP_FLAVOR", "hipnvidia")
    with pytest.raises(ConfigError,
                       match="expected 'hip', 'cuda' or 'emulate' \\(or the test-only 'hip-nvidia', 'record'\\), got"):
        extension.choose_flavor()


def test_the_hip_nvidia_flavor_needs_the_test_header_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("FLYSHIP_FLAVOR", "hip-nvidia")
    monkeypatch.delenv("FLYSHIP_HIP_NVIDIA_INCLUDE", raising=False)
    with pytest.raises(extension.ExtensionBuildError, match="expected FLYSHIP_HIP_NVIDIA_INCLUDE to name a folder with "
                                                        "hip/hip_runtime_api.h, got 'nothing'"):
        extension.config()
    monkeypatch.setenv("FLYSHIP_HIP_NVIDIA_INCLUDE", str(tmp_path))
    with pytest.raises(extension.ExtensionBuildError, match="set it to tests/gpu/hip_nvidia/include"):
        extension.config()


@needs_cuda_h
def test_the_hip_nvidia_build_compiles_the_hip_shim_for_the_nvidia_platform(monkeypatch, tmp_path):
    monkeypatch.setenv("FLYSHIP_FLAVOR", "hip-nvidia")
    monkeypatch.setenv("FLYSHIP_HIP_NVIDIA_INCLUDE", str(HIPNV / "include"))
    monkeypatch.setenv("FLYSHIP_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(toolkits, "find_cuda_header", lambda: (CUDA_INCLUDE, [str(CUDA_INCLUDE)]))
    monkeypatch.setattr(toolkits, "find_cuda_library", lambda: tmp_path / "libcuda.so")  # linking happens on the GPU
    cfg = extension.config()
    assert cfg.flavor == "hip-nvidia" and cfg.name.startswith("flyship_hip_nvidia_")
    assert [Path(s).name for s in cfg.sources] == [*extension.CORE_SOURCES, "driver_hip.cpp"]
    assert "-D__HIP_PLATFORM_NVIDIA__=1" in cfg.cflags and not any("AMD" in f for f in cfg.cflags)
    assert cfg.include_dirs == (str(HIPNV / "include"), str(CUDA_INCLUDE))
    assert cfg.ldflags == (str(tmp_path / "libcuda.so"),)


# The whole extension, built in the hip-nvidia flavor and linked against the recording driver as libcuda.so.1,
# loads the tiny bundle and a code object through the HIP shim. The stub sits at a stable path under the
# extension cache so a second run imports the cached build instead of compiling again (~2 min on 2 cores).
E2E = """
import json, sys
from pathlib import Path
from flyship.loader import toolkits
inc, stub, tiny = sys.argv[1:4]
toolkits.find_cuda_header = lambda: (Path(inc), [inc])
toolkits.find_cuda_library = lambda: Path(stub)
import flyship
ops = flyship.load(tiny)
out = {"flavor": ops.flavor, "ext_flavor": ops._ext.flavor(), "version": ops._ext.runtime_version(),
       "target": ops.device_target(0)}
ops.add.load_kernel("f32", target=out["target"], device=0)
out["modules"] = ops._ext.loaded_modules()
print(json.dumps(out))
"""


@needs_cuda_h
def test_the_whole_extension_builds_as_hip_nvidia_and_loads_a_cubin_through_the_hip_shim(tiny_bundle):
    stub_dir = extension.extensions_root() / "hipnv-recording-driver"
    stub_dir.mkdir(parents=True, exist_ok=True)
    stub = stub_dir / "libcuda.so"
    r = subprocess.run(["c++", "-std=c++17", "-shared", "-fPIC", "-O1", f"-I{HIPNV}", f"-I{CUDA_INCLUDE}",
                        str(HIPNV / "recording_driver.cpp"), "-Wl,-soname,libcuda.so.1", "-o", str(stub)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (stub_dir / "libcuda.so.1").unlink(missing_ok=True)
    (stub_dir / "libcuda.so.1").symlink_to("libcuda.so")
    env = dict(os.environ, FLYSHIP_FLAVOR="hip-nvidia", FLYSHIP_HIP_NVIDIA_INCLUDE=str(HIPNV / "include"),
               LD_LIBRARY_PATH=str(stub_dir))
    r = subprocess.run([sys.executable, "-c", E2E, str(CUDA_INCLUDE), str(stub), str(tiny_bundle)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["flavor"] == seen["ext_flavor"] == "hip-nvidia"
    major, minor = cuda_version()
    assert seen["version"] == f"HIP runtime {hip_encoded(major, minor)}, headers {major}.{minor}.0"
    assert seen["target"] == "sm_90"  # gcnArchName as flyship writes NVIDIA targets: the sm_90a cubin is chosen
    assert seen["modules"] == 1
