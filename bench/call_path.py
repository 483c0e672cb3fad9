"""Per-call host cost of flyship's op on the recording driver, stage by stage, beside torch's own CPU ops.

    FLYSHIP_FLAVOR=record python bench/call_path.py [--bundle tests/loader/data/tiny] [--out DIR]

No GPU: the recording driver (``FLYSHIP_FLAVOR=record``) runs the same C++ path as a GPU flavor on CPU tensors
(dispatcher, argument binding, guards, output allocation, kernarg packing) and records the launch instead of
making it. Each stage is timed as a path that stops after it, so the differences between rows are the stages'
costs:

* ``dispatch()`` (pybind11, no torch dispatcher): binding and guard evaluation (decide) only;
* ``.out`` through ``torch.ops``: + the torch dispatcher (boxed kernel), kernarg packing and the recorded launch;
* the allocating op through ``torch.ops``: + output allocation and torch's autograd fallback on the functional op;
* ``torch.empty_like``: what one output allocation costs through torch alone;
* ``torch.ops.aten.add``: torch's own op through the same Python layer as ``torch.ops.<ns>.add``; the ``._op``
  rows: our op without that layer (the OpOverload's C++ callable), so the layer's cost is the difference;
* the handles ``ops.add(...)`` / ``ops.add.out(...)`` and flyship's ``torch.ops`` objects: the fast entry
  (csrc/fast_call.cpp, csrc/torch_op_call.cpp), the same C++ path without torch.ops' Python frames, argument
  boxing, dispatcher and autograd kernel; the ``(torch's own __call__)`` rows time the same objects through
  torch's ``OpOverloadPacket`` / ``OpOverload.__call__``, what they cost unpatched. The targets table at the end
  gives each target as the median of per-round ratios.

The recording driver appends every launch to a log: the log is cleared between rounds and its append (a few
hundred ns) stands in for the driver's launch call. Rounds are interleaved (every path once per round); the
table shows medians per call. CPU figures say where the time goes, not what a GPU path costs: on a GPU
``bench/launch_overhead.py`` measures the same paths against ``torch.add`` and Triton's launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]


def us_per_call(paths: list[tuple[str, Callable[[], Any]]], calls: int, repeats: int,
                between: Callable[[], Any]) -> dict[str, list[float]]:
    """Microseconds per call of each path, ``repeats`` interleaved rounds; ``between`` runs before each timing."""
    for _, fn in paths:
        for _ in range(200):
            fn()
    out: dict[str, list[float]] = {name: [] for name, _ in paths}
    for _ in range(repeats):
        for name, fn in paths:
            between()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out[name].append((time.perf_counter() - t0) / calls * 1e6)
    return out


# Issue 24's targets for the torch.ops surface: (path, against, at most).
TARGETS = [
    ("torch.ops.<ns>.add(x, y)", "torch.add(x, y)", 1.0),
    ("torch.ops.<ns>.add.default(x, y)", "torch.add(x, y)", 1.0),
    ("torch.ops.<ns>.add.out(x, y, out=o)", "torch.add(x, y, out=o)", 0.95),
    ("ops.add(x, y) (fast entry)", "torch.add(x, y)", 1.0),
]


def targets_table(times: dict[str, list[float]]) -> list[str]:
    """The targets as medians of per-round ratios, each beside the same ratio through torch's own ``__call__``."""
    lines = ["", "| target | fast | torch's own `__call__` | at most | met |", "| --- | ---: | ---: | ---: | --- |"]
    for path, against, most in TARGETS:
        def ratio(p: str) -> Optional[float]:
            if p not in times:
                return None
            return statistics.median(a / b for a, b in zip(times[p], times[against]))

        fast, own = ratio(path), ratio(f"{path} (torch's own __call__)")
        shown = "n/a" if own is None else f"{own:.2f}"
        lines.append(f"| {path} / {against} | {fast:.2f} | {shown} | {most} | {'yes' if fast <= most else '**no**'} |")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=ROOT / "tests" / "loader" / "data" / "tiny")
    ap.add_argument("--target", default="gfx942:sramecc+:xnack-", help="the recorded device's target ID")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None, help="write call_path.json and call_path.md here")
    args = ap.parse_args(argv)

    os.environ["FLYSHIP_FLAVOR"] = "record"
    import torch

    import flyship
    from flyship.loader import extension

    ext = extension.extension("record")
    ext.set_recorded_device(0, args.target)
    t = time.perf_counter()
    ops = flyship.load(args.bundle, namespace=f"flyship_bench_{uuid.uuid4().hex[:8]}")
    load_ms = (time.perf_counter() - t) * 1e3
    x, y = torch.randn(4096), torch.randn(4096)
    o = torch.empty_like(x)
    ops.add(x, y)  # first call: device state, variant choice, code object checked and loaded
    packet = ops.add.packet
    raw, raw_out = packet.default._op, packet.out._op
    own_packet, own = torch._ops.OpOverloadPacket.__call__, torch._ops.OpOverload.__call__
    paths = [
        ("torch.add(x, y)", lambda: torch.add(x, y)),
        ("torch.add(x, y, out=o)", lambda: torch.add(x, y, out=o)),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("ops.add.dispatch(x, y) (bind + guards, pybind11)", lambda: ops.add.dispatch(x, y, target=args.target)),
        # flyship's torch.ops objects: the fast entry (loader/torchops.py), and torch's own __call__ of the same
        # objects, what the call costs unpatched
        ("torch.ops.<ns>.add.out(x, y, out=o)", lambda: packet.out(x, y, out=o)),
        ("torch.ops.<ns>.add.default(x, y)", lambda: packet.default(x, y)),
        ("torch.ops.<ns>.add(x, y)", lambda: packet(x, y)),
        ("torch.ops.<ns>.add.out(x, y, out=o) (torch's own __call__)", lambda: own(packet.out, x, y, out=o)),
        ("torch.ops.<ns>.add.default(x, y) (torch's own __call__)", lambda: own(packet.default, x, y)),
        ("torch.ops.<ns>.add(x, y) (torch's own __call__)", lambda: own_packet(packet, x, y)),
        # torch's own op through the same Python layer (OpOverloadPacket / OpOverload.__call__), and ours without
        # it (the OpOverload's C++ callable): what that layer costs, ours or aten's alike
        ("torch.ops.aten.add(x, y)", lambda: torch.ops.aten.add(x, y)),
        ("torch.ops.aten.add.out(x, y, out=o)", lambda: torch.ops.aten.add.out(x, y, out=o)),
        ("torch.ops.<ns>.add.default._op(x, y) (no Python layer)", lambda: raw(x, y)),
        ("torch.ops.<ns>.add.out._op(x, y, out=o) (no Python layer)", lambda: raw_out(x, y, out=o)),
        ("ops.add(x, y) (fast entry)", lambda: ops.add(x, y)),
        ("ops.add.out(x, y, out=o) (fast entry)", lambda: ops.add.out(x, y, out=o)),
    ]
    with torch.no_grad():
        nograd = us_per_call([("torch.ops.<ns>.add.default(x, y), no_grad (torch's own __call__)",
                               lambda: own(packet.default, x, y))],
                             args.calls, args.repeats, lambda: ext.recorded_launches(clear=True))
    times = us_per_call(paths, args.calls, args.repeats, lambda: ext.recorded_launches(clear=True))
    counts = [ext.fast_call_counts(h) for h in (ops.add, ops.add.out, packet, packet.default, packet.out)]
    if any(c["dispatcher"] for c in counts):
        raise SystemExit(f"call_path: the fast entry handed calls to torch's path: {counts}")
    times.update(nograd)
    ext.recorded_launches(clear=True)
    base = statistics.median(times["torch.add(x, y)"])
    base_out = statistics.median(times["torch.add(x, y, out=o)"])
    # each path against its torch counterpart in the same run: out= paths against torch.add(out=)
    rows = [{"path": k, "us": statistics.median(v), "min": min(v), "x_torch_add": statistics.median(v) / base,
             "x_torch": statistics.median(v) / (base_out if "out=" in k else base)} for k, v in times.items()]
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": platform.node(), "cpu": platform.processor(),
            "python": sys.version.split()[0], "torch": torch.__version__, "flavor": ops.flavor, "calls": args.calls,
            "repeats": args.repeats, "load_ms": load_ms}
    lines = [f"call path on the recording driver ({meta['date']}, torch {meta['torch']}, Python {meta['python']}, "
             f"{args.calls} calls x {args.repeats} rounds; load {load_ms:.1f} ms)", "",
             "| path | us/call (median) | min | x `torch.add` | x `torch.add` (out= rows: x `torch.add(out=)`) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['path']} | {r['us']:.2f} | {r['min']:.2f} | {r['x_torch_add']:.2f} | {r['x_torch']:.2f} |"
              for r in rows]
    lines += targets_table(times)
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "call_path.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        (args.out / "call_path.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
