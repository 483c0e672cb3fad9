"""Selection on the Python side: which variant of each specialization a device target runs (the chooser the
C++ core asks once per (bundle, device target)), why none fits, and the fallback and device arguments as the
loader reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from flyship.bundle import limits as _limits
from flyship.bundle import manifest as _m
from flyship.bundle import targets as _targets
from flyship.bundle.frozen import frozen
from flyship.errors import ConfigError
from flyship.loader import plancache as _plancache

# The variant index that tells the C++ core "run the reference, on purpose" (a decision, not a failure: no
# fallback warning, run even with the fallback off, counted in stats()["original"]); one value, bundle/limits.py,
# which csrc/limits.h's kOnPurpose is generated from.
ON_PURPOSE = _limits.VARIANT_ON_PURPOSE
ORIGINAL_WINS = "tuned: the original wins for this key"


@frozen
class Decision:
    """What a call would run.

    Attributes:
        spec: the specialization's name, or None when nothing fits (the call falls back).
        target: the chosen variant's target, or None.
        reason: why nothing fits (the fallback reason), or "".
    """

    spec: Optional[str]
    target: Optional[str]
    reason: str


def make_selector(plan: _plancache.BundlePlan | _m.Manifest) -> Callable[[str], list[list[tuple[int, str]]]]:
    """The variant chooser the C++ core calls once per (bundle, device target): per op, per
    specialization, the index of the variant to run (:func:`flyship.bundle.targets.select`) or -1 with
    the reason, or :data:`ON_PURPOSE` for a tuned bucket the original wins (:func:`flyship.loader.tuned.apply`).
    It reads only the plan's variant targets (no op is read for it)."""
    if isinstance(plan, _m.Manifest):
        plan = _plancache.BundlePlan.of(plan)
    head, spec_names, spec_targets = plan.head, plan.spec_names, plan.spec_targets

    def select(device_target: str) -> list[list[tuple[int, str]]]:
        chosen: dict[tuple[str, ...], tuple[int, str]] = {}  # specializations mostly share their targets
        out = []
        for k, per_op in enumerate(spec_targets):
            per = []
            for si, cands in enumerate(per_op):
                if not cands and _tuned_original(spec_names[k][si]):
                    per.append((ON_PURPOSE, ORIGINAL_WINS))
                    continue
                if cands not in chosen:
                    i = _targets.select(list(cands), device_target)
                    chosen[cands] = (-1, _no_code_object(device_target, list(cands))) if i is None else (i, "")
                i, why = chosen[cands]
                if i < 0 and head.failed:  # a --keep-going bundle: the build's own reason when it has one
                    why = _not_built(head, head.ops[k].name, spec_names[k][si], device_target) or why
                per.append((i, why))
            out.append(per)
        return out

    return select


def _tuned_original(spec_name: str) -> bool:
    """Whether a specialization without variants is a tuning table's "the original wins" bucket (only a table's
    buckets lack variants: the tuning module is imported for them, not at every load)."""
    from flyship.bundle import tuning as _tt

    return spec_name.startswith(_tt.ORIGINAL + _tt.TUNED_SUFFIX)


def failures_for(manifest: _m.Manifest, op: str, spec: Optional[str] = None) -> list[_m.Failure]:
    """The manifest's ``failed`` entries (a ``--keep-going`` build) of ``op`` (and of the declared spec that
    manifest specialization ``spec`` comes from: ``fp8`` or a per-target ``fp8__gfx942``)."""
    return [f for f in manifest.failed if f.op == op and (spec is None or spec == f.spec
                                                          or spec.startswith(f.spec + "__"))]


def _not_built(manifest: _m.Manifest, op: str, spec: str, device_target: str) -> str:
    """The fallback reason when the build of this specialization failed for the device's target, or ""."""
    for f in failures_for(manifest, op, spec):
        if _targets.is_compatible(f.target, device_target):
            return f"{op}.{f.spec} did not build for {f.target} (flyc-build --keep-going): {f.reason}"
    return ""


def warn_not_built(manifest: _m.Manifest, root: Path) -> None:
    """Say once at load that a ``--keep-going`` bundle lacks kernels: calls they would take fall back."""
    if not manifest.failed:
        return
    import warnings

    listed = "; ".join(f"{f.op}.{f.spec} on {f.target}: {f.reason.splitlines()[0][:200]}" for f in manifest.failed)
    warnings.warn(f"flyship.load {root}: the bundle was built with --keep-going and {len(manifest.failed)} kernel(s) "
                  f"did not build; calls they would take run the next specialization or the reference: {listed}",
                  UserWarning, stacklevel=3)


def _no_code_object(device_target: str, candidates: list[str]) -> str:
    """The fallback reason when no variant runs on a device: its target and the bundle's targets of the
    same vendor (all of them if it has none of that vendor)."""
    vendor = _targets.parse_target(device_target).vendor
    same = sorted({c for c in candidates if _targets.parse_target(c).vendor == vendor})
    if same:
        return f"no code object for {device_target}; bundle has {', '.join(same)}"
    names = {"amd": "AMD", "nvidia": "NVIDIA"}
    return (f"no code object for {device_target}; bundle has no {names[vendor]} code objects "
            f"({', '.join(sorted(set(candidates)))})")



