"""GPU target IDs: parsing, compatibility rules and per-target limits.

AMDGPU target IDs follow the LLVM AMDGPU usage document ("Target ID" section):
``<processor>(:<feature>(+|-))*``, e.g. ``gfx942:sramecc+:xnack-``. A feature that a code object
leaves unspecified runs under either setting of the device; a specified feature (``+`` or ``-``)
must equal the device's. NVIDIA targets are written ``sm_<major><minor>[a]`` (``sm_90``, ``sm_90a``).
A cubin for ``sm_XY`` runs on a device of the same major version and minor >= Y (CUDA binary
compatibility, CUDA C++ Programming Guide "Binary Compatibility"); the arch-specific ``a`` variant
runs only on exactly that device.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from flyship.bundle.errors import BundleError
from flyship.bundle.frozen import frozen

# Per-workgroup LDS (bytes) and wavefront size of the AMD processors we know. Sources: LLVM
# AMDGPUUsage "Processors" table and the CDNA3 / CDNA4 ISA guides (64 KiB LDS on gfx942,
# 160 KiB on gfx950).
AMD_PROCESSORS: dict[str, dict[str, int]] = {
    "gfx90a": {"lds_bytes": 64 * 1024, "wavefront_size": 64, "max_workgroup_size": 1024},
    "gfx940": {"lds_bytes": 64 * 1024, "wavefront_size": 64, "max_workgroup_size": 1024},
    "gfx941": {"lds_bytes": 64 * 1024, "wavefront_size": 64, "max_workgroup_size": 1024},
    "gfx942": {"lds_bytes": 64 * 1024, "wavefront_size": 64, "max_workgroup_size": 1024},
    "gfx950": {"lds_bytes": 160 * 1024, "wavefront_size": 64, "max_workgroup_size": 1024},
    "gfx1100": {"lds_bytes": 64 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
    "gfx1101": {"lds_bytes": 64 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
    "gfx1200": {"lds_bytes": 64 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
    "gfx1201": {"lds_bytes": 64 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
}

# The compute-unit count (``device.cu_count`` in expressions) a build evaluates example grids at, when a spec
# does not name one: the largest product of each processor. One target ID covers devices of several sizes
# (gfx942: MI300X 304 CUs, MI300A 228, MI308X 80), so the loader reads the real count per device.
EXAMPLE_CU_COUNT: dict[str, int] = {"gfx90a": 110, "gfx940": 304, "gfx941": 304, "gfx942": 304, "gfx950": 256,
                                    "gfx1100": 96, "gfx1101": 60, "gfx1200": 32, "gfx1201": 64,
                                    "sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_90": 132, "sm_100": 148,
                                    "sm_120": 170}

# NVIDIA: max shared memory per block (opt-in), warp size, threads per block. Source: CUDA C++
# Programming Guide, "Technical Specifications per Compute Capability".
NVIDIA_LIMITS: dict[int, dict[str, int]] = {
    80: {"lds_bytes": 163 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
    86: {"lds_bytes": 99 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
    89: {"lds_bytes": 99 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
    90: {"lds_bytes": 227 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
    100: {"lds_bytes": 227 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
    120: {"lds_bytes": 99 * 1024, "wavefront_size": 32, "max_workgroup_size": 1024},
}

# The one grammar of a target ID, strict: no whitespace, no empty or unknown feature, no feature twice, features
# in LLVM's canonical (alphabetical) order, no leading zero in an sm number. Every reader of a target (the
# manifest's rule book, tuning tables, the loader's device targets, flyc-build --arch) parses with
# :func:`parse_target`, so one text names one target everywhere ("gfx942 " is not a second gfx942).
_AMD_RE = re.compile(r"(gfx[0-9a-f]{2,6})((?::[a-z0-9_]+[+-]){0,8})")
_NV_RE = re.compile(r"sm_([1-9][0-9]{1,3})(a?)")
_MAX_TARGET_TEXT = 64
AMD_FEATURES = ("sramecc", "xnack")


@frozen
class TargetID:
    """A parsed GPU target ID.

    Attributes:
        vendor: ``"amd"`` or ``"nvidia"``.
        processor: ``"gfx942"`` or ``"sm_90"`` (for NVIDIA: without the ``a`` suffix).
        features: AMD target features as ``((name, "+"|"-"), ...)``, sorted; empty when unspecified.
        arch_specific: NVIDIA ``sm_90a``-style arch-specific target.
    """

    vendor: str
    processor: str
    features: tuple[tuple[str, str], ...] = ()
    arch_specific: bool = False

    @property
    def text(self) -> str:
        if self.vendor == "nvidia":
            return self.processor + ("a" if self.arch_specific else "")
        return self.processor + "".join(f":{k}{v}" for k, v in self.features)

    @property
    def sm(self) -> int:
        """NVIDIA compute capability as an integer (``sm_90`` -> 90)."""
        if self.vendor != "nvidia":
            raise BundleError(f"target {self.text}: expected an NVIDIA sm_XX target, got an AMD one")
        return int(self.processor[3:])

    def __str__(self) -> str:
        return self.text


def parse_target(text: str) -> TargetID:
    """Parse ``gfx942``, ``gfx942:sramecc+:xnack-``, ``sm_90`` or ``sm_90a``, strictly (the one target parser).

    Raises:
        BundleError: the text is not a target ID exactly as written (surrounding whitespace, an empty, unknown
            or repeated feature, features out of order); the message lists the accepted forms.
    """
    if not isinstance(text, str):
        raise BundleError(f"target ID: expected a string like 'gfx942' or 'sm_90', got {type(text).__name__}")
    shown = repr(text[:_MAX_TARGET_TEXT]) + ("..." if len(text) > _MAX_TARGET_TEXT else "")
    if text != text.strip():
        raise BundleError(f"target ID {shown}: expected no surrounding whitespace; write {text.strip()[:64]!r}")
    m = _AMD_RE.fullmatch(text) if len(text) <= _MAX_TARGET_TEXT else None
    if m:
        feats: dict[str, str] = {}
        for part in m.group(2).split(":")[1:]:
            name, sign = part[:-1], part[-1]
            if name not in AMD_FEATURES:
                raise BundleError(f"target ID {shown}: unknown feature {name!r}; expected one of "
                                  f"{', '.join(AMD_FEATURES)}")
            if name in feats:
                raise BundleError(f"target ID {shown}: feature {name!r} given twice; give each at most once")
            feats[name] = sign
        tid = TargetID("amd", m.group(1), tuple(sorted(feats.items())))
        if tid.text != text:
            raise BundleError(f"target ID {shown}: expected the features in alphabetical order; write {tid.text!r}")
        return tid
    m = _NV_RE.fullmatch(text) if len(text) <= _MAX_TARGET_TEXT else None
    if m:
        return TargetID("nvidia", f"sm_{m.group(1)}", (), bool(m.group(2)))
    raise BundleError(
        f"target ID {shown}: expected an AMD target like 'gfx942' or 'gfx942:sramecc+:xnack-' (features sramecc, "
        "xnack, each at most once, in that order, with + or -), or an NVIDIA one like 'sm_90' or 'sm_90a'"
        + _spelling_hint(text)
    )


def _spelling_hint(text: str) -> str:
    """``; did you mean 'gfx942'?`` for a target spelled in another case or without sm_'s underscore, else ''."""
    if len(text) > _MAX_TARGET_TEXT:
        return ""
    guess = text.lower()
    guess = re.sub(r"^sm(?=\d)", "sm_", guess)
    for pattern in (_AMD_RE, _NV_RE):
        if guess != text and pattern.fullmatch(guess):
            return f"; did you mean {guess!r}?"
    return ""


