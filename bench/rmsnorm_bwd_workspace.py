"""RMSNorm backward with a ``(device.cu_count, N)`` workspace: flyship's op against Triton's own JIT launch of the
same two kernels (issue 23: "on the H200 the aligned backward runs at the JIT's speed", ratio <= 1.02).

    python3 bench/rmsnorm_bwd_workspace.py --bundle artifacts/workspaces --out /tmp/out

The bundle is ``flyc-build examples/triton/workspaces.py -o artifacts/workspaces --arch sm_90`` (no hints in the
spec: its first specialization is what Triton's JIT builds for aligned inputs); without one the bench builds it
for this GPU (needs Triton). Per dtype, at Llama-3-8B rows (``cu_count x 32`` tokens x 4096 hidden: 4224 on an
H200), both paths run ``calls`` back-to-back calls per round, timed with CUDA events (GPU time, launches and
host time included alike), in ``repeats`` interleaved rounds; the table shows the median per call and the ratio
flyship / Triton. Which specialization ran is read from the op's stats (the JIT variant, not the generic one).
Writes ``rmsnorm_bwd_workspace.json`` and ``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def bundle_for_this_gpu(path: Path, out: Path) -> Path:
    if (path / "manifest.json").is_file():
        return path
    import torch

    major, minor = torch.cuda.get_device_capability()
    built = out / "workspaces-bundle"
    subprocess.run([sys.executable, "-m", "flyship.compiler.cli", str(ROOT / "examples/triton/workspaces.py"),
                    "-o", str(built), "--arch", f"sm_{major}{minor}", "--no-cache", "--force"], check=True,
                   cwd=str(ROOT))
    return built


def time_rounds(paths: dict[str, Callable[[], Any]], calls: int, repeats: int) -> dict[str, list[float]]:
    """Microseconds per call of each path, one list entry per round (every path once per round, interleaved)."""
    import torch

    per: dict[str, list[float]] = {k: [] for k in paths}
    for fn in paths.values():  # warm up: code objects loaded, Triton's cache filled, allocator primed
        fn()
    torch.cuda.synchronize()
    for _ in range(repeats):
        for name, fn in paths.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            per[name].append(start.elapsed_time(end) * 1000.0 / calls)
    return per


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default=str(ROOT / "artifacts" / "workspaces"))
    p.add_argument("--out", default="/tmp/flyship-rmsnorm-bwd-bench")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--repeats", type=int, default=15)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    import flyship

    sys.path.insert(0, str(ROOT / "examples" / "triton"))
    from tl_rmsnorm_bwd import launch_with_triton

    ops = flyship.load(bundle_for_this_gpu(Path(a.bundle), out))
    ops.fallback = False
    cu = torch.cuda.get_device_properties(0).multi_processor_count
    rows, n = cu * 32, 4096
    results, lines = [], []
    for name, dt in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        torch.manual_seed(0)
        x, dy = (torch.randn(rows, n, device="cuda").to(dt) for _ in range(2))
        w = torch.randn(n, device="cuda").to(dt)
        before = dict(ops.rmsnorm_bwd.stats()["launches"])
        per = time_rounds({"flyship": lambda: ops.rmsnorm_bwd(dy, x, w, 1e-6),
                           "triton": lambda: launch_with_triton(dy, x, w, 1e-6, cu, 4096, num_warps=8)},
                          a.calls, a.repeats)
        ran = sorted(k for k, v in ops.rmsnorm_bwd.stats()["launches"].items() if v != before.get(k, 0))
        med = {k: statistics.median(v) for k, v in per.items()}
        ratio = med["flyship"] / med["triton"]
        results.append({"dtype": name, "rows": rows, "cols": n, "cu_count": cu, "specialization": ran,
                        "us_per_call": med, "rounds": per, "ratio": ratio})
        lines.append(f"| {name} | {rows} x {n} | {', '.join(ran)} | {med['flyship']:.1f} | {med['triton']:.1f} | "
                     f"{ratio:.3f} |")
    md = "\n".join(["| dtype | x | flyship specialization | flyship us/call | Triton JIT us/call | ratio |",
                    "| --- | --- | --- | --- | --- | --- |", *lines])
    device = torch.cuda.get_device_name(0)
    (out / "rmsnorm_bwd_workspace.json").write_text(json.dumps({"device": device, "results": results}, indent=1))
    (out / "rmsnorm_bwd_workspace.md").write_text(f"{device}, {cu} SMs\n\n{md}\n")
    print(f"{device}, {cu} SMs\n\n{md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
