"""Every ``FLYSHIP_*`` environment switch: one table (:data:`SWITCHES`: name, kind, default, meaning) and one
parser per kind; read when used. docs/switches.md is this table (tests/hostile/test_surfaces.py checks it against
:func:`table_markdown`).

Kinds (a switch set to an empty or all-blank value counts as unset, i.e. takes its default):
    bool: ``1/0``, ``true/false``, ``yes/no``, ``on/off``, any case; anything else is a ConfigError naming the switch
        and the accepted words.
    folder: an absolute path (``~`` is expanded); a relative one is a ConfigError (``FLYSHIP_PLAN_CACHE=OFF`` must
        not make a folder named ``OFF`` in the current directory), and so is a path that exists and is not a folder
        (``/dev/null``). The folder need not exist yet; flyship creates caches when it writes them.
        ``FLYSHIP_PLAN_CACHE`` also takes the off words of a bool (``0``, ``false``, ``no``, ``off``).
    folders: ``:``-separated folders, each checked as ``folder`` (empty entries skipped).
    count: a whole number from 1 (e.g. ``4``); anything else is a ConfigError naming the switch.
    choice / text / keys: as each switch's meaning says.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from flyship.bundle.frozen import frozen
from flyship.errors import ConfigError


FLAVORS = ("hip", "cuda", "hip-nvidia", "record", "emulate")  # hip-nvidia, record: test-only, see FLYSHIP_FLAVOR
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


@frozen
class Switch:
    name: str
    kind: str  # bool | folder | folders | count | choice | text | keys
    default: str  # as a person reads it in the docs table
    meaning: str


SWITCHES: tuple[Switch, ...] = (
    Switch("FLYSHIP_FLAVOR", "choice", "from the torch build",
           "the loader's driver shim, `hip` or `cuda` (ROCm torch -> hip, CUDA torch -> cuda; a CPU-only torch builds "
           "hip when HIP headers exist). TEST-ONLY: `hip-nvidia` (the HIP shim over the CUDA driver, "
           "scripts/gpu_check_hip_nvidia.sh; needs FLYSHIP_HIP_NVIDIA_INCLUDE) and `record` (the recording driver, "
           "csrc/driver_record.cpp: runs the real call path on CPU tensors and records each launch). `emulate`: the same "
           "call path on CPU tensors, each launch run by flyship's CDNA emulator (csrc/driver_emulate.cpp, "
           "flyship.loader.emulated_device; no GPU, emulated: docs/loader.md)."),
    Switch("FLYSHIP_HIP_NVIDIA_INCLUDE", "folder", "unset",
           "TEST-ONLY, for `FLYSHIP_FLAVOR=hip-nvidia`: the folder holding the test's `hip/hip_runtime_api.h` "
           "(tests/gpu/hip_nvidia/include)."),
    Switch("FLYSHIP_HIP_PATH", "folder", "`$ROCM_PATH`, `/opt/rocm`, then `/usr`",
           "root of the HIP install to compile the hip flavor against."),
    Switch("FLYSHIP_EXTENSIONS_DIR", "folder", "`$TORCH_EXTENSIONS_DIR` or torch's default, under `flyship`",
           "where the compiled loader extension is cached."),
    Switch("FLYSHIP_BUILD_UNITS", "count", "2 below 8 cores (bridge and plain units apart; 1 on one core), else a unit per 4 cores",
           "how many translation units the loader extension's core is compiled as when it is built (the same "
           "module either way): one parses torch's headers once, more compile in parallel (loader/units.py)."),
    Switch("FLYSHIP_FALLBACK", "bool", "on",
           "on: inputs that fit no specialization run the op's reference; off: they raise."),
    Switch("FLYSHIP_FAST_CALL", "bool", "on",
           "on: eager calls of `ops.<op>(...)` and of `torch.ops.<ns>.<op>` (packet, `.default`, `.out`) enter the "
           "C++ core directly when nothing but flyship's kernel would act on them (csrc/fast_call.cpp, "
           "csrc/torch_op_call.cpp); off: every call goes through torch's own `torch.ops` classes and `__call__` "
           "(read at `flyship.load`)."),
    Switch("FLYSHIP_VERBOSE", "bool", "off", "prints extension build commands and bundle loading details."),
    Switch("FLYSHIP_LLVM_BIN", "folder", "found on `ROCM_PATH` / `PATH`",
           "folder holding llvm-mc and ld.lld for flyc-build (same as `--llvm-bin`)."),
    Switch("FLYSHIP_REPORT", "bool", "off",
           "prints each process's routing summary (patched sites; rank-tagged) to stderr at exit."),
    Switch("FLYSHIP_HOOK", "bool", "on",
           "off turns off the patches that `flyship hook install` set up for this environment (a bad value warns "
           "and patches nothing; it never stops the interpreter)."),
    Switch("FLYSHIP_EXTENSION_PATH", "folders", "unset",
           "folders searched first for a prebuilt extension (`flyship prebuild -o DIR`); then the bundle's folder, "
           "then `<sys.prefix>/share/flyship/extensions`."),
    Switch("FLYSHIP_CACHE_DIR", "folder", "`$XDG_CACHE_HOME/flyship/build`, else `~/.cache/flyship/build`",
           "flyc-build's content-addressed build cache (`flyc-build --no-cache` bypasses it)."),
    Switch("FLYSHIP_BUNDLE_CACHE", "folder", "`$XDG_CACHE_HOME/flyship/bundles`, else `~/.cache/flyship/bundles`",
           "where packs opened by `flyship.load(FILE)` are extracted, under `<sha256 of the file>`."),
    Switch("FLYSHIP_PLAN_CACHE", "folder", "`$XDG_CACHE_HOME/flyship/plans`, else `~/.cache/flyship/plans`",
           "where `flyship.load` keeps each bundle's checked, lowered plan (docs/loader-internals.md, \"The plan cache\"); an "
           "off word (`0`, `false`, `no`, `off`) reads, checks and lowers the manifest at every load instead."),
    Switch("FLYSHIP_TRUSTED_KEYS", "keys", "unset",
           "`:`-separated public keys (`.pub` files from `flyship keygen`, or 64 hex digits); when set, "
           "`flyship.load` accepts only packs signed by one of them (docs/security.md); `load(..., trusted_keys=)` "
           "may narrow it, never widen it; blanks or separators only (`:`, ` `) are an error, not \"no policy\"."),
)
_BY_NAME = {s.name: s for s in SWITCHES}


def table_markdown() -> str:
    """docs/switches.md's table, from :data:`SWITCHES`."""
    rows = ["| switch | kind | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.kind} | {s.default} | {s.meaning} |" for s in SWITCHES]
    return "\n".join(rows) + "\n"


