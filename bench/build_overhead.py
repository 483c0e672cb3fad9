"""flyc-build's cost per kernel against FlyDSL's own compile of the same kernels (docs/perf.md).

Run in the build Python (FlyDSL + LLVM tools)::

    nice -n 0 .venv-flydsl/bin/python bench/build_overhead.py [--rounds 5] [--arch gfx942] [--json out.json]

Each round is one fresh process per target that compiles every (op, specialization) of the FlyDSL examples
both ways, kernel by kernel, in the same environment (FlyDSL's disk cache off, its IR dump off):

* ``flydsl``: FlyDSL's own compile, as the version adapter calls it without a GPU (0.5.0: ``flyc.compile``
  on CPU placeholder tensors; before 0.4.0: a direct call under ``COMPILE_ONLY=1``), what a user's JIT does;
* ``flyship``: what one flyc-build worker task does for that kernel (``frontends.compile_variant``): the same
  compile with flyship watching it (``capture.py``), assembly with llvm-mc + ld.lld, the proof against
  FlyDSL's code object, metadata, kernarg layout, resource checks.

Both run back to back per kernel, in alternating order (flydsl first on even rounds), so load drift on a
shared machine hits both; one untimed compile of each kind warms the process first. Per kernel it prints the
median over rounds of the per-round ratio flyship/flydsl and its spread (min..max). Then whole ``flyc-build``
runs (process start, spec import, pools, bundle writing; --no-cache): wall seconds per kernel with -j 1
against the sum of FlyDSL's per-kernel compiles, a warm-cache rebuild, and a no-op rebuild; then whole process
against whole process (``--pipeline-only`` runs just these): ``flyc-build -j 1`` against one fresh process
compiling the same kernels FlyDSL's own way, wall and CPU seconds, interleaved rounds. ``--marginal 3 6`` runs
only the cost of one kernel more: the same whole-process arms with the examples declared 3 and 6 times over, the
difference in wall time over the difference in kernels (what a long build pays per kernel, without the start and
the end both sizes share). ``--ray-workers 1 2`` adds throughput on a local Ray instance (docs/scale.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "flydsl" / "ops.py"


def child(flydsl_first: bool, target: str, spec_path: str) -> None:
    """One process: compile every kernel of the spec for ``target`` both ways; print
    ``{"flydsl": {"op.spec": seconds}, "flyship": {...}}`` as JSON."""
    from flyship.compiler import frontends
    from flyship.compiler import toolchain as _tc
    from flyship.compiler.frontends import BuildContext, WorkerSetup
    from flyship.compiler.frontends.flydsl import trace as _fd
    from flyship.compiler.frontends.flydsl import versions as _versions
    from flyship.compiler.worker import load_spec_file

    tc = _tc.find_toolchain()
    with _tc.rocm_root(tc) as rocm, tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        fd = frontends.get("flydsl")
        fd.prepare_worker(WorkerSetup(target=target, scratch_root=Path(scratch), rocm_root=rocm))
        sf = load_spec_file(spec_path)
        adapter = _versions.current()

        def flydsl(op, spec) -> None:
            pos, kw = _fd._call_args(op, spec)
            _fd._forget_compiled(op.kernel)
            with contextlib.redirect_stdout(io.StringIO()):
                adapter.compile(op.kernel, pos, kw)

        def flyship(op, spec) -> None:
            ctx = BuildContext(workdir=Path(tempfile.mkdtemp(dir=scratch)), toolchain=tc, rocm_root=rocm)
            frontends.compile_variant(fd, op, spec, target, ctx)

        kernels = [(op, spec) for op in sf.ops for spec in op.specs]
        flydsl(*kernels[0])  # warm-up: the first MLIR context, pass registration, the first tool start
        flyship(*kernels[0])
        times: dict[str, dict[str, float]] = {"flydsl": {}, "flyship": {}}
        order = (("flydsl", flydsl), ("flyship", flyship))
        for op, spec in kernels:
            for mode, fn in order if flydsl_first else order[::-1]:
                t0 = time.perf_counter()
                fn(op, spec)
                times[mode][f"{op.name}.{spec.name}"] = time.perf_counter() - t0
    print(json.dumps(times))


def flydsl_only(target: str, spec_path: str) -> None:
    """One process that compiles every kernel of the spec FlyDSL's own way, as a user's fresh process would (DSL
    import and spec import included): what ``flyc-build -j 1`` is compared with, whole process against whole
    process."""
    from flyship.compiler import frontends
    from flyship.compiler import toolchain as _tc
    from flyship.compiler.frontends import WorkerSetup
    from flyship.compiler.frontends.flydsl import trace as _fd
    from flyship.compiler.frontends.flydsl import versions as _versions
    from flyship.compiler.worker import load_spec_file

    tc = _tc.find_toolchain()
    with _tc.rocm_root(tc) as rocm, tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        frontends.get("flydsl").prepare_worker(WorkerSetup(target=target, scratch_root=Path(scratch), rocm_root=rocm))
        sf = load_spec_file(spec_path)
        adapter = _versions.current()
        for op in sf.ops:
            for spec in op.specs:
                pos, kw = _fd._call_args(op, spec)
                _fd._forget_compiled(op.kernel)
                with contextlib.redirect_stdout(io.StringIO()):
                    adapter.compile(op.kernel, pos, kw)


def timed(cmd: list[str], env: dict[str, str] | None = None, stderr: list[str] | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children) of one command; its stderr is appended to
    ``stderr`` when given."""
    before = os.times()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=str(ROOT), text=True)
    wall = time.perf_counter() - t0
    after = os.times()
    if stderr is not None:
        stderr.append(r.stderr)
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def run_child(flydsl_first: bool, target: str) -> dict[str, dict[str, float]]:
    out = subprocess.run([sys.executable, __file__, "--child", "flydsl" if flydsl_first else "flyship", target],
                         capture_output=True, text=True, check=True, cwd=str(ROOT))
    return json.loads(out.stdout.strip().splitlines()[-1])