def is_compatible(code_object: TargetID | str, device: TargetID | str) -> bool:
    """Whether a code object built for ``code_object`` runs on a device whose target ID is ``device``.

    AMD: same processor, and every feature the code object specifies equals the device's setting
    (a feature the device does not report counts as unspecified: only an unspecified feature in
    the code object matches it). NVIDIA: same major version and device minor >= code minor;
    ``sm_XYa`` only on exactly ``sm_XY``.
    """
    co = parse_target(code_object) if isinstance(code_object, str) else code_object
    dev = parse_target(device) if isinstance(device, str) else device
    if co.vendor != dev.vendor:
        return False
    if co.vendor == "nvidia":
        if co.arch_specific:
            return co.sm == dev.sm
        return co.sm // 10 == dev.sm // 10 and dev.sm % 10 >= co.sm % 10
    if co.processor != dev.processor:
        return False
    dev_feats = dict(dev.features)
    return all(dev_feats.get(name) == sign for name, sign in co.features)


def compatibility_rank(code_object: TargetID, device: TargetID) -> int:
    """Among compatible code objects, higher is a closer match (more features pinned, exact sm)."""
    if code_object.vendor == "nvidia":
        return 100 - (device.sm - code_object.sm) + (1 if code_object.arch_specific else 0)
    return len(code_object.features)


