"""SIGTERM at random points of a real FlyDSL build (issue 32: "SIGTERM at 50 random points of a FlyDSL build: 50
exits with 143, nothing left behind"). docs/compile-stage.md ("Signals") names this script.

Each run starts ``flyc-build examples/flydsl/ops.py -o OUT --arch gfx942 --no-cache`` (the FlyDSL Python's
``flyc-build``) in its own session with a private ``TMPDIR``, sends SIGTERM to the build process at a time drawn
uniformly over the whole build (the build's duration is measured first, from uninterrupted builds, and the range
runs 10 % past it, so the very end is hit too: assembly, proofs, the bundle's write, the workers' shutdown, the exit),
and records the exit status, the stderr tail and what is left: entries of the private TMPDIR (``flyc-build-*``
scratch, tracebacks), the lock file and staging siblings beside OUT, a half-written OUT, processes of the build's
session still alive. A run passes when it exits 143 (or is ended by SIGTERM's default action, before the program
installs its handler: a shell reports 143 for that too; or exits 0, when the signal came after the build's end: then
OUT must be a whole bundle) with nothing left and no traceback on stderr.

    .venv-flydsl/bin/python scripts/sigterm_trial.py --runs 50 [--seed N] [--load N] [--group] [--at 9.1 ...]

``--load N`` runs N busy processes meanwhile (a loaded machine stretches every phase); ``--group`` signals the
build's whole process group, workers included, as a job scheduler does; ``--at`` gives the points instead of drawing
them. Writes one JSON line per run to ``--log`` and prints a summary; exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "flydsl" / "ops.py"
LOST_AFTER_S = 1.5  # a build that still runs this long after SIGTERM and then writes OUT did not take it


def flyc_build() -> str:
    here = Path(sys.executable).with_name("flyc-build")
    return str(here) if here.exists() else str(ROOT / ".venv-flydsl" / "bin" / "flyc-build")


def session_pids(sid: int) -> list[str]:
    """Live processes of session ``sid`` (not zombies), as ``pid (comm)``."""
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            out.append(f"{e} ({stat[stat.index('(') + 1:stat.rindex(')')]})")
    return out


def leftovers(work: Path) -> list[str]:
    """What a run left: every entry of its private TMPDIR, and every entry beside OUT but OUT and the log."""
    left = [f"TMPDIR/{p.name}" for p in sorted((work / "tmp").iterdir())]
    left += [p.name for p in sorted(work.iterdir()) if p.name not in ("tmp", "out", "log")]
    return left


def one_run(work: Path, point: float | None, group: bool, env_extra: dict[str, str]) -> dict:
    """One build, SIGTERM at ``point`` seconds after its start (None: not signalled, to measure)."""
    shutil.rmtree(work, ignore_errors=True)
    (work / "tmp").mkdir(parents=True)
    env = dict(os.environ, TMPDIR=str(work / "tmp"), PYTHONFAULTHANDLER="1", **env_extra)
    cmd = [flyc_build(), str(SPEC), "-o", str(work / "out"), "--arch", "gfx942", "--no-cache"]
    with (work / "log").open("wb") as log:  # a file, not a pipe: a surviving process would hold a pipe open
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=log, stderr=log, start_new_session=True)
        if point is not None:
            time.sleep(max(0.0, point - (time.monotonic() - t0)))
            try:
                os.killpg(proc.pid, signal.SIGTERM) if group else proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            rc = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    seconds = time.monotonic() - t0
    alive: list[str] = []
    end = time.monotonic() + 10
    while time.monotonic() < end and (alive := session_pids(proc.pid)):
        time.sleep(0.05)
    for p in alive:  # don't let one run's survivors load the next
        try:
            os.kill(int(p.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    err = (work / "log").read_text(errors="replace")
    out = work / "out"
    whole = (out / "manifest.json").is_file()
    left = leftovers(work)
    problems = []
    # -15: SIGTERM's default action, before the program installed its handler (the interpreter's start): a shell
    # reports 143 for it too, and nothing can be left yet.
    if rc not in (143, -signal.SIGTERM, 0):
        problems.append(f"exit {rc}")
    if rc == 0 and not whole:
        problems.append("exit 0 without a whole bundle")
    if rc != 0 and out.exists() and not whole:
        problems.append("a half-written OUT")
    # A signal that lands after the bundle is in place (the workers' shutdown, the exit) only sets the status: a
    # whole OUT with 143 then. One that a build kept running long after was lost on the way.
    if rc != 0 and whole and point is not None and seconds - point > LOST_AFTER_S:
        problems.append(f"the build ran on {seconds - point:.1f} s after SIGTERM and wrote OUT (signal lost)")
    if "Traceback" in err or "Fatal Python error" in err or "terminate called" in err:
        problems.append("traceback on stderr")
    if "leaked semaphore" in err:  # the resource tracker cleaned up after an exit that skipped the finalizers
        problems.append("leaked semaphores")
    if left:
        problems.append(f"left {left}")
    if alive:
        problems.append(f"alive {alive}")
    return {"point": point, "rc": rc, "seconds": round(seconds, 2), "ok": not problems, "problems": problems,
            "tail": err[-1500:] if problems or point is None and rc else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--load", type=int, default=0, help="busy processes to run meanwhile")
    ap.add_argument("--group", action="store_true", help="signal the build's process group (workers too)")
    ap.add_argument("--at", type=float, nargs="*", default=None, help="the points (seconds), instead of drawing")
    ap.add_argument("--duration", type=float, default=None, help="the build's duration, instead of measuring it")
    ap.add_argument("--log", default=None, help="JSON lines, one per run (default: a file in the temp folder)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="sigterm-trial."))
    log = Path(args.log) if args.log else base / "runs.jsonl"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the busy processes are stopped (below) on SIGTERM too
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        duration = args.duration
        if args.at is None and duration is None:
            runs = [one_run(base / "measure", None, False, {}) for _ in range(2)]
            if any(r["rc"] != 0 for r in runs):
                print(f"the uninterrupted build failed: {runs}", file=sys.stderr)
                return 2
            duration = max(r["seconds"] for r in runs)
            print(f"build duration (uninterrupted, max of 2): {duration:.2f} s")
        seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        rng = random.Random(seed)
        points = args.at if args.at is not None else [round(rng.uniform(0.0, duration * 1.1), 2)
                                                      for _ in range(args.runs)]
        print(f"seed {seed}; {len(points)} points; load {args.load}; signal to {'group' if args.group else 'build'}")
        results = []
        with log.open("a") as f:
            for i, point in enumerate(points):
                r = one_run(base / "run", point, args.group, {})
                results.append(r)
                f.write(json.dumps(r) + "\n")
                if not r["ok"]:  # the whole log of a failed run, kept
                    shutil.copy(base / "run" / "log", base / f"failed-{i + 1}.log")
                f.flush()
                print(f"{i + 1:3d}  at {point:6.2f} s  exit {r['rc']:4d}  {r['seconds']:6.2f} s  "
                      f"{'ok' if r['ok'] else 'FAIL: ' + '; '.join(r['problems'])}", flush=True)
                if not r["ok"]:
                    print("      " + r["tail"].replace("\n", "\n      "), flush=True)
    finally:
        for p in load:
            p.kill()
            p.wait()
    shutil.rmtree(base / "run", ignore_errors=True)
    shutil.rmtree(base / "measure", ignore_errors=True)
    ok = sum(r["ok"] for r in results)
    by_rc: dict[int, int] = {}
    for r in results:
        by_rc[r["rc"]] = by_rc.get(r["rc"], 0) + 1
    print(f"{ok}/{len(results)} passed; exits {dict(sorted(by_rc.items()))}; log {log}")
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