def flyc_build(out: Path, archs: list[str], *extra: str, cache: Path | None = None) -> float:
    env = dict(os.environ)
    if cache is not None:
        env["FLYSHIP_CACHE_DIR"] = str(cache)
    cmd = [sys.executable, "-m", "flyship.compiler.cli", str(SPEC), "-o", str(out), "--force",
           *sum((["--arch", a] for a in archs), []), *extra, *(() if cache is not None else ("--no-cache",))]
    return timed(cmd, env)[0]


def pipeline_arms(arch: str, out: Path, rounds: int) -> dict:
    """Whole processes, interleaved: ``flyc-build -j 1 --no-cache`` (pipelined: one kernel's assembly and proof
    overlap the next kernel's trace) against one fresh process compiling the same kernels FlyDSL's own way;
    wall and CPU seconds, medians over ``rounds``."""
    arms: dict[str, list[tuple[float, float]]] = {"flydsl": [], "flyc-build": []}
    for r in range(rounds):
        order = ("flydsl", "flyc-build") if r % 2 == 0 else ("flyc-build", "flydsl")
        for arm in order:
            if arm == "flydsl":
                arms[arm].append(timed([sys.executable, __file__, "--flydsl-only", arch]))
            else:
                arms[arm].append(timed([sys.executable, "-m", "flyship.compiler.cli", str(SPEC), "-o", str(out),
                                        "--force", "--arch", arch, "-j", "1", "--no-cache"]))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in arms.items()}
    res = {"rounds": rounds, "flydsl_wall_s": med["flydsl"][0], "flydsl_cpu_s": med["flydsl"][1],
           "flyc_build_wall_s": med["flyc-build"][0], "flyc_build_cpu_s": med["flyc-build"][1],
           "wall_ratio": med["flyc-build"][0] / med["flydsl"][0], "cpu_ratio": med["flyc-build"][1] / med["flydsl"][1],
           "wall_ratios_per_round": [b[0] / a[0] for a, b in zip(arms["flydsl"], arms["flyc-build"])]}
    print(f"whole process, {rounds} rounds: flyc-build -j 1 {res['flyc_build_wall_s']:.2f} s wall / "
          f"{res['flyc_build_cpu_s']:.2f} s CPU; FlyDSL's own {res['flydsl_wall_s']:.2f} s wall / "
          f"{res['flydsl_cpu_s']:.2f} s CPU: wall {res['wall_ratio']:.3f}x, CPU {res['cpu_ratio']:.3f}x "
          f"(per round {', '.join(f'{x:.2f}' for x in res['wall_ratios_per_round'])})")
    return res


