"""How long ``flyship.load`` takes: the first load in a fresh process (issue 24: torch already imported, the
extension and plan caches warm; the clock covers ``import flyship`` and the load), and, with ``--in-process``, the
load as a bundle grows from 21 to 2,016 variants with the plan cache cold, warm and off, and an op's first call
(docs/perf.md, "Loading").

    python bench/load_time.py [--bundle artifacts/examples] [--processes 15]
    python bench/load_time.py --in-process [--specs 1,10,96] [--repeats 7]
    python bench/load_time.py --parts 9 [--bundle artifacts/examples]

Fresh processes: each bundle (the one given by ``--bundle``, else the tiny test bundle, and a generated bundle of
2,016 variants) is loaded once to warm the plan cache, then in ``--processes`` fresh processes, interleaved; the
table gives median, min and the spread (25th-75th percentile). Byte code is cached as an installed package's would
be (``PYTHONPYCACHEPREFIX`` in the work folder, ``PYTHONDONTWRITEBYTECODE`` dropped): without it, every process
compiles the sources again (about 60 ms here), which measures the environment, not the loader.

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


CHILD = """
import sys, time
import torch
t = time.perf_counter()
import flyship
flyship.load(sys.argv[1])
print(f"{(time.perf_counter() - t) * 1e3:.3f} " + " ".join(sorted(m for m in sys.modules if m.startswith('flyship'))))
"""


def fresh_load(bundle: Path, env: dict[str, str]) -> tuple[float, list[str]]:
    """One fresh process: ms from ``import flyship`` to ``flyship.load`` returning, and the flyship modules it
    imported."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", CHILD, str(bundle)], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), out[1:]


def fresh_processes(args: argparse.Namespace, work: Path) -> None:
    import torch

    import flyship

    env = dict(os.environ, FLYSHIP_PLAN_CACHE=str(work / "plans"), PYTHONPYCACHEPREFIX=str(work / "pyc"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    bundles = {"examples" if args.bundle else "tiny (3 ops)": Path(args.bundle or ROOT / "tests/loader/data/tiny")}
    bundles[f"generated, {N_OPS * 96 * 3} variants"] = generated_bundle(ROOT / "tests/loader/data/tiny", work / "b96", 96)
    for b in bundles.values():
        fresh_load(b, env)  # warms the plan cache and the byte-code cache
    times: dict[str, list[float]] = {name: [] for name in bundles}
    modules = 0
    for _ in range(args.processes):  # interleaved: a burst of other work on the machine hits every bundle alike
        for name, b in bundles.items():
            ms, mods = fresh_load(b, env)
            times[name].append(ms)
            modules = len(mods)
    print(f"flyship {flyship.__version__}, torch {torch.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.processes} fresh "
          f"processes per bundle, {modules} flyship modules imported; ms from `import flyship` to load's return")
    print("| bundle | median | min | 25th-75th percentile |\n|---|---|---|---|")
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        print(f"| {name} | {statistics.median(ts):.1f} | {min(ts):.1f} | {q[0]:.1f}-{q[2]:.1f} |")


PARTS_CHILD = """
import sys, time, cProfile, pstats, json
import torch
profile = cProfile.Profile()
t = time.perf_counter()
profile.enable()
import flyship
flyship.load(sys.argv[1])
profile.disable()
total = (time.perf_counter() - t) * 1e3
stats = pstats.Stats(profile).stats
parts = {"whole first load, under cProfile": lambda f, n: False}
parts.update({
    "importing the flyship modules": lambda f, n: f.endswith("loader/__init__.py") and n == "<module>",
    "of it: dataclasses._process_class": lambda f, n: n == "_process_class",
    "of it: @frozen class creation": lambda f, n: f.endswith("bundle/frozen.py") and n == "frozen",
    "importing the extension .so (_imp.create_dynamic)": lambda f, n: n == "<built-in method _imp.create_dynamic>",
    "torch.library.register_fake": lambda f, n: f.endswith("torch/library.py") and n == "register_fake",
    "the plan cache read (load_plan)": lambda f, n: f.endswith("loader/plancache.py") and n == "load_plan",
})
out = {k: sum(v[3] for (f, _, n), v in stats.items() if test(f, n)) * 1e3 for k, test in parts.items()}
out["whole first load, under cProfile"] = total
print(json.dumps(out))
"""


def profiled_parts(args: argparse.Namespace, work: Path) -> None:
    """Where a first load's time goes: cProfile's cumulative ms of named parts, median of ``--parts`` fresh
    processes (docs/perf.md, "The first load cut to its parts")."""
    import json
    import subprocess

    env = dict(os.environ, FLYSHIP_PLAN_CACHE=str(work / "plans"), PYTHONPYCACHEPREFIX=str(work / "pyc"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    bundle = str(args.bundle or ROOT / "tests/loader/data/tiny")
    runs = []
    for k in range(args.parts + 1):  # the first warms the plan and byte-code caches
        out = subprocess.run([sys.executable, "-c", PARTS_CHILD, bundle], cwd=ROOT, env=env, check=True,
                             capture_output=True, text=True).stdout
        if k:
            runs.append(json.loads(out))
    print(f"{bundle}: cProfile, median of {args.parts} fresh processes, ms\n| part | ms |\n|---|---|")
    for name in runs[0]:
        print(f"| {name} | {statistics.median(r[name] for r in runs):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", help="the bundle for the fresh-process table (default: the tiny test bundle)")
    ap.add_argument("--processes", type=int, default=15, help="fresh processes per bundle (median of them)")
    ap.add_argument("--in-process", action="store_true", help="the in-process table instead (cold/warm/off)")
    ap.add_argument("--specs", default="1,10,96", help="specializations per op, comma-separated (--in-process)")
    ap.add_argument("--repeats", type=int, default=7, help="warm loads per bundle (--in-process)")
    ap.add_argument("--parts", type=int, default=0, metavar="N",
                    help="instead: where a first load's time goes (cProfile), median of N fresh processes")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flyship_load_bench_"))
    if args.parts:
        profiled_parts(args, work)
        return
    if not args.in_process:
        fresh_processes(args, work)
        return
    in_process(args, work)


def in_process(args: argparse.Namespace, work: Path) -> None:
    """Loads in this process: plan cache cold, warm and off, and the first call after a warm load."""
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
