"""The loader extension's cold build: wall and CPU time of building it from nothing, per grouping of the core's units.

    python3 bench/extension_build.py --flavor cuda --units 1 2 4 all --out /tmp/out

Each arm is a fresh Python that builds the extension into an empty ``FLYSHIP_EXTENSIONS_DIR`` with
``FLYSHIP_BUILD_UNITS`` set (``all``: one translation unit per core unit; ``auto``: the default grouping of
loader/units.py for this machine), arms interleaved over ``--rounds``. Reports the median wall seconds and the
compiler's CPU seconds per arm, the machine's cores and load, and writes ``extension_build.json`` to ``--out``.
The module built is the same in every arm (loader/units.py); only how its sources are compiled differs.
``--per-file`` also compiles each core unit alone (one per core at a time, torch's include paths and the build's
flags) and reports each one's compiler CPU seconds with ``-fsyntax-only`` (the headers' cost) and in full (the rest is
code generation): which units a parallel build waits for, and what each pays for its headers.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's flyship (its csrc), as the arms' processes import it

CHILD = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
from flyship.loader import extension
ext = extension.extension(sys.argv[1])
wall = time.perf_counter() - t0
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "compiler_cpu_s": ch.ru_utime + ch.ru_stime, "flavor": ext.flavor()}))
"""


def arm(flavor: str, units: str, folder: Path) -> dict:
    """One cold build in a fresh process; the extension folder is emptied first."""
    env = dict(os.environ, FLYSHIP_EXTENSIONS_DIR=str(folder))
    env.pop("FLYSHIP_BUILD_UNITS", None)
    if units == "all":
        from flyship.loader import extension

        env["FLYSHIP_BUILD_UNITS"] = str(len(extension.CORE_SOURCES))
    elif units != "auto":
        env["FLYSHIP_BUILD_UNITS"] = units
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    r = subprocess.run([sys.executable, "-c", CHILD, flavor], env=env, capture_output=True, text=True, timeout=900,
                       cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"extension_build: the {units} arm failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _cpu(cmd: list[str]) -> float:
    """Compiler CPU seconds (user + sys) of one command, or -1.0 if it failed."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    return round(usage.ru_utime + usage.ru_stime, 2) if status == 0 else -1.0


def per_file(flavor: str | None) -> dict[str, dict[str, float]]:
    """Each core unit compiled alone to an object, as cpp_extension compiles it (torch's include paths, C++20, the
    build's flags), one unit per core at a time: compiler CPU seconds of ``-fsyntax-only`` (parsing and template
    instantiation: the headers' cost) and of the full compile (the rest is code generation), and the wall seconds."""
    import sysconfig
    import time
    from concurrent.futures import ThreadPoolExecutor

    from torch.utils import cpp_extension

    from flyship.loader import extension

    cfg = extension.config(flavor)
    incs = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], *cfg.include_dirs]
    flags = ["-std=c++20", "-fPIC", "-DTORCH_EXTENSION_NAME=bench", "-DTORCH_API_INCLUDE_EXTENSION_H", *cfg.cflags]
    cxx = os.environ.get("CXX", "c++")

    def one(src: str) -> tuple[str, dict[str, float]]:
        base = [cxx, *flags, *(f"-isystem{i}" for i in incs), "-c", src]
        with tempfile.TemporaryDirectory() as d:
            syntax = _cpu([*base, "-fsyntax-only"])
            t0 = time.perf_counter()
            full = _cpu([*base, "-o", f"{d}/o.o"])
            took = time.perf_counter() - t0
        return Path(src).name, {"syntax_cpu_s": syntax, "compile_cpu_s": full, "compile_wall_s": round(took, 2)}

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(sorted(pool.map(one, cfg.sources), key=lambda kv: -kv[1]["compile_cpu_s"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flavor", default=None, help="hip, cuda or record (default: from the torch build)")
    ap.add_argument("--units", nargs="+", default=["1", "auto", "all"], help="groupings to time: N, auto or all")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--per-file", action="store_true", help="also time each core unit compiled alone (CPU s: syntax only, full)")
    a = ap.parse_args()
    from flyship.loader import units as _units

    runs: dict[str, list[dict]] = {u: [] for u in a.units}
    with tempfile.TemporaryDirectory(prefix="flyship-ext-bench-") as tmp:
        for _ in range(a.rounds):
            for u in a.units:
                runs[u].append(arm(a.flavor, u, Path(tmp) / f"ext_{u}"))
                print(f"units={u}: {runs[u][-1]}", flush=True)
    report = {"cores": os.cpu_count(), "loadavg": os.getloadavg(), "auto_groups": _units.default_groups(
        len(__import__("flyship.loader.extension", fromlist=["x"]).CORE_SOURCES)),
              "arms": {u: {"wall_s": round(statistics.median(r["wall_s"] for r in rs), 2),
                           "compiler_cpu_s": round(statistics.median(r["compiler_cpu_s"] for r in rs), 2),
                           "flavor": rs[0]["flavor"]} for u, rs in runs.items()}}
    if a.per_file:
        report["per_file_s"] = per_file(a.flavor)
    print(json.dumps(report, indent=1))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "extension_build.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
