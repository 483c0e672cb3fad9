"""Prove the routing: per process, each patched site's calls to the op and to the original, per reason.

A dispatcher that silently sends everything to the fallback is the most common false win, so the summary
puts that case first: ``routing_report()`` returns it as a dict; ``FLYSHIP_REPORT=1`` prints it to
stderr when the process exits, tagged with its rank (``RANK`` / ``WORLD_SIZE``, as torchrun sets them).

    flyship routing [rank 1/2, pid 4242]: 1 patched site
      model:RMSNorm.forward -> flyship_triton::rmsnorm  ROUTED  120 to op, 8 to original
          to original: 8 cpu tensors
          op: launches f32_n1024=120; fallbacks none
          compiled (default): 0.4003 ms patched vs 0.3336 ms compiled alone: FUSION LOST, +66.7 us per call;
            leave these sites to torch.compile (patch(..., compiled="original"))

A bench that races compiled arms records what it measured for the sites it patched (:func:`note_compiled`), so
the report says, per site, whether routing it to the op wins or loses inside a compiled graph and by how much.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any

from flyship import env

_errors_lock = threading.Lock()
_errors: list[str] = []
# Every patch applied in this process (flyship.loader.tools.patch registers each here on its first apply): the sites
# the report covers. Kept here, not in patch.py, so the report needs nothing from the module that patches.
_registry_lock = threading.Lock()
_registry: list[Any] = []


def register(patch: Any) -> None:
    """Remember a patch (once) for :func:`patches` and the routing report."""
    with _registry_lock:
        if patch not in _registry:
            _registry.append(patch)


def patches() -> list[Any]:
    """Every patch made in this process (active or undone), in the order they were applied."""
    with _registry_lock:
        return list(_registry)


_compiled_lock = threading.Lock()
# target -> mode -> {"patched_s", "alone_s", "sites"}: compiled-arm timings recorded by a bench (note_compiled).
_compiled: dict[str, dict[str, dict[str, Any]]] = {}


def note_compiled(targets: list[str], mode: str, patched_s: float, alone_s: float) -> None:
    """Record a race of one compiled callable with ``targets`` patched (``patched_s`` seconds per call) against the
    same callable compiled alone (``alone_s``), under torch.compile ``mode``; the routing report shows it for each
    of those sites (timed together: the cost is the sites', jointly)."""
    entry = {"patched_s": float(patched_s), "alone_s": float(alone_s), "sites": sorted(targets)}
    with _compiled_lock:
        for t in targets:
            _compiled.setdefault(t, {})[mode] = entry


def _compiled_lines(site: dict[str, Any]) -> list[str]:
    lines = []
    for mode, c in site.get("compiled", {}).items():
        delta_us = (c["patched_s"] - c["alone_s"]) * 1e6
        lost = delta_us > 0
        jointly = f" (with {len(c['sites']) - 1} other sites)" if len(c["sites"]) > 1 else ""
        lines.append(f"      compiled ({mode}): {c['patched_s'] * 1e3:.4f} ms patched{jointly} vs "
                     f"{c['alone_s'] * 1e3:.4f} ms compiled alone: "
                     + (f"FUSION LOST, +{delta_us:.1f} us per call; leave {'these sites' if jointly else 'this site'} "
                        "to torch.compile (patch(..., compiled=\"original\"))" if lost
                        else f"wins, {-delta_us:.1f} us per call"))
    return lines


def note_error(message: str) -> None:
    """Record a patch that could not be applied (the hook does this), so the summary shows it."""
    with _errors_lock:
        _errors.append(message)


def _verdict(to_op: int, to_original: int) -> str:
    if to_op == 0 and to_original == 0:
        return "NO CALLS"
    if to_op == 0:
        return "ALL TO ORIGINAL"
    return "ROUTED" if to_original == 0 else "PARTLY ROUTED"


def routing_report() -> dict[str, Any]:
    """This process's routing summary.

    Returns:
        ``{"rank": int | None, "world_size": int | None, "pid": int, "sites": [{"target", "op", "active",
        "to_op", "to_original": {reason: n}, "verdict", "op_stats", "compiled"}], "errors": [str]}``; ``verdict``
        is one of ``ROUTED``, ``PARTLY ROUTED``, ``ALL TO ORIGINAL``, ``NO CALLS``; ``op_stats`` is the op's
        :meth:`~flyship.loader.OpHandle.stats` (it also counts calls from compiled graphs); ``compiled`` is
        ``{mode: {"patched_s", "alone_s", "sites"}}`` from :func:`note_compiled` (empty when nothing was raced).
    """
    sites = []
    for p in patches():
        s = p.stats()
        s["verdict"] = _verdict(s["to_op"], sum(s["to_original"].values()))
        s["op_stats"] = p.op.stats()
        with _compiled_lock:
            s["compiled"] = {m: dict(c) for m, c in _compiled.get(s["target"], {}).items()}
        sites.append(s)
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    with _errors_lock:
        errors = list(_errors)
    return {"rank": int(rank) if rank is not None else None, "world_size": int(world) if world is not None else None,
            "pid": os.getpid(), "sites": sites, "errors": errors}


def format_report(report: dict[str, Any]) -> str:
    """The summary as text, one screen."""
    rank = f"rank {report['rank']}/{report['world_size']}" if report["rank"] is not None else "no rank"
    n = len(report["sites"])
    lines = [f"flyship routing [{rank}, pid {report['pid']}]: {n} patched site{'s' if n != 1 else ''}"]
    for s in report["sites"]:
        n_orig = sum(s["to_original"].values())
        lines.append(f"  {s['target']} -> {s['op']}  {s['verdict']}  {s['to_op']} to op, {n_orig} to original"
                     f"{'' if s['active'] else ' (undone)'}")
        if s["to_original"]:
            top = sorted(s["to_original"].items(), key=lambda kv: -kv[1])
            shown = "; ".join(f"{v} {k}" for k, v in top[:4])
            shown += f"; {len(top) - 4} more reasons" if len(top) > 4 else ""
            lines.append(f"      to original: {shown}")
        st = s["op_stats"]
        launches = ", ".join(f"{k}={v}" for k, v in st["launches"].items() if v) or "none"
        fallbacks = ", ".join(f"{v} {k}" for k, v in st["fallbacks"].items()) or "none"
        original = f"; {st['original']} to the reference on purpose (tuned: the original wins)" \
            if st.get("original") else ""
        lines.append(f"      op: launches {launches}; fallbacks {fallbacks}{original}")
        lines.extend(_compiled_lines(s))
    for e in report["errors"]:
        lines.append(f"  NOT PATCHED: {e}")
    return "\n".join(lines)


def _print_at_exit() -> None:
    if env.report():
        print(format_report(routing_report()), file=sys.stderr, flush=True)


atexit.register(_print_at_exit)
