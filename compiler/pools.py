"""The local executor's worker pools: one process pool per target, started as early as the build can.

A worker imports the spec file (and with it torch and the DSL: ~2.5 s of CPU for the FlyDSL examples on the 2-core
machine) before it compiles anything, and the build process imports the same spec file to plan. Done one after the
other, those two imports were a third of a small build's wall time (docs/perf.md, "Build wall time"). So
:func:`start_early` starts each target's workers before the build reads its declarations, with a configuration
every built-in frontend can use; once the build has planned, :meth:`EarlyPools.take` hands a pool to the run when
its configuration is the one the run would have made, and stops it otherwise (a frontend registered by the spec
file itself, another toolchain): an early pool never changes what a worker does, only when it starts.

Pipelining (one worker more than may trace at once, so one kernel's assembly and proof overlap the next kernel's
trace) pays for that extra worker's start only on long task lists: :func:`pipelines` decides.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection as mp_connection
import os
import tempfile
import time
from typing import Callable, Iterator, Optional

from flyship.compiler import frontends as _frontends
from flyship.compiler import hygiene as _hygiene
from flyship.compiler.worker import TraceSlots, WorkerConfig, init_worker, warm_up

# Tasks per pool from which a pool pipelines, where the machine has a core for the extra worker (:func:`pipelines`).
# The extra worker costs one more import of the spec file (~2.5 s of CPU for the FlyDSL examples on the 2-core
# machine) and saves the in-process steps after a trace (the wait for the assembler and linker, the proof, metadata,
# checks), so it pays only on long task lists (docs/perf.md, "Build wall time": -j 1, 9 kernels, 6.5-7.8 s wall
# either way, 1.7 s more CPU).
PIPELINE_MIN_TASKS = 24

# Seconds a worker may take to end after its pool's shutdown before it is killed (:func:`close`); a worker ends in
# ~0.05 s (it skips interpreter teardown), so only one stuck in what the spec file started waits this long.
EXIT_GRACE_S = 10.0


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pipelines(tasks: int, per_pool: int, pools: int = 1) -> bool:
    """Whether a pool of ``per_pool`` tracing workers with ``tasks`` tasks gets one more worker to pipeline: on a
    long task list, and only where every one of the ``pools`` pools' extra worker has a core of its own beside the
    tracing workers and the build process. On the 2-core machine with -j 1 the extra worker's import took the CPU the
    first traces needed: 27 and 54 FlyDSL kernels built 1.1-1.7 s slower pipelined (4 pairs), while it saved ~13 ms
    of wall per kernel after that, ~115 kernels to break even (docs/perf.md, "Build wall time")."""
    return tasks > per_pool and tasks >= PIPELINE_MIN_TASKS and cores() >= pools * (per_pool + 1) + 1


@dataclasses.dataclass
class Pool:
    """One target's process pool and the configuration its workers were started with."""

    executor: cf.ProcessPoolExecutor
    cfg: WorkerConfig
    tracing: int  # workers that may trace at once
    pipelined: bool

    def shutdown(self, failed: bool, say: Callable[[str], None] = lambda s: None) -> None:
        """The end of a run: let the workers leave (:func:`close`), or, when the run failed (an exception, Ctrl-C,
        SIGTERM), stop them now (workers ignore SIGINT: the build process decides)."""
        if failed:
            self.stop()
        else:
            close(self.executor, f"{self.cfg.target} worker", say)

    def stop(self) -> None:
        """Stop the pool now, its workers killed wherever they are (an early pool's may still be importing)."""
        kill(self.executor)


def kill(executor: cf.ProcessPoolExecutor) -> None:
    """Stop ``executor`` now, its workers killed wherever they are, and every process they started."""
    procs = list((getattr(executor, "_processes", None) or {}).values())
    left = _hygiene.descendants([p.pid for p in procs if p.pid])
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.kill()
    executor.shutdown(wait=True, cancel_futures=True)
    _hygiene.stop_processes(left)


def close(executor: cf.ProcessPoolExecutor, who: str, say: Callable[[str], None],
          grace: Optional[float] = None) -> None:
    """Shut ``executor`` down once its tasks are done, leaving no process behind.

    A worker ends ~0.05 s after its pool's shutdown (``worker._end_worker``); one still running ``grace`` seconds
    (default :data:`EXIT_GRACE_S`) later is stuck in something the spec file started (an exit handler that waits,
    a child process multiprocessing joins) and is killed. The processes a worker started and left running (a
    server, ``sleep`` in the background) would outlive the build as orphans: they are killed too. Each kill is
    said, naming the process."""
    procs = [p for p in (getattr(executor, "_processes", None) or {}).values() if p.pid]
    manager = getattr(executor, "_executor_manager_thread", None)
    left = _hygiene.descendants([p.pid for p in procs])
    executor.shutdown(wait=False, cancel_futures=True)
    grace = EXIT_GRACE_S if grace is None else grace
    deadline = time.monotonic() + grace
    # The pool's manager thread joins (and reaps) the workers, so a second join here would race it and could see a
    # reaped worker as alive. A worker's sentinel (a pipe) says when it ends, unless a process it forked still holds
    # the pipe's other end: /proc says it too (gone, or a zombie).
    starts = {p.pid: _hygiene.start_time(p.pid) for p in procs}
    running = {p.sentinel: p for p in procs}
    while running and (left_s := deadline - time.monotonic()) > 0:
        for ended in mp_connection.wait(list(running), timeout=min(left_s, 0.05)):
            running.pop(ended)
        for sentinel, p in list(running.items()):
            if starts[p.pid] is None or _hygiene.start_time(p.pid) != starts[p.pid]:
                running.pop(sentinel)
    stuck = list(running.values())
    if stuck:
        left.update(_hygiene.descendants([p.pid for p in stuck]))
        for p in stuck:
            with contextlib.suppress(Exception):
                p.kill()
    if manager is not None:
        manager.join()
    stopped = _hygiene.stop_processes(left)
    if stuck:
        say(f"flyc-build: the {who} process {', '.join(str(p.pid) for p in stuck)} had not ended {grace:g} "
            "s after its last kernel (something the spec file started kept it: an exit handler that waits, a child "
            "process it joins); stopped it")
    say_stopped(stopped, who, say)