def fallback_flag(value: Any, where: str) -> bool:
    """``value`` as the fallback switch: a bool only. A string such as ``"off"`` or ``"0"`` is truthy in Python,
    so taking it would turn the fallback on when the caller meant off; refuse it instead.

    Raises:
        ConfigError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected True or False, got {value!r} ({type(value).__name__}); pass True to "
                          "run the reference when no specialization fits, False to raise instead")
    return value


def _in_range(index: int, where: str, usage: str) -> int:
    """``index`` when the C++ core keeps state for it (``bundle/limits.py`` MAX_DEVICES, ``csrc/limits.h``)."""
    if not 0 <= index < _limits.MAX_DEVICES:
        raise ConfigError(f"{where}: expected a GPU index in 0..{_limits.MAX_DEVICES - 1}, got {index}; {usage}")
    return index


def device_index(device: Any, where: str) -> int:
    """The GPU index ``device`` names, read as ``torch.device`` reads it: an int, a string (``"cuda:1"``) or a
    ``torch.device``; one without an index (``"cuda"``) is torch's current device.

    Raises:
        ConfigError: another type (a float, a bool), a string torch does not read, a device that is not a GPU, or
            an index outside 0..MAX_DEVICES - 1 (bundle/limits.py).
    """
    import torch

    usage = "pass a GPU index (0), a string ('cuda:0') or a torch.device"
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise ConfigError(f"{where}: expected a GPU device, got {device!r} ({type(device).__name__}); {usage}")
    if isinstance(device, int):
        return _in_range(device, where, usage)
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ConfigError(f"{where}: expected a GPU device, got {device!r}, which torch.device refuses ({e}); "
                          f"{usage}") from None
    if d.type not in ("cuda", "hip"):  # a ROCm build of torch calls its GPUs "cuda" too
        raise ConfigError(f"{where}: expected a GPU device, got {device!r} (a {d.type} device); {usage}")
    if d.index is not None:
        return _in_range(d.index, where, usage)
    try:
        return torch.cuda.current_device()
    except (RuntimeError, AssertionError) as e:  # a CPU-only torch asserts
        raise ConfigError(f"{where}: expected a GPU device, got {device!r} without an index and torch has no "
                          f"current GPU ({e}); pass an index, e.g. 'cuda:0'") from None


def device_reads(op: _m.Op) -> list[str]:
    """Where the op's launch rules read the device (``device.cu_count``): ``"spec f32 guard"``, ``"spec f32
    gfx942 grid"``, ... in manifest order; empty when no rule does. A decision without a device must be told the
    device's values for these (:meth:`flyship.loader.handles.OpHandle.dispatch`'s ``cu_count``)."""
    from flyship.bundle import expr as _expr

    found: list[str] = []

    def note(where: str, texts: Any) -> None:
        if any(t and _expr.names_device(t) for t in texts) and where not in found:
            found.append(where)

    for s in op.specializations:
        note(f"spec {s.name} guard", s.guard.constraints)
        for v in s.variants:
            for k, launch in enumerate((v, *v.then)):
                where = f"spec {s.name} {v.target}" + (f" launch {k + 1}" if v.then else "")
                note(f"{where} grid", (*launch.launch.grid, launch.launch.dynamic_lds))
                note(f"{where} kernel arguments", (f.expr for f in launch.kernargs.fields))
            note(f"spec {s.name} {v.target} workspaces", (e for w in v.workspaces for e in w.shape))
    return found


def dispatch_cu_count(name: str, target: str, cu_count: Optional[int], reads: list[str]) -> int:
    """``dispatch``'s ``cu_count``, checked: required where the op reads ``device.cu_count`` (``reads``:
    :func:`device_reads`); the core would decide for 0 CUs (a guard failed, or an expression that "divides by zero").

    Raises:
        ConfigError: a ``cu_count`` below 1, or none for an op that reads it.
    """
    if cu_count is not None:
        if isinstance(cu_count, bool) or not isinstance(cu_count, int) or cu_count < 1:
            raise ConfigError(f"{name}: expected cu_count to be an int >= 1 (the device's compute units), got "
                              f"{cu_count!r}")
        return cu_count
    if not reads:
        return 0
    usual = _targets.example_cu_count(target)
    example = f"cu_count={usual} (a usual {target.split(':')[0]} device)" if usual else "cu_count=N"
    raise ConfigError(f"{name}: expected cu_count= for target {target!r}, got none: the op reads device.cu_count "
                      f"({'; '.join(reads[:3])}{'; ...' if len(reads) > 3 else ''}), which a dispatch without a "
                      f"device does not know (a target ID does not fix it: an MI300X and an MI308X are both gfx942, "
                      f"304 and 80 CUs); pass the device's count, e.g. {example}, or "
                      f"torch.cuda.get_device_properties(i).multi_processor_count for GPU i")
