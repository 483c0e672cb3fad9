"""Measure a drop-in end to end, the four arms that matter: baseline, patched, baseline compiled, patched
compiled (custom kernels often win only stacked with ``torch.compile``).

    result = flyship.bench(model, x, patches=[p])
    print(result.table())

Warm-up calls (and compilation) are excluded, the arms are interleaved (one timed run of each per
repeat, in a rotating order, so drift in clocks or thermals spreads over all of them), and each arm's
time is the median over repeats. Every arm also reports how many op calls one call of ``fn`` made
(from the ops' own counters), so a "patched" arm that never reached the op shows 0 instead of a
false win.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

from flyship.errors import ConfigError

ARMS = ("baseline", "patched", "compiled", "patched+compiled")


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm's result.

    Attributes:
        name: one of :data:`ARMS`.
        times: seconds per call of ``fn``, one per repeat.
        median: the median of ``times``.
        speedup: the first arm's (the baseline's) median over this one's (above 1 is faster).
        op_calls: calls of the patched sites' ops per call of ``fn`` (launches and fallbacks alike).
    """

    name: str
    times: tuple[float, ...]
    median: float
    speedup: float
    op_calls: float


@dataclasses.dataclass(frozen=True)
class BenchResult:
    arms: tuple[Arm, ...]

    def __getitem__(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(f"no arm {name!r}; arms are {', '.join(a.name for a in self.arms)}")

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {a.name: dataclasses.asdict(a) for a in self.arms}

    def table(self) -> str:
        head = (f"{'arm':<18} {'median ms':>10} {'speedup':>8} {'op calls/call':>14}   (min..max ms over "
                f"{len(self.arms[0].times)} repeats)")
        lines = [head]
        for a in self.arms:
            lines.append(f"{a.name:<18} {a.median * 1e3:>10.4f} {a.speedup:>7.2f}x {a.op_calls:>14g}   "
                         f"({min(a.times) * 1e3:.4f}..{max(a.times) * 1e3:.4f})")
        return "\n".join(lines)


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _own_code(fn: Callable[..., Any], arm: str) -> Callable[..., Any]:
    """A trampoline with its own code object: torch.compile caches graphs per code object, so each compiled
    arm gets its own cache and the patched and unpatched traces never share one."""

    def trampoline(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    code = trampoline.__code__.replace(co_name=f"flyship_bench_{arm.replace('+', '_')}")
    return types.FunctionType(code, trampoline.__globals__, code.co_name, None, trampoline.__closure__)


def bench(fn: Callable[..., Any], *args: Any, patches: Sequence[Any], repeats: int = 10, iters: int = 10,
          warmup: int = 3, arms: Sequence[str] = ARMS, compile_options: dict[str, Any] | None = None,
          **kwargs: Any) -> BenchResult:
    """Time ``fn(*args, **kwargs)`` in the four arms.

    Args:
        fn: the user's callable (a model, a step function).
        patches: the :class:`~flyship.loader.tools.patch.Patch` objects that make the "patched" arms; they are
            undone for the baseline arms and left as they were found at the end.
        repeats: timed runs per arm (interleaved); the median is reported.
        iters: calls of ``fn`` per timed run.
        warmup: untimed calls per arm first (compiled arms compile here).
        arms: a subset of :data:`ARMS`.
        compile_options: keyword arguments of ``torch.compile`` (e.g. ``{"mode": "max-autotune-no-cudagraphs"}``).

    Returns:
        A :class:`BenchResult`; ``.table()`` prints it.

    Raises:
        ConfigError: an unknown arm, no patches, or counts below 1.

    Example::

        print(flyship.bench(model, x, patches=[p], repeats=20).table())
    """
    import torch

    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ConfigError(f"bench: expected arms among {', '.join(ARMS)}, got {list(arms)}")
    if not patches:
        raise ConfigError("bench: expected at least one patch (flyship.patch(...)) for the patched arms, got none")
    if min(repeats, iters) < 1 or warmup < 0:
        raise ConfigError(f"bench: expected repeats >= 1, iters >= 1, warmup >= 0, got {repeats}, {iters}, {warmup}")
    was_active = [p.active for p in patches]
    ops = list({id(p.op): p.op for p in patches}.values())
    callables = {
        a: torch.compile(_own_code(fn, a), **(compile_options or {})) if "compiled" in a else fn for a in arms
    }

    def set_patched(on: bool) -> None:
        for p in patches:
            p.apply() if on else p.undo()

    def op_calls() -> int:
        return sum(op.stats()["calls"] for op in ops)

    times: dict[str, list[float]] = {a: [] for a in arms}
    calls: dict[str, int] = {a: 0 for a in arms}
    try:
        with torch.no_grad():
            for a in arms:
                set_patched(a.startswith("patched"))
                for _ in range(warmup):
                    callables[a](*args, **kwargs)
            _sync()
            for r in range(repeats):
                for k in range(len(arms)):
                    a = arms[(r + k) % len(arms)]
                    set_patched(a.startswith("patched"))
                    f = callables[a]
                    n0 = op_calls()
                    _sync()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        f(*args, **kwargs)
                    _sync()
                    times[a].append((time.perf_counter() - t0) / iters)
                    calls[a] += op_calls() - n0
    finally:
        for p, on in zip(patches, was_active):
            p.apply() if on else p.undo()
    base = statistics.median(times[arms[0]])
    result = []
    for a in arms:
        med = statistics.median(times[a])
        result.append(Arm(a, tuple(times[a]), med, base / med if med else float("inf"), calls[a] / (repeats * iters)))
    return BenchResult(tuple(result))


def bench_from_files(factory: str, patches_file: str, **options: Any) -> tuple[BenchResult, list[Any]]:
    """What ``flyship bench`` runs: the callable and inputs from ``factory``, the patches from a patches file
    (the hook's format, docs/integrate.md).

    Args:
        factory: ``"package.module:function"``; the function takes no arguments and returns
            ``(fn, args)`` or ``(fn, args, kwargs)``.
        patches_file: a patches file; each patched module is imported and its patches applied.
        options: :func:`bench`'s keyword arguments.

    Raises:
        ConfigError: the factory does not resolve or returns something else; the patches file is invalid.
    """
    import importlib

    from flyship.loader.tools import hook

    pf = hook.read_patches(patches_file)
    patches: list[Any] = []
    for module in dict.fromkeys(p.module for p in pf.patches):
        importlib.import_module(module)
        patches += hook.apply_for_module(pf.path, module)
    module_name, _, name = factory.partition(":")
    try:
        make = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"bench: expected a factory 'package.module:function', got {factory!r} ({e})") from e
    case = make()
    if not (isinstance(case, tuple) and len(case) in (2, 3) and callable(case[0])):
        raise ConfigError(f"bench: expected {factory}() to return (fn, args) or (fn, args, kwargs), got "
                          f"{type(case).__name__}")
    fn, args, kwargs = case if len(case) == 3 else (*case, {})
    return bench(fn, *args, patches=patches, **options, **kwargs), patches