def say_stopped(stopped: list[_hygiene.Stopped], who: str, say: Callable[[str], None]) -> None:
    """Name the processes stopped after a worker ended: the spec file's apart from flyship's own tools (told apart by
    how they were started, :func:`flyship.compiler.hygiene.tool_env`), which are never the spec file's doing."""
    spec = [str(s) for s in stopped if not s.tool]
    tools = [str(s) for s in stopped if s.tool]
    if spec:
        say(f"flyc-build: stopped {len(spec)} process(es) that the spec file started in a {who} and left running "
            f"after it ended: {', '.join(spec)}; a spec file should not leave processes behind")
    if tools:
        say(f"flyc-build: stopped {len(tools)} of flyship's own tool process(es) (the assembler, linker or bundler it "
            f"runs) still running as the {who} ended: {', '.join(tools)}")


def start(cfg: WorkerConfig, tracing: int, pipelined: bool, warm: int = 0) -> Pool:
    """A pool of ``tracing`` workers (one more when ``pipelined``) for ``cfg.target``; ``warm`` of them are started
    now (a spawn pool starts its workers as tasks arrive), each importing the spec file in its initializer."""
    slots = TraceSlots(tempfile.mkdtemp(prefix="slots.", dir=cfg.scratch_root), tracing) if pipelined else None
    executor = cf.ProcessPoolExecutor(max_workers=tracing + pipelined, mp_context=multiprocessing.get_context("spawn"),
                                      initializer=init_worker, initargs=(cfg, slots))
    for _ in range(warm):
        executor.submit(warm_up)
    return Pool(executor, cfg, tracing, pipelined)


def early_config(cfg: WorkerConfig) -> WorkerConfig:
    """``cfg`` as an early pool's workers get it: prepared for every registered frontend, as the build does not yet
    know which the spec file uses."""
    names = tuple(_frontends.names())
    return dataclasses.replace(cfg, frontends=names, frontend_modules=tuple(_frontends.origin(f) for f in names))


class EarlyPools:
    """Pools started before planning, by target, until the run takes them; the rest are stopped on exit."""

    def __init__(self) -> None:
        self.pools: dict[str, Pool] = {}

    def take(self, cfg: WorkerConfig, tracing: int, pipelined: bool) -> Optional[Pool]:
        """The early pool of ``cfg.target`` when its workers were started as ``cfg`` would start them (its
        frontends a superset of ``cfg``'s, everything else equal), at least ``tracing`` of them, and the run does
        not pipeline (early pools never do); else None, the early pool stopped."""
        pool = self.pools.pop(cfg.target, None)
        if pool is None:
            return None
        if getattr(pool.executor, "_broken", False):  # a worker died importing the spec file: a fresh pool reports it
            pool.stop()
            return None
        same = (dataclasses.replace(pool.cfg, frontends=cfg.frontends, frontend_modules=cfg.frontend_modules) == cfg
                and set(cfg.frontends) <= set(pool.cfg.frontends)
                and set(cfg.frontend_modules) <= set(pool.cfg.frontend_modules))
        if same and not pipelined and not pool.pipelined and pool.tracing >= tracing:
            return pool  # workers past the tasks' count stay idle
        pool.stop()
        return None

    def close(self) -> None:
        for pool in self.pools.values():
            pool.stop()
        self.pools.clear()


@contextlib.contextmanager
def start_early(configs: list[WorkerConfig], tracing: int) -> Iterator[EarlyPools]:
    """Start one unpipelined pool of up to ``tracing`` workers per configuration (one per target), some of them now;
    stop whatever the run did not take when the block ends, the build failing included (no worker outlives it)."""
    early = EarlyPools()
    # Warm no more workers than the cores the planning import leaves, shared among the targets: before planning the
    # build does not know how many kernels there are, nor whether the build cache holds them all (a pool starts the
    # rest as tasks arrive, up to ``tracing``). On 2 cores: one, beside the planning import.
    warm = max(1, min(tracing, (cores() - 1) // max(1, len(configs))))
    try:
        for cfg in configs:
            early.pools[cfg.target] = start(early_config(cfg), tracing, pipelined=False, warm=warm)
        yield early
    finally:
        early.close()