COPIES_SPEC = """
# Generated by bench/build_overhead.py --marginal: the FlyDSL example ops, each specialization declared {copies}
# times (its name suffixed _0.._{last}, each copy with a constraint of its own so none hides another), so that a
# build compiles the same kernels {copies} times over.
import copy
from pathlib import Path

import flyship.compiler.spec as _spec

_op = _spec.op


def _copies(name, *, specs, **kw):
    out = []
    for k in range({copies}):
        for s in specs:
            c = copy.copy(s)
            object.__setattr__(c, "name", f"{{s.name}}_{{k}}")
            first = next(iter(s.shapes))
            object.__setattr__(c, "constraints", tuple(s.constraints) + (f"{{first}}.shape[0] != {{999000 + k}}",))
            out.append(c)
    return _op(name, specs=out, **kw)


_spec.op = _copies
try:
    _ops = Path(__file__).with_name("ops.py")
    exec(compile(_ops.read_text(), str(_ops), "exec"))
finally:
    _spec.op = _op  # the spec module as it was, for whatever imports it next in this process
"""


def copies_spec(folder: Path, copies: int) -> Path:
    """The examples' folder copied to ``folder`` with a spec file declaring each specialization ``copies`` times."""
    import shutil

    if not folder.exists():
        shutil.copytree(SPEC.parent, folder)
    path = folder / f"ops_x{copies}.py"
    path.write_text(COPIES_SPEC.format(copies=copies, last=copies - 1))
    return path


def marginal_arms(arch: str, tmp: Path, rounds: int, sizes: tuple[int, int]) -> dict:
    """Wall time per kernel once a build is under way: whole processes (``flyc-build -j 1 --no-cache`` against one
    fresh process compiling the same kernels FlyDSL's own way) at two sizes, the example kernels declared
    ``sizes[0]`` and ``sizes[1]`` times; the difference in wall time over the difference in kernels is the cost of
    one kernel more, without the process start, the imports and the bundle that both sizes share."""
    specs = {c: copies_spec(tmp / "examples", c) for c in sizes}
    walls: dict[tuple[str, int], list[float]] = {}
    kernels: dict[int, int] = {}
    for r in range(rounds):
        for c in sizes:
            order = ("flydsl", "flyc-build") if (r + c) % 2 == 0 else ("flyc-build", "flydsl")
            for arm in order:
                cmd = ([sys.executable, __file__, "--flydsl-only", arch, "--spec", str(specs[c])] if arm == "flydsl"
                       else [sys.executable, "-m", "flyship.compiler.cli", str(specs[c]), "-o", str(tmp / "out"),
                             "--force", "--arch", arch, "-j", "1", "--no-cache"])
                said: list[str] = []
                walls.setdefault((arm, c), []).append(timed(cmd, stderr=said)[0])
                if arm == "flyc-build":  # "flyc-build: 27 kernels (5 ops) for gfx942, jobs=1"
                    kernels[c] = int(re.search(r"flyc-build: (\d+) kernels", said[0]).group(1))
    med = {k: statistics.median(v) for k, v in walls.items()}
    lo, hi = sizes
    per = {arm: (med[(arm, hi)] - med[(arm, lo)]) / (kernels[hi] - kernels[lo]) for arm in ("flydsl", "flyc-build")}
    res = {"rounds": rounds, "kernels": kernels, "wall_s": {f"{a}@{c}": v for (a, c), v in med.items()},
           "per_kernel_s": per, "per_kernel_ratio": per["flyc-build"] / per["flydsl"],
           "whole_ratio": {c: med[("flyc-build", c)] / med[("flydsl", c)] for c in sizes}}
    print(f"marginal, {rounds} rounds, {kernels[lo]} and {kernels[hi]} kernels: one kernel more costs flyc-build -j 1 "
          f"{per['flyc-build'] * 1e3:.0f} ms of wall, FlyDSL's own {per['flydsl'] * 1e3:.0f} ms: "
          f"{res['per_kernel_ratio']:.3f}x; whole process "
          + ", ".join(f"{res['whole_ratio'][c]:.3f}x at {kernels[c]}" for c in sizes))
    return res


