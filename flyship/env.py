"""Every ``FLYSHIP_*`` environment option, typed and documented in one place; read when used.

Options:
    FLYSHIP_FLAVOR: force the loader's driver shim, ``hip`` or ``cuda`` (default: from the torch build:
        ROCm torch -> hip, CUDA torch -> cuda; a CPU-only torch builds the hip flavor when HIP headers exist).
        TEST-ONLY: ``hip-nvidia`` builds the HIP shim (csrc/driver_hip.cpp) for HIP's NVIDIA platform, over the
        CUDA driver, to run the HIP launch path on an NVIDIA GPU (scripts/gpu_check_hip_nvidia.sh); never
        chosen unless set here, and it needs FLYSHIP_HIP_NVIDIA_INCLUDE.
    FLYSHIP_HIP_NVIDIA_INCLUDE: TEST-ONLY, for ``FLYSHIP_FLAVOR=hip-nvidia``: the folder holding the test's
        ``hip/hip_runtime_api.h`` that maps the shim's HIP calls onto the CUDA driver
        (``tests/gpu/hip_nvidia/include``). The CUDA headers and libcuda are found as for the cuda flavor.
        ``record`` is test-only and never chosen by default: the recording driver (csrc/driver_record.cpp)
        runs the real call path on CPU tensors and records each launch instead of running it.
    FLYSHIP_HIP_PATH: root of the HIP install to compile the hip flavor against (default: ``$ROCM_PATH``,
        ``/opt/rocm``, then Debian's ``/usr``).
    FLYSHIP_EXTENSIONS_DIR: where the compiled extension is cached (default: ``$TORCH_EXTENSIONS_DIR`` or
        torch's default, under a ``flyship`` folder).
    FLYSHIP_FALLBACK: ``1`` (default) sends inputs that fit no specialization to the op's reference;
        ``0`` raises instead.
    FLYSHIP_FAST_CALL: ``1`` (default) lets eager calls of ``ops.<op>(...)`` / ``ops.<op>.out(...)`` enter the
        C++ core directly when nothing but flyship's kernel would act on them (csrc/fast_call.cpp); ``0`` sends
        every call through ``torch.ops`` (read at ``flyship.load``).
    FLYSHIP_VERBOSE: ``1`` prints extension build commands and bundle loading details.
    FLYSHIP_LLVM_BIN: folder holding llvm-mc and ld.lld for flyc-build (same as ``--llvm-bin``).
    FLYSHIP_REPORT: ``1`` prints each process's routing summary (patched sites: calls to the op and to the
        original, per reason; rank-tagged) to stderr at exit.
    FLYSHIP_HOOK: ``0`` turns off the patches that ``flyship hook install`` set up for this environment.
    FLYSHIP_EXTENSION_PATH: folders (``:``-separated) searched first for a prebuilt extension
        (``flyship prebuild -o DIR``); then the folder holding the bundle, then
        ``<sys.prefix>/share/flyship/extensions``.
    FLYSHIP_CACHE_DIR: flyc-build's content-addressed build cache (default: ``$XDG_CACHE_HOME/flyship/build``,
        else ``~/.cache/flyship/build``); ``flyc-build --no-cache`` bypasses it.
    FLYSHIP_BUNDLE_CACHE: where packed bundles opened by ``flyship.load(FILE)`` are extracted, under
        ``<sha256 of the file>`` (default: ``$XDG_CACHE_HOME/flyship/bundles``, else ``~/.cache/flyship/bundles``).
    FLYSHIP_PLAN_CACHE: where ``flyship.load`` keeps each bundle's checked, lowered plan, keyed by the manifest's
        sha256 and flyship's code (default: ``$XDG_CACHE_HOME/flyship/plans``, else ``~/.cache/flyship/plans``);
        ``off`` reads, checks and lowers the manifest at every load instead (docs/loader.md, "The plan cache").
    FLYSHIP_TRUSTED_KEYS: public keys (``:``-separated ``.pub`` files from ``flyship keygen``, or 64 hex digits);
        when set, ``flyship.load`` accepts only packs signed by one of them (docs/security.md); ``load(...,
        trusted_keys=)`` overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path

from flyship.errors import ConfigError


FLAVORS = ("hip", "cuda", "hip-nvidia", "record")  # hip-nvidia and record: test-only, see FLYSHIP_FLAVOR


def _get(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def flavor() -> str | None:
    v = _get("FLYSHIP_FLAVOR").lower()
    if v and v not in FLAVORS:
        raise ConfigError(f"FLYSHIP_FLAVOR: expected 'hip' or 'cuda' (or the test-only 'hip-nvidia', 'record'), got "
                          f"{v!r}; unset it to pick from the torch build")
    return v or None


def hip_nvidia_include() -> str:
    return _get("FLYSHIP_HIP_NVIDIA_INCLUDE")


def hip_path() -> str:
    return _get("FLYSHIP_HIP_PATH")


def extensions_dir() -> str:
    return _get("FLYSHIP_EXTENSIONS_DIR")


def _switch(name: str, default: str, off: str, on: str) -> bool:
    """A 0/1 option; set but empty means unset (the default), as for every other FLYSHIP_* option."""
    v = _get(name) or default
    if v not in ("0", "1"):
        raise ConfigError(f"{name}: expected 0 ({off}) or 1 ({on}), got {v!r}; set {name}=0 or {name}=1, or unset "
                          f"it for the default {default}")
    return v == "1"


def fallback_enabled() -> bool:
    return _switch("FLYSHIP_FALLBACK", "1", "raise when no specialization fits", "run the op's reference")


def fast_call_enabled() -> bool:
    return _switch("FLYSHIP_FAST_CALL", "1", "every call through torch.ops", "eager calls enter the C++ core directly")


def verbose() -> bool:
    return _get("FLYSHIP_VERBOSE", "0") == "1"


def llvm_bin() -> str:
    return _get("FLYSHIP_LLVM_BIN")


def report() -> bool:
    return _get("FLYSHIP_REPORT", "0") == "1"


def hook_enabled() -> bool:
    return _get("FLYSHIP_HOOK", "1") != "0"


def _user_cache(option: str, sub: str) -> Path:
    """``option`` when set, else ``<XDG_CACHE_HOME or ~/.cache>/flyship/<sub>`` (XDG: absolute paths only)."""
    v = _get(option)
    if v:
        return Path(v).expanduser()
    xdg = _get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "flyship" / sub


def cache_dir() -> Path:
    """flyc-build's cache folder: ``FLYSHIP_CACHE_DIR``, else the XDG per-user cache (``~/.cache/flyship/build``)."""
    return _user_cache("FLYSHIP_CACHE_DIR", "build")


def bundle_cache_dir() -> Path:
    """Where packed bundles are extracted: ``FLYSHIP_BUNDLE_CACHE``, else ``<per-user cache>/flyship/bundles``."""
    return _user_cache("FLYSHIP_BUNDLE_CACHE", "bundles")


def plan_cache_dir() -> Path | None:
    """Where loads cache checked, lowered plans: ``FLYSHIP_PLAN_CACHE``, else ``<per-user cache>/flyship/plans``;
    None when it is ``off``."""
    return None if _get("FLYSHIP_PLAN_CACHE") == "off" else _user_cache("FLYSHIP_PLAN_CACHE", "plans")


def extension_path() -> list[str]:
    return [d for d in _get("FLYSHIP_EXTENSION_PATH").split(os.pathsep) if d]


def trusted_keys() -> list[str]:
    return [k for k in _get("FLYSHIP_TRUSTED_KEYS").split(os.pathsep) if k]
