"""Prove the routing: per process, each patched site's calls to the op and to the original, per reason.

A dispatcher that silently sends everything to the fallback is the most common false win, so the summary
puts that case first: ``routing_report()`` returns it as a dict; ``FLYSHIP_REPORT=1`` prints it to
stderr when the process exits, tagged with its rank (``RANK`` / ``WORLD_SIZE``, as torchrun sets them).

    flyship routing [rank 1/2, pid 4242]: 1 patched site
      model:RMSNorm.forward -> flyship_triton::rmsnorm  ROUTED  120 to op, 8 to original
          to original: 8 cpu tensors
          op: launches f32_n1024=120; fallbacks none
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
        "to_op", "to_original": {reason: n}, "verdict", "op_stats"}], "errors": [str]}``; ``verdict`` is one
        of ``ROUTED``, ``PARTLY ROUTED``, ``ALL TO ORIGINAL``, ``NO CALLS``; ``op_stats`` is the op's
        :meth:`~flyship.loader.OpHandle.stats` (it also counts calls from compiled graphs).
    """
    sites = []
    for p in patches():
        s = p.stats()
        s["verdict"] = _verdict(s["to_op"], sum(s["to_original"].values()))
        s["op_stats"] = p.op.stats()
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
    for e in report["errors"]:
        lines.append(f"  NOT PATCHED: {e}")
    return "\n".join(lines)


def _print_at_exit() -> None:
    if env.report():
        print(format_report(routing_report()), file=sys.stderr, flush=True)


atexit.register(_print_at_exit)