def versions() -> dict[str, str]:
    from importlib.metadata import version

    from flyship.compiler import toolchain as _tc

    out = {"python": platform.python_version(), "flydsl": version("flydsl"), "torch": version("torch"),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                            time.gmtime())}
    out.update({k: v.split(" (")[0] for k, v in _tc.find_toolchain().describe().items()})
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("MODE", "TARGET"), help=argparse.SUPPRESS)
    ap.add_argument("--flydsl-only", metavar="TARGET", help=argparse.SUPPRESS)
    ap.add_argument("--pipeline-only", action="store_true", help="only the whole-process arms: flyc-build -j 1 "
                                                                  "(pipelined) against FlyDSL's own compiles")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", default="gfx942")
    ap.add_argument("--ray-workers", type=int, nargs="*", default=[], help="also time flyc-build on a local Ray "
                                                                           "instance with these worker counts")
    ap.add_argument("--ray-space", type=int, default=0, help="build a generated space of this many tiny Triton "
                                                             "configs on Ray (tests/compiler/tiny_space.py) instead "
                                                             "of the FlyDSL examples")
    ap.add_argument("--json", default=None, help="write every figure here")
    ap.add_argument("--marginal", type=int, nargs=2, metavar=("LOW", "HIGH"), default=None,
                    help="only the cost of one kernel more: whole builds of the examples declared LOW and HIGH times")
    ap.add_argument("--spec", default=str(SPEC), help=argparse.SUPPRESS)
    ap.add_argument("--kernels-only", action="store_true", help="only the per-kernel comparison (no flyc-build runs)")
    return ap.parse_args()