def _get(name: str) -> str:
    assert name in _BY_NAME or not name.startswith("FLYSHIP_"), f"{name} is not in flyship.env.SWITCHES"
    return os.environ.get(name, "").strip()


def _bool(name: str, default: bool) -> bool:
    v = _get(name).lower()
    if not v:
        return default
    if v in TRUE_WORDS or v in FALSE_WORDS:
        return v in TRUE_WORDS
    raise ConfigError(f"{name}: expected one of {'/'.join(TRUE_WORDS)} (on) or {'/'.join(FALSE_WORDS)} (off), any "
                      f"case; found {_get(name)!r}; set one of those words, or unset {name} for the default "
                      f"({'on' if default else 'off'})")


_PSEUDO_FS = ("/proc", "/sys")  # the kernel's own files: no folder flyship writes or reads belongs there


def _folder(name: str, value: str) -> Path:
    if "\0" in value:
        raise ConfigError(f"{name}: expected a folder path, found a NUL byte in {value!r}; set a plain absolute path")
    p = Path(value).expanduser()
    if not p.is_absolute():
        raise ConfigError(f"{name}: expected an absolute folder path (or ~/...), found {value!r}; set an absolute "
                          f"path, or unset {name} for the default")
    # Look once, with every OS error a ConfigError naming the switch: a symlink loop (ELOOP), an over-long path
    # (ENAMETOOLONG), a component that is a file (ENOTDIR), a folder we may not search (EACCES).
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None  # created when first used
    except OSError as e:
        raise ConfigError(f"{name}: expected a folder path flyship can use, got {value[:200]!r}: "
                          f"{e.strerror or e}; point {name} at a folder of yours (it is created if missing), or "
                          "unset it") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{name}: expected a folder, found {value!r}, which exists and is not a folder; point "
                          f"{name} at a folder (it is created if missing), or unset it")
    real = os.path.realpath(p)
    if any(real == d or real.startswith(d + "/") for d in _PSEUDO_FS):
        raise ConfigError(f"{name}: expected a folder on a real file system, got {value!r} (under "
                          f"{real.split('/')[1] and '/' + real.split('/')[1]}, the kernel's own files); point {name} "
                          "at a folder of yours, or unset it")
    return p


