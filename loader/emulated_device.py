"""The emulated device: what each launch of the ``emulate`` flavor runs (``FLYSHIP_FLAVOR=emulate``).

The C++ core takes a call on CPU tensors the real way (bind -> guards -> allocate -> grid -> pack kernargs ->
launch); its driver shim (csrc/driver_emulate.cpp) hands each launch here: the code object, the kernel's symbol,
grid (workgroups), block, dynamic LDS bytes, the kernarg bytes, and the memory the launch may touch (one region per
tensor, workspace and scratch buffer the kernargs point at, each the extent its sizes and strides span). The launch
runs on flyship's CDNA emulator (:mod:`flyship.loader.emulate`) over exactly those regions: an access outside them,
an instruction the emulator does not model, scratch or a trap fails the launch, and the op call raises with the
emulator's words (csrc/launch.cpp puts the op, kernel, target, grid and block around them). Nothing here stands in
for the emulator: with no :mod:`flyship.loader.emulate` installed, every launch fails saying so.

Which device is emulated: ``describe(target)`` (gfx942 unless set; gfx950 too), read by a bundle at its first call on
device 0. The wave order between barriers is :func:`schedule` (``"forward"`` unless set); running a call in both
orders and comparing the outputs finds LDS races (``flyship verify --emulate``). :func:`stats` totals what ran.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Sequence

from flyship.bundle.frozen import frozen
from flyship.errors import ConfigError

SCHEDULES = ("forward", "reverse", "serial")  # flyship.loader.emulate.kernel.SCHEDULES
DEFAULT_TARGET = "gfx942:sramecc+:xnack-"


@frozen
class LaunchStats:
    """What one emulated launch ran (from the emulator's RunStats)."""

    symbol: str
    target: str
    schedule: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    instructions: int
    waves: int
    seconds: float
    lds_conflicts: tuple[int, ...] = ()  # LDS byte addresses two waves touched with no barrier between (a race)


class _State(threading.local):
    def __init__(self) -> None:
        self.schedule = "forward"
        self.log: list[LaunchStats] | None = None


_state = _State()


@contextlib.contextmanager
def schedule(order: str) -> Iterator[None]:
    """Run the launches of this thread inside the block with waves of a workgroup ordered ``order`` between
    barriers: ``"forward"`` / ``"reverse"`` (lockstep, wave 0 or the last wave first) or ``"serial"`` (one wave at a
    time, the last first). A result that changes with the order is a race."""
    if order not in SCHEDULES:
        raise ConfigError(f"emulated_device.schedule: expected one of {', '.join(SCHEDULES)}, got {order!r}")
    before, _state.schedule = _state.schedule, order
    try:
        yield
    finally:
        _state.schedule = before


@contextlib.contextmanager
def stats() -> Iterator[list[LaunchStats]]:
    """Collect a :class:`LaunchStats` per launch this thread runs inside the block (oldest first)."""
    before, _state.log = _state.log, []
    try:
        yield _state.log
    finally:
        _state.log = before


def merge_regions(regions: Sequence[tuple[int, int, bool, str]]) -> list[tuple[int, int, bool, str]]:
    """Regions as (address, nbytes, writable, name), overlapping ones merged into one (a tensor passed twice, or an
    output that is a view of an input): writable when any part is, named after all; empty ones dropped. Sorted by
    address."""
    spans = sorted((int(a), int(n), bool(w), str(name)) for a, n, w, name in regions if int(n) > 0)
    out: list[list[Any]] = []
    for a, n, w, name in spans:
        if out and a < out[-1][0] + out[-1][1]:
            last = out[-1]
            last[1] = max(last[0] + last[1], a + n) - last[0]
            last[2] = last[2] or w
            if name not in last[3].split("+"):
                last[3] += "+" + name
        else:
            out.append([a, n, w, name])
    return [tuple(r) for r in out]  # type: ignore[misc]


def launch(*, image: bytes, symbol: str, grid: Sequence[int], block: Sequence[int], dynamic_lds: int,
           kernargs: bytes, regions: Sequence[tuple[int, int, bool, str]], device: int, target: str) -> None:
    """Run one launch on the emulator (called by csrc/driver_emulate.cpp with the GIL held); raises what the emulator
    raises (flyship.loader.emulate.EmulationError), which fails the launch with its message."""
    from flyship.loader import emulate  # the emulator core (numpy); imported at the first launch only

    memory = emulate.Memory()
    for address, nbytes, writable, name in merge_regions(regions):
        memory.add(address, nbytes, writable=writable, name=name)
    order = _state.schedule
    result = emulate.run(image, symbol, grid=tuple(grid), block=tuple(block), dynamic_lds=int(dynamic_lds),
                         kernargs=bytes(kernargs), memory=memory, schedule=order, target=target)
    if _state.log is not None:
        _state.log.append(LaunchStats(symbol, target, order, tuple(grid), tuple(block),  # type: ignore[arg-type]
                                      result.instructions, result.waves, result.seconds, tuple(result.lds_conflicts)))


def install(ext: Any) -> None:
    """Register :func:`launch` as the emulate extension's launch (once per process).

    Raises:
        ConfigError: this Python has no numpy (the emulator runs a wavefront's 64 lanes on numpy arrays): said once,
            here, rather than as every launch's failure.
    """
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise ConfigError("the emulated device: expected numpy in this Python (the emulator runs a wavefront's 64 "
                          "lanes on numpy arrays), found none; pip install numpy (or \".[emulate]\" from a checkout)"
                          ) from None
    if not ext.has_emulator():
        ext.set_emulator(launch)


def describe(ext: Any, target: str = DEFAULT_TARGET, *, device: int = 0, max_shared_per_block: int | None = None,
             cu_count: int = 304) -> None:
    """Describe the emulated device ``device``: its target ID (``gfx942``, ``gfx950``, with or without features) and
    limits. LDS defaults to what the target has (64 KiB on gfx942, 160 KiB on gfx950). A bundle reads a device once,
    at its first call there: describe it before loading."""
    from flyship.loader.emulate.kernel import MODELLED_TARGETS  # the one list of what the emulator models

    base = target.split(":", 1)[0]
    if base not in MODELLED_TARGETS:
        raise ConfigError(f"emulated_device.describe: expected a target the emulator models "
                          f"({', '.join(MODELLED_TARGETS)}), got {target!r}; it runs CDNA code objects only")
    if max_shared_per_block is None:
        max_shared_per_block = 160 * 1024 if base == "gfx950" else 64 * 1024
    ext.set_emulated_device(device, target, max_shared_per_block=max_shared_per_block, cu_count=cu_count)
