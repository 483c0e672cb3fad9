"""How long ``flyship.load`` takes as a bundle grows from 21 to 2,016 variants, with the plan cache cold, warm
and off, and what an op's first call costs after a warm load (docs/perf.md, "Loading").

    python bench/load_time.py [--specs 1,10,96] [--repeats 7]

No GPU: the bundles are generated from the tiny bundle (tests/loader/data/many_variants.py: 7 ops, 3 variants per
specialization); first calls run on the recording driver (``FLYSHIP_FLAVOR=record``), which takes the real C++
path, the code-object check included. Each load registers its ops under a fresh namespace, so every figure
includes torch's own registration of the 7 ops. The plan cache lives in a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "loader" / "data"))

from many_variants import N_OPS, generated_bundle  # noqa: E402


def timed_load(bundle: Path, **kwargs: Any) -> tuple[float, Any]:
    import flyship

    t = time.perf_counter()
    ops = flyship.load(bundle, namespace=f"bench_{uuid.uuid4().hex[:10]}", **kwargs)
    return time.perf_counter() - t, ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specs", default="1,10,96", help="specializations per op, comma-separated")
    ap.add_argument("--repeats", type=int, default=7, help="warm loads per bundle (min and median shown)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flyship_load_bench_"))
    os.environ["FLYSHIP_PLAN_CACHE"] = str(work / "plans")
    import torch

    import flyship
    from flyship.loader import extension

    counts = [int(s) for s in args.specs.split(",")]
    bundles = {n: generated_bundle(ROOT / "tests" / "loader" / "data" / "tiny", work / f"b{n}", n) for n in counts}
    record = extension.extension("record")
    timed_load(bundles[counts[0]])  # imports, torch's first registrations, the extension
    print(f"flyship {flyship.__version__}, torch {torch.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; times in ms")
    print(f"{'variants':>9} {'cold':>8} {'warm min':>9} {'warm med':>9} {'cache off':>10} {'1st call':>9}")
    for n, bundle in bundles.items():
        os.environ["FLYSHIP_PLAN_CACHE"] = str(work / "plans" / f"b{n}")
        cold, _ = timed_load(bundle)
        warm = [timed_load(bundle)[0] for _ in range(args.repeats)]
        os.environ["FLYSHIP_FLAVOR"] = "record"
        record.set_recorded_device(0, "gfx942:sramecc+:xnack-")
        _, ops = timed_load(bundle)
        x = torch.randn(4096)
        t = time.perf_counter()
        ops.add0(x, x)
        first = time.perf_counter() - t
        del os.environ["FLYSHIP_FLAVOR"]
        os.environ["FLYSHIP_PLAN_CACHE"] = "off"
        off = min(timed_load(bundle)[0] for _ in range(2))
        print(f"{N_OPS * n * 3:>9} {cold * 1e3:>8.1f} {min(warm) * 1e3:>9.1f} {statistics.median(warm) * 1e3:>9.1f} "
              f"{off * 1e3:>10.1f} {first * 1e3:>9.1f}")


if __name__ == "__main__":
    main()
