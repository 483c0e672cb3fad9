"""Cold start: how long a fresh Python takes to import flyship, load a bundle and run its first op.

    python3 bench/cold_start.py --bundle artifacts/triton --out /tmp/out

Each measurement is a new Python process (what a serving worker pays at start):

* warm: the loader's C++ extension is already built in the extension cache; medians of ``--repeats`` runs;
* first build: an empty ``FLYSHIP_EXTENSIONS_DIR`` / ``TORCH_EXTENSIONS_DIR``, so ``flyship.load`` compiles
  the extension (once per machine and torch version in real use).

Phases: ``import torch``, CUDA init (first tensor on the GPU), ``import flyship``, ``flyship.load``, the first
call of ``add`` (loads its code object, launches, synchronizes) and a second call. For comparison, Triton's
own first call of the same kernel source with an empty ``TRITON_CACHE_DIR`` (JIT compile + launcher build)
and with a warm one. Writes ``cold_start.json`` and ``cold_start.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]

FLYSHIP_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.empty(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
import flyship
t3 = time.perf_counter()
ops = flyship.load(sys.argv[1])
t4 = time.perf_counter()
x = torch.randn(4, 1024, device="cuda")
t5 = time.perf_counter()
y = ops.add(x, x); torch.cuda.synchronize()
t6 = time.perf_counter()
y = ops.add(x, x); torch.cuda.synchronize()
t7 = time.perf_counter()
assert torch.equal(y, x + x) and sum(ops.add.stats()["launches"].values()) == 2, ops.add.stats()
print(json.dumps({"import_torch": t1 - t0, "cuda_init": t2 - t1, "import_flyship": t3 - t2, "load": t4 - t3,
                  "first_call": t6 - t5, "second_call": t7 - t6, "total": (t4 - t0) + (t6 - t5)}))
"""

TRITON_CHILD = r"""
import json, sys, time
import torch
torch.empty(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
import triton
sys.path.insert(0, sys.argv[1])
from tl_elementwise import add_kernel
t1 = time.perf_counter()
x = torch.randn(4, 1024, device="cuda"); o = torch.empty_like(x)
t2 = time.perf_counter()
add_kernel[(4,)](x, x, o, x.numel(), BLOCK=1024); torch.cuda.synchronize()
t3 = time.perf_counter()
add_kernel[(4,)](x, x, o, x.numel(), BLOCK=1024); torch.cuda.synchronize()
t4 = time.perf_counter()
assert torch.equal(o, x + x)
print(json.dumps({"import_triton": t1 - t0, "first_call": t3 - t2, "second_call": t4 - t3}))
"""


def child(code: str, args: list[str], env: dict[str, str], timeout: float) -> dict[str, float]:
    """Run ``code`` in a fresh Python; its last stdout line is a JSON object of seconds."""
    e = dict(os.environ, **env)
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=e, timeout=timeout,
                       cwd=str(ROOT))
    if r.returncode != 0:
        raise RuntimeError(f"child Python failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def markdown(res: dict[str, Any]) -> str:
    warm, cold = res["flyship_warm"], res["flyship_first_build"]
    lines = [f"Cold start on {res['device']} (seconds; warm = median of {res['repeats']} fresh processes)", "",
             "| phase | warm extension cache | first build (empty cache) |", "| --- | ---: | ---: |"]
    for k in ("import_torch", "cuda_init", "import_flyship", "load", "first_call", "second_call", "total"):
        lines.append(f"| {k} | {warm[k]:.3f} | {cold[k]:.3f} |")
    t = res.get("triton")
    if t and "error" not in t:
        lines += ["", "| Triton's own JIT, same kernel | empty TRITON_CACHE_DIR | warm cache |",
                  "| --- | ---: | ---: |",
                  f"| first call | {t['cold']['first_call']:.3f} | {t['warm']['first_call']:.3f} |",
                  f"| import triton + kernel module | {t['cold']['import_triton']:.3f} | "
                  f"{t['warm']['import_triton']:.3f} |"]
    elif t:
        lines += ["", f"Triton comparison skipped: {t['error']}"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "triton"))
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-triton", action="store_true", help="skip the Triton JIT comparison")
    args = ap.parse_args(argv)
    bundle = str(Path(args.bundle).resolve())
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    import torch

    if not torch.cuda.is_available():
        print("cold_start: needs a GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "repeats": args.repeats, "bundle": bundle}
    child(FLYSHIP_CHILD, [bundle], {}, 900)  # make sure the normal cache is warm
    res["flyship_warm"] = medians([child(FLYSHIP_CHILD, [bundle], {}, 300) for _ in range(args.repeats)])
    with tempfile.TemporaryDirectory(prefix="flyship-cold-") as fresh:
        res["flyship_first_build"] = child(FLYSHIP_CHILD, [bundle], {"FLYSHIP_EXTENSIONS_DIR": fresh,
                                                                     "TORCH_EXTENSIONS_DIR": fresh}, 900)
    if not args.no_triton:
        try:
            kernels = str(ROOT / "examples" / "triton")
            with tempfile.TemporaryDirectory(prefix="triton-cold-") as cache:
                env = {"TRITON_CACHE_DIR": cache}
                cold = child(TRITON_CHILD, [kernels], env, 600)
                warm = medians([child(TRITON_CHILD, [kernels], env, 300) for _ in range(args.repeats)])
            res["triton"] = {"cold": cold, "warm": warm}
        except Exception as e:  # report, keep flyship's figures
            res["triton"] = {"error": f"{type(e).__name__}: {str(e)[-500:]}"}
    (out_dir / "cold_start.json").write_text(json.dumps(res, indent=1))
    table = markdown(res)
    (out_dir / "cold_start.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
