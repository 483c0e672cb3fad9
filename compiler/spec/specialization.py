"""The spec API's :class:`Spec`: one specialization to build, and how it differs per target."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from flyship.bundle import targets as _targets
from flyship.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Spec:
    """One specialization to build.

    Args:
        name: unique within the op (``"f32"``, ``"bf16_n4096"``).
        dtypes: input tensor -> torch dtype name.
        shapes: input tensor -> example shape, traced at build time (outputs follow their rules).
        scalars: scalar -> example value (default: the scalar's default).
        constexprs: constexpr -> value.
        constraints: boolean expressions the inputs must satisfy for this specialization (added to
            those the frontend derives from the lowering, such as static strides).
        options: frontend options (Triton: ``num_warps``, ``num_stages``; FlyDSL: its compile hints
            ``waves_per_eu``, ``fast_fp_math``, ``unsafe_fp_math``, ``llvm_options``).
        allow_scratch: accept kernels that spill to scratch (private segment) memory.
        cu_count: the device compute-unit count the kernel bakes in (a persistent grid or a split sized for
            the build machine, e.g. 304 for an MI300X). The specialization then runs only on devices with
            exactly that many (the guard ``device.cu_count == N`` is added, so a 304-CU kernel never runs
            silently on an 80-CU MI308X of the same target ID), and the example call evaluates
            ``device.cu_count`` at N. Without it the example uses the target's usual count
            (:func:`flyship.bundle.targets.example_cu_count`).
        targets: build this specialization only for these processors (``("gfx950",)``: a kernel that needs
            gfx950's 160 KiB of LDS); empty: for every ``--arch`` its frontend builds for.
        strides: input tensor -> example strides in elements (default: row-major contiguous). A FlyDSL
            kernel folds the unit-stride dim into its code, so a column-major example (``w.t()``: shape
            ``(N, K)``, strides ``(1, N)``) builds code, and a guard, for exactly that layout.
        per_target: target (a processor, ``"gfx942"``, or a full target ID) -> what differs there, as a dict
            of the fields above (``dtypes``, ``shapes``, ``scalars``, ``constexprs``, ``constraints``,
            ``options``, ``allow_scratch``, ``cu_count``, ``strides``): dict fields are merged key by key over
            the spec's own, ``constraints`` are added to the spec's, the others replace it. fp8 is
            ``float8_e4m3fnuz`` on gfx942 and ``float8_e4m3fn`` on gfx950::

                Spec("fp8", dtypes={"x": "float8_e4m3fnuz"}, shapes={"x": (256, 1024)},
                     per_target={"gfx950": dict(dtypes={"x": "float8_e4m3fn"})})

            Where the guards of the targets differ, the manifest holds one specialization per guard
            (``fp8__gfx942``, ``fp8__gfx950``), each with its own variants (docs/spec-api.md).
    """

    name: str
    dtypes: dict[str, str]
    shapes: dict[str, tuple[int, ...]]
    scalars: dict[str, Any] = dataclasses.field(default_factory=dict)
    constexprs: dict[str, Any] = dataclasses.field(default_factory=dict)
    constraints: tuple[str, ...] = ()
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    allow_scratch: bool = False
    cu_count: Optional[int] = None
    targets: tuple[str, ...] = ()
    strides: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    per_target: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # ("x.shape[1] <= 8192") without the trailing comma is a string, not a tuple: say so.
        if isinstance(self.constraints, str):
            raise SpecError(f"Spec {self.name!r}: constraints must be a tuple of expressions, got the string "
                            f"{self.constraints!r}; write constraints=({self.constraints!r},) (note the comma)")
        for field in ("dtypes", "shapes", "scalars", "constexprs", "options", "strides"):
            if not isinstance(getattr(self, field), dict):
                raise SpecError(f"Spec {self.name!r}: {field} must be a dict, got "
                                f"{type(getattr(self, field)).__name__}")
        if isinstance(self.targets, str):
            raise SpecError(f"Spec {self.name!r}: targets must be a tuple of processors, got the string "
                            f"{self.targets!r}; write targets=({self.targets!r},) (note the comma)")
        for t in self.targets:
            try:
                _targets.check_known(t)
            except Exception as e:
                raise SpecError(f"Spec {self.name!r}: targets: {e}") from None
        if self.cu_count is not None:
            if isinstance(self.cu_count, bool) or not isinstance(self.cu_count, int) or self.cu_count < 1:
                raise SpecError(f"Spec {self.name!r}: cu_count must be a positive int (the device's compute units "
                                f"the kernel bakes in), got {self.cu_count!r}")
            guard = f"device.cu_count == {self.cu_count}"
            if guard not in self.constraints:  # the baked-in value becomes a guard on the device
                object.__setattr__(self, "constraints", (*tuple(self.constraints), guard))
        self._check_per_target()

    def _check_per_target(self) -> None:
        if not isinstance(self.per_target, dict):
            raise SpecError(f"Spec {self.name!r}: per_target must be a dict of target -> dict(...), got "
                            f"{type(self.per_target).__name__}")
        for key, over in self.per_target.items():
            where = f"Spec {self.name!r}: per_target[{key!r}]"
            try:
                tid = _targets.check_known(key)
            except Exception as e:
                raise SpecError(f"{where}: {e}") from None
            if not isinstance(over, dict):
                raise SpecError(f"{where}: expected a dict of Spec fields (dict(dtypes=...)), got "
                                f"{type(over).__name__}")
            bad = sorted(set(over) - set(PER_TARGET_FIELDS))
            if bad:
                raise SpecError(f"{where}: {bad} cannot vary per target; it takes {', '.join(PER_TARGET_FIELDS)}")
            if "cu_count" in over and self.cu_count is not None:
                raise SpecError(f"{where}: cu_count is given for the whole spec ({self.cu_count}) and per target; "
                                "give it in one place")
            if self.targets and not admits(self.targets, tid):
                raise SpecError(f"{where}: the spec is limited to targets={self.targets}, which never includes "
                                f"{key}; add it to targets= or remove the entry (it would never be built)")

    def for_target(self, target: str) -> "Spec":
        """This spec as built for ``target``: its ``per_target`` entry for the full target ID, else for the
        processor, merged over the spec's own fields (dicts key by key, constraints added); the spec itself
        when no entry applies."""
        over = self.override_for(target)
        if over is None:
            return self
        fields: dict[str, Any] = {}
        for k, v in over.items():
            base = getattr(self, k)
            if isinstance(base, dict):
                fields[k] = {**base, **v}
            elif k == "constraints":
                if isinstance(v, str):
                    raise SpecError(f"Spec {self.name!r}: per_target constraints must be a tuple of expressions, got "
                                    f"the string {v!r}; write ({v!r},)")
                fields[k] = (*self.constraints, *tuple(v))
            else:
                fields[k] = v
        return dataclasses.replace(self, per_target={}, **fields)

    def override_for(self, target: str) -> Optional[dict[str, Any]]:
        """The ``per_target`` entry that applies to ``target`` (its full ID first, then its processor)."""
        if target in self.per_target:
            return self.per_target[target]
        return self.per_target.get(target.split(":")[0])

    def resolved(self) -> list[tuple[Optional[str], "Spec"]]:
        """``(None, the spec for targets no entry names)`` when such targets can exist, then
        ``(key, the spec for that per_target key)`` for each entry: every form the spec can be built in."""
        out: list[tuple[Optional[str], Spec]] = []
        keys = list(self.per_target)
        base_used = not self.targets or any(
            not any(admits((k,), _targets.parse_target(t)) for k in keys) for t in self.targets)
        if base_used:
            out.append((None, self))
        return out + [(k, self.for_target(k)) for k in keys]


# The Spec fields a per_target entry may give.
PER_TARGET_FIELDS = ("dtypes", "shapes", "scalars", "constexprs", "constraints", "options", "allow_scratch",
                     "cu_count", "strides")


def admits(limited_to: tuple[str, ...], t: _targets.TargetID) -> bool:
    """Whether a spec limited to ``limited_to`` (processors, or full target IDs; empty: all) builds for ``t``."""
    if not limited_to:
        return True
    wants = [_targets.parse_target(w) for w in limited_to]
    return any(w.processor == t.processor and (w.text == w.processor or w.text == t.text) for w in wants)
