"""Where the HIP and CUDA toolkits are: the headers the extension's driver shim compiles against and the runtime
library it links to (or opens, for HIP), each search listing every path it tried when it finds nothing.

Searched only when the extension is built (:func:`flyship.loader.extension.config`); a load that finds its
extension built or prebuilt looks for no toolkit.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from flyship import env
from flyship.errors import LoadError


def import_torch():
    """torch, imported when first needed (a load that finds its extension never asks for a toolkit)."""
    import torch

    return torch


def torch_lib_dir() -> Path:
    return Path(import_torch().__file__).parent / "lib"


def hip_roots() -> list[Path]:
    """Candidate HIP install roots, in search order: ``$FLYSHIP_HIP_PATH``, ``$ROCM_PATH``, torch's
    ``ROCM_HOME``, ``/opt/rocm``, then ``/usr`` (Debian's libamdhip64-dev)."""
    roots: list[str] = [env.hip_path(), os.environ.get("ROCM_PATH", "")]
    # What torch.utils.cpp_extension's ROCM_HOME would find (ROCM_HOME, the hipcc on PATH), read here without
    # importing it: that import pulls in setuptools (~150 ms), and a load that finds its extension compiles nothing.
    roots.append(os.environ.get("ROCM_HOME", ""))
    hipcc = shutil.which("hipcc")
    if hipcc:
        roots.append(str(Path(os.path.realpath(hipcc)).parent.parent))
    roots += ["/opt/rocm", "/usr"]
    out: list[Path] = []
    for r in roots:
        if r and Path(r) not in out:
            out.append(Path(r))
    return out


def find_hip_headers() -> Path | None:
    """The first root's ``include`` directory that holds ``hip/hip_runtime_api.h``, or None."""
    for root in hip_roots():
        inc = root / "include"
        if (inc / "hip" / "hip_runtime_api.h").is_file():
            return inc
    return None


def _multiarch() -> str:
    """The Debian multiarch folder name (``x86_64-linux-gnu``); sysconfig is imported here, by a build only (a load
    that finds its extension imports nothing it does not use)."""
    import sysconfig

    return sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"


def _lib_dirs(root: Path) -> list[Path]:
    multiarch = _multiarch()
    return [root / "lib", root / "lib64", root / "lib" / multiarch]


def find_hip_library() -> tuple[Path, list[str]]:
    """The libamdhip64 whose folder becomes the extension's rpath and whose names its HIP shim opens on first use
    (:func:`flyship.loader.hip_library.find`), and the places searched.

    torch's own copy comes first: ROCm torch wheels carry a libamdhip64 in ``torch/lib`` and a second
    HIP runtime in one process is a bug (two device-memory views). Then the HIP roots' lib folders.

    Raises:
        LoadError (flyship.loader.ExtensionBuildError): none found; lists every path tried.
    """
    from flyship.loader import hip_library

    return hip_library.find([torch_lib_dir()] + [d for r in hip_roots() for d in _lib_dirs(r)])


def cuda_include_candidates() -> list[Path]:
    """Folders that may hold ``cuda.h``: torch's CUDA include paths (CUDA_HOME), pip's nvidia packages,
    Triton's copy."""
    out: list[Path] = []
    try:
        from torch.utils import cpp_extension

        out += [Path(p) for p in cpp_extension.include_paths(device_type="cuda")]
        if cpp_extension.CUDA_HOME:
            out.append(Path(cpp_extension.CUDA_HOME) / "include")
    except Exception:  # noqa: BLE001 - no CUDA toolkit: keep looking
        pass
    if os.environ.get("CUDA_HOME"):
        out.append(Path(os.environ["CUDA_HOME"]) / "include")
    for site in {Path(p) for p in sys.path if p.endswith("site-packages")}:
        out += sorted(site.glob("nvidia/*/include"))
        out.append(site / "triton" / "backends" / "nvidia" / "include")
    out.append(Path("/usr/local/cuda/include"))
    return out


def find_cuda_header() -> tuple[Path | None, list[str]]:
    tried = []
    for d in cuda_include_candidates():
        tried.append(str(d))
        if (d / "cuda.h").is_file():
            return d, tried
    return None, tried


def find_cuda_library() -> Path:
    """libcuda to link against: the toolkit's stub first (its soname is libcuda.so.1, so the process
    loads the driver's real library at run time), then the driver's own.

    Raises:
        LoadError (flyship.loader.ExtensionBuildError): none found; lists every path tried.
    """
    homes = [os.environ.get("CUDA_HOME", "")]
    try:
        from torch.utils import cpp_extension

        homes.append(cpp_extension.CUDA_HOME or "")
    except Exception:  # noqa: BLE001
        pass
    homes.append("/usr/local/cuda")
    dirs = [Path(h) / sub for h in homes if h for sub in ("lib64/stubs", "targets/x86_64-linux/lib/stubs", "lib/stubs")]
    multiarch = _multiarch()
    dirs += [Path("/usr/lib") / multiarch, Path("/usr/lib64"), Path("/usr/lib"), Path("/usr/local/nvidia/lib64")]
    tried = []
    for name in ("libcuda.so", "libcuda.so.1"):
        for d in dirs:
            tried.append(str(d / name))
            if (d / name).exists():
                return d / name
    raise LoadError(
        "build flyship extension (cuda): expected libcuda.so, found none; tried " + ", ".join(tried)
        + "; install the CUDA toolkit (its lib64/stubs) or the NVIDIA driver, or set CUDA_HOME"
    )


def hip_nvidia_config() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Include dirs, flags and link flags of the TEST-ONLY hip-nvidia flavor: driver_hip.cpp compiled with
    ``__HIP_PLATFORM_NVIDIA__`` against the test's HIP-to-CUDA-driver header (``FLYSHIP_HIP_NVIDIA_INCLUDE``,
    e.g. ``tests/gpu/hip_nvidia/include``) and the CUDA headers, linked to libcuda (found as for cuda).

    Raises:
        LoadError (flyship.loader.ExtensionBuildError): the test header folder is unset or lacks
            ``hip/hip_runtime_api.h``; no cuda.h or libcuda.
    """
    inc = env.hip_nvidia_include()
    if not inc or not (Path(inc) / "hip" / "hip_runtime_api.h").is_file():
        raise LoadError(
            f"build flyship extension (hip-nvidia, test-only): expected FLYSHIP_HIP_NVIDIA_INCLUDE to name a folder "
            f"with hip/hip_runtime_api.h, got {inc or 'nothing'!r}; set it to tests/gpu/hip_nvidia/include")
    cuda_inc, tried = find_cuda_header()
    if cuda_inc is None:
        raise LoadError("build flyship extension (hip-nvidia): expected cuda.h, found none; tried "
                                  + ", ".join(tried) + "; install the CUDA toolkit headers or set CUDA_HOME")
    lib = find_cuda_library()
    return (str(Path(inc).resolve()), str(cuda_inc)), ("-D__HIP_PLATFORM_NVIDIA__=1",), (str(lib),)