def main() -> None:
    a = parse_args()
    if a.child:
        child(a.child[0] == "flydsl", a.child[1], str(SPEC))
        return
    if a.flydsl_only:
        flydsl_only(a.flydsl_only, a.spec)
        return
    if a.marginal:
        with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
            report = {"versions": versions(), "loadavg_start": os.getloadavg(),
                      "marginal": marginal_arms(a.arch, Path(tmp), a.rounds, tuple(a.marginal)),
                      "loadavg_end": os.getloadavg()}
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1))
        return
    if a.pipeline_only:
        with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
            report = {"versions": versions(), "loadavg_start": os.getloadavg(),
                      "pipeline": pipeline_arms(a.arch, Path(tmp) / "out", a.rounds), "loadavg_end": os.getloadavg()}
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1))
        return
    report: dict = {"versions": versions(), "rounds": a.rounds, "arch": a.arch, "per_kernel": {},
                    "loadavg_start": os.getloadavg()}
    ratios: dict[str, list[float]] = {}
    sums: dict[str, list[float]] = {"flydsl": [], "flyship": []}
    for r in range(a.rounds):
        got = run_child(r % 2 == 0, a.arch)
        for k in got["flydsl"]:
            ratios.setdefault(k, []).append(got["flyship"][k] / got["flydsl"][k])
            report["per_kernel"].setdefault(k, {m: [] for m in sums})
            for m in got:
                report["per_kernel"][k][m].append(got[m][k])
        for m in got:
            sums[m].append(sum(got[m].values()))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{m} {sums[m][-1]:.2f} s" for m in sums) + " (all kernels), "
              f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    report["loadavg_end"] = os.getloadavg()
    print(f"{'kernel':<18} {'flydsl s':>9} {'flyship s':>9} {'ratio (median)':>15} {'spread':>13}")
    for k, rs in ratios.items():
        pk = report["per_kernel"][k]
        print(f"{k:<18} {statistics.median(pk['flydsl']):9.3f} {statistics.median(pk['flyship']):9.3f} "
              f"{statistics.median(rs):15.3f} {min(rs):6.3f}..{max(rs):.3f}")
        pk["ratio_median"], pk["ratio_min"], pk["ratio_max"] = statistics.median(rs), min(rs), max(rs)
    all_r = [statistics.median(rs) for rs in ratios.values()]
    per_round = [f / d for f, d in zip(sums["flyship"], sums["flydsl"])]
    report["ratio_all_kernels_median"] = statistics.median(per_round)
    print(f"all kernels: flyship/flydsl per round {', '.join(f'{x:.3f}' for x in per_round)}; median "
          f"{statistics.median(per_round):.3f}; per-kernel medians {min(all_r):.3f}..{max(all_r):.3f}; load average "
          f"{report['loadavg_start'][0]:.1f} at start, {report['loadavg_end'][0]:.1f} at end")
    if a.kernels_only:
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1))
        return
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        t = Path(tmp)
        n = len(ratios)
        cold = flyc_build(t / "cold", [a.arch], "-j", "1")
        warm_tasks = flyc_build(t / "w1", [a.arch], "-j", "1", cache=t / "cache")
        noop = flyc_build(t / "w2", [a.arch], "-j", "1", cache=t / "cache")
        for p in (t / "cache" / "v1" / "builds").glob("*/*.json"):
            p.unlink()
        tasks_only = flyc_build(t / "w3", [a.arch], "-j", "1", cache=t / "cache")
        fl = statistics.median(sums["flydsl"])
        report["flyc_build"] = {"kernels": n, "cold_j1_s": cold, "cold_per_kernel_s": cold / n,
                                "flydsl_sum_s": fl, "cold_vs_flydsl_sum": cold / fl, "cache_fill_s": warm_tasks,
                                "noop_rebuild_s": noop, "rebuild_from_task_entries_s": tasks_only}
        print(f"flyc-build -j 1 --no-cache: {cold:.2f} s for {n} kernels = {cold / n:.3f} s/kernel; FlyDSL's own "
              f"compiles sum to {fl:.2f} s ({cold / fl:.2f}x, process start and spec import included)")
        print(f"no-op rebuild (whole-build entry): {noop:.2f} s; from task entries only: {tasks_only:.2f} s")
        report["pipeline"] = pipeline_arms(a.arch, t / "pipe", a.rounds)
        spec = str(SPEC)
        if a.ray_space:
            sys.path.insert(0, str(ROOT))
            from tests.compiler import tiny_space

            spec = str(tiny_space.write_space(t / "space", a.ray_space))
        for w in a.ray_workers:
            report.setdefault("ray", {})[w] = ray_throughput(spec, a.arch, w, t / f"ray{w}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


def ray_throughput(spec: str, arch: str, workers: int, out: Path) -> dict:
    """flyc-build --executor ray on a private local Ray instance of ``workers`` CPUs (--no-cache)."""
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    cmd = [sys.executable, "-m", "flyship.compiler.cli", spec, "-o", str(out), "--force", "--arch", arch,
           "--no-cache", "--executor", "ray", "-j", str(workers)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=str(ROOT))
    wall = time.perf_counter() - t0
    n = r.stderr.count("(ray)")
    print(f"ray, {workers} worker(s): {n} kernels in {wall:.1f} s = {n / wall:.2f} kernels/s")
    return {"kernels": n, "wall_s": wall, "kernels_per_s": n / wall}


if __name__ == "__main__":
    main()