def _folder_or_empty(name: str) -> str:
    v = _get(name)
    return str(_folder(name, v)) if v else ""


def flavor() -> str | None:
    v = _get("FLYSHIP_FLAVOR").lower()
    if v and v not in FLAVORS:
        raise ConfigError(f"FLYSHIP_FLAVOR: expected 'hip', 'cuda' or 'emulate' (or the test-only 'hip-nvidia', "
                          f"'record'), got {v!r}; unset it to pick from the torch build")
    return v or None


def hip_nvidia_include() -> str:
    return _folder_or_empty("FLYSHIP_HIP_NVIDIA_INCLUDE")


def hip_path() -> str:
    return _folder_or_empty("FLYSHIP_HIP_PATH")


def extensions_dir() -> str:
    return _folder_or_empty("FLYSHIP_EXTENSIONS_DIR")


def build_units() -> int | None:
    """``FLYSHIP_BUILD_UNITS`` as a count, or None when unset (the default grouping)."""
    v = _get("FLYSHIP_BUILD_UNITS")
    if not v:
        return None
    if not (v.isascii() and v.isdigit()) or len(v) > 4 or int(v) < 1:
        raise ConfigError(f"FLYSHIP_BUILD_UNITS: expected a whole number from 1 (the translation units of the "
                          f"extension's core), found {v!r}; set e.g. 4, or unset it for the default")
    return int(v)


def fallback_enabled() -> bool:
    return _bool("FLYSHIP_FALLBACK", True)


def fast_call_enabled() -> bool:
    return _bool("FLYSHIP_FAST_CALL", True)


def verbose() -> bool:
    return _bool("FLYSHIP_VERBOSE", False)


def llvm_bin() -> str:
    return _folder_or_empty("FLYSHIP_LLVM_BIN")


def report() -> bool:
    return _bool("FLYSHIP_REPORT", False)


def hook_enabled() -> bool:
    return _bool("FLYSHIP_HOOK", True)


def _user_cache(option: str, sub: str) -> Path:
    """``option`` when set, else ``<XDG_CACHE_HOME or ~/.cache>/flyship/<sub>`` (XDG: absolute paths only)."""
    v = _get(option)
    if v:
        return _folder(option, v)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
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
    None when it is an off word (``0``, ``false``, ``no``, ``off``, any case)."""
    return None if _get("FLYSHIP_PLAN_CACHE").lower() in FALSE_WORDS else _user_cache("FLYSHIP_PLAN_CACHE", "plans")


def extension_path() -> list[str]:
    return [str(_folder("FLYSHIP_EXTENSION_PATH", d)) for d in _get("FLYSHIP_EXTENSION_PATH").split(os.pathsep) if d]


def trusted_keys() -> list[str] | None:
    """``FLYSHIP_TRUSTED_KEYS`` as its entries, or None when it is unset or empty. Set to blanks or separators
    only (``" "``, ``":"``) it is an error, never "no policy": a switch that was meant to require signatures must
    not fail open."""
    raw = os.environ.get("FLYSHIP_TRUSTED_KEYS", "")
    if not raw:
        return None
    keys = [k.strip() for k in raw.split(os.pathsep)]
    if not any(keys) or not all(keys):
        raise ConfigError(f"FLYSHIP_TRUSTED_KEYS: expected `{os.pathsep}`-separated public keys (.pub files or 64 "
                          f"hex digits), got {raw[:80]!r}, which has an empty entry; name the keys, or unset it to "
                          "require no signature")
    return keys