def known_processors(vendor: str) -> list[str]:
    """The processors flyship knows the limits of (``"amd"``: ``gfx942``...; ``"nvidia"``: ``sm_90``...)."""
    if vendor == "amd":
        return sorted(AMD_PROCESSORS)
    return [f"sm_{k}" for k in sorted(NVIDIA_LIMITS)]


def check_known(target: TargetID | str) -> TargetID:
    """Parse ``target`` and check that its processor is one flyship knows (the tables above): a typo such as
    ``gfx0942`` parses as a target ID but names no GPU, and would build nothing.

    Raises:
        BundleError: not a target ID, or an unknown processor; names the nearest known one and lists them all.
    """
    t = parse_target(target) if isinstance(target, str) else target
    known = known_processors(t.vendor)
    if t.processor in known:
        return t
    near = difflib.get_close_matches(t.processor, known, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise BundleError(f"target {t.text}: expected a known {'AMD' if t.vendor == 'amd' else 'NVIDIA'} processor, got "
                      f"{t.processor!r}; {hint}known: {', '.join(known)}")


def limits(target: TargetID | str) -> dict[str, int]:
    """Per-workgroup LDS bytes, wavefront size and max workgroup size of a target.

    Raises:
        BundleError: the processor is not one flyship knows limits for (:func:`check_known`'s message).
    """
    t = check_known(target)
    if t.vendor == "amd":
        return dict(AMD_PROCESSORS[t.processor])
    return dict(NVIDIA_LIMITS[t.sm])


def example_cu_count(target: TargetID | str) -> int | None:
    """The compute units a build assumes for ``device.cu_count`` at the example call, or None when
    flyship knows no device of this target (then the spec names it: ``Spec(cu_count=...)``)."""
    t = parse_target(target) if isinstance(target, str) else target
    return EXAMPLE_CU_COUNT.get(t.processor if t.vendor == "amd" else f"sm_{t.sm}")


FALLBACK_CU_COUNT = 304  # a target flyship knows no example device of: the largest gfx942 product (MI300X)


def usual_cu_count(target: TargetID | str) -> int:
    """The compute units a device of ``target`` is described with when the caller names none (a dry run, an
    interpreted verify): :func:`example_cu_count` (132 for sm_90, 256 for gfx950), else :data:`FALLBACK_CU_COUNT`.

    Raises:
        BundleError: ``target`` is not a target ID (:func:`parse_target`).
    """
    n = example_cu_count(target)
    return FALLBACK_CU_COUNT if n is None else n


def select(candidates: list[str], device: str) -> int | None:
    """Index of the best code-object target in ``candidates`` for ``device``, or None if none runs."""
    dev = parse_target(device)
    best, best_rank = None, None
    for i, c in enumerate(candidates):
        co = parse_target(c)
        if is_compatible(co, dev):
            r = compatibility_rank(co, dev)
            if best_rank is None or r > best_rank:
                best, best_rank = i, r
    return best


def output_dtype(o: Any, target: str | None) -> str:
    """The dtype rule of a manifest output ``o`` (``dtype``, ``target_dtypes``: schema 6.0) on a device of
    ``target`` (None: the host): the ``target_dtypes`` entry the device would pick as a code object's target (a full
    target ID's over its processor's, :func:`select`), else ``o.dtype``. The one owner of the choice: the loader's
    allocation, fake kernel, ``out=`` checks and dry runs all take it from here."""
    if target is None or not o.target_dtypes:
        return o.dtype
    keys = sorted(o.target_dtypes)
    i = select(keys, target)
    return o.dtype if i is None else o.target_dtypes[keys[i]]
