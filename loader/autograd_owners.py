"""Who else holds an incoming gradient: may a backward kernel overwrite it in place?

A backward op that consumes an incoming gradient (RoPE's backward rotates ``dq`` in place) may take the tensor
autograd hands it only when nothing else holds it. Two kinds of holder exist:

* C++ holders (another node's input buffer, when one gradient feeds two nodes; a saved variable; a ``.grad``
  field): each owns the tensor and shows in ``Tensor._use_count()``; a view shares the storage and shows in the
  storage's use count;
* Python holders of the *same Python object* (a tensor hook that keeps ``g`` in a list, a user's Function that
  returns a tensor it also keeps, a gradient the caller passed to ``backward``): they all share the one Python object
  torch keeps per tensor, so they show in no tensor or storage count, only in that object's reference count.

What each count is for a gradient nobody else holds, at the first line of a backward, is fixed by the call path torch
takes to get there (its engine, its C++ node, ``BackwardCFunction.apply``, the generated Function's ``backward``),
and differs between torch versions (the engine's own reference: 2.11 keeps it during the call, 2.13 does not). So it
is measured, not assumed: once per process, a probe op goes through the very same path (:func:`baseline`) with a
gradient nobody holds, and a later gradient with any count above the probe's has another holder. A probe that cannot
run, or runs that disagree, give no baseline: every incoming gradient then counts as held and the backward copies it
(correct, slower).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

Counts = tuple[int, int, int]  # (Python references, tensor use count, storage use count) of one gradient
# Path kind -> the counts of a fresh incoming gradient at the backward's first line (None: could not be measured).
_BASELINE: dict[str, Counts | None] = {}
_LOCK = threading.Lock()
_PROBE_LIB: list[Any] = []  # keeps the probe's torch.library fragment alive


def references(grads: tuple[Any, ...]) -> tuple[Counts | None, ...]:
    """Each gradient's counts (None for a gradient that is not a plain tensor), as seen from this call: the first
    statement of a backward calls it with the backward's own ``grads`` tuple, in the probe and in the real path alike."""
    import torch

    return tuple((sys.getrefcount(g), g._use_count(), torch._C._storage_Use_Count(g.untyped_storage()._cdata))
                 if type(g) is torch.Tensor else None for g in grads)


def held(counts: tuple[Counts | None, ...], kind: str) -> frozenset[int]:
    """Indexes of the gradients (by ``counts`` from :func:`references`) that something else may hold: a count above
    the path's baseline, a gradient that is not a plain tensor, or every index when the path has no baseline."""
    if all(c is None for c in counts):  # traced (torch.compile's fake/functional tensors): never handed over
        return frozenset(range(len(counts)))
    base = baseline(kind)
    return frozenset(i for i, c in enumerate(counts)
                     if base is None or c is None or any(x > b for x, b in zip(c, base)))


def baseline(kind: str) -> Counts | None:
    """The counts of an incoming gradient nobody else holds, on the path ``kind`` (``"generated"``: torch's
    generated autograd Function calling a bound ``backward(self, ctx, *grads)``; ``"function"``: a
    ``torch.autograd.Function`` whose static ``backward(ctx, *grads)`` is ours)."""
    if kind not in _BASELINE:
        with _LOCK:
            if kind not in _BASELINE:
                try:
                    _BASELINE[kind] = _PROBES[kind]()
                except Exception:  # noqa: BLE001 - a probe torch does not allow: no baseline, always copy
                    _BASELINE[kind] = None
    return _BASELINE[kind]


def _agreed(seen: list[Counts | None]) -> Counts | None:
    """The probe's counts when its two runs agree (a count that moves between runs proves nothing)."""
    return seen[0] if len(seen) == 2 and seen[0] is not None and seen[0] == seen[1] else None


def _run_twice(step: Callable[[], None]) -> None:
    import torch

    with torch.enable_grad():
        for _ in range(2):
            step()


def _probe_generated() -> Counts | None:
    import torch
    from torch._library.autograd import Info, make_autograd_impl

    seen: list[Counts | None] = []

    class Probe:  # the shape of flyship.loader.autograd._Rule's backward: a bound method taking *grads
        def backward(self, ctx: Any, *grads: Any, held: Any = None) -> tuple[Any, ...]:
            counts = references(grads)
            seen.append(counts[0])
            return (None,)

        def setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            pass

    lib = torch.library.Library("flyship_gradprobe", "FRAGMENT")
    _PROBE_LIB.append(lib)
    lib.define("probe(Tensor x) -> Tensor")
    lib.impl("probe", lambda x: x * 2, "CPU")
    overload = torch.ops.flyship_gradprobe.probe.default
    p = Probe()
    lib.impl("probe", make_autograd_impl(overload, Info(p.backward, p.setup_context)), "AutogradCPU",
             with_keyset=True)

    def step() -> None:
        x = torch.ones(4, requires_grad=True)
        (overload(x) * torch.full((4,), 3.0)).sum().backward()  # the incoming gradient: MulBackward's fresh tensor

    _run_twice(step)
    return _agreed(seen)


def _probe_function() -> Counts | None:
    import torch

    seen: list[Counts | None] = []

    def forward(ctx: Any, x: Any) -> Any:
        return x * 2

    def backward(ctx: Any, *grads: Any) -> Any:
        counts = references(grads)
        seen.append(counts[0])
        return None

    probe = type("flyship_gradprobe", (torch.autograd.Function,),
                 {"forward": staticmethod(forward), "backward": staticmethod(backward)})

    def step() -> None:
        x = torch.ones(4, requires_grad=True)
        (probe.apply(x) * torch.full((4,), 3.0)).sum().backward()

    _run_twice(step)
    return _agreed(seen)


_PROBES: dict[str, Callable[[], Counts | None]] = {"generated": _probe_generated, "function": _probe_function}
