"""Where compile tasks run: process pools on this machine (the default) or a Ray cluster.

Both take the same (op, specialization, target) tasks and return the same
:class:`~flyship.compiler.worker.TaskResult` list: a kernel that fails to compile, and a worker that dies
while compiling one, come back as a result with an error text naming it, so the build reports every
failure the same way whichever executor ran it.

Ray (``flyc-build --executor ray[:ADDRESS]``; ``pip install 'flyship[ray]'``): each task is a Ray task of
one CPU in a worker process of the cluster's Python, which must have FlyDSL/Triton and flyship (the same
image on every node, as with any Ray job). Each target gets its own runtime environment (``env_vars``:
what each frontend's DSL reads the target from at import (``Frontend.target_environment``: FlyDSL's
``FLYDSL_GPU_ARCH``/``ARCH``) and the DSL variables of the submitting shell, plus a build id), so a worker
process only ever serves one target of one build: FlyDSL modules that fix arch constants at import, and
user modules edited between two builds, cannot leak into another build. The compiled variant travels back
as the task's return value; nothing is read from a shared disk. The spec file and the user's kernel
modules are read at the same absolute path on every node (a shared checkout or image); see docs/scale.md.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from flyship.bundle import targets as _targets
from flyship.compiler import cache as _cache
from flyship.compiler import frontends as _frontends
from flyship.compiler import hygiene
from flyship.compiler import toolchain as _tc
from flyship.compiler import pools as _pools
from flyship.compiler.worker import TaskResult, WorkerConfig, init_worker, run_task, warm_up
from flyship.errors import CompileError


def check_executor(spec: str) -> None:
    """``local`` or ``ray[:ADDRESS]``; for Ray, the package must import.

    Raises:
        CompileError: naming what was given and what is accepted.
    """
    kind, _, address = spec.partition(":")
    if kind not in ("local", "ray"):
        raise CompileError(f"flyc-build --executor: expected 'local' or 'ray[:ADDRESS]', got {spec!r}")
    if kind == "ray":
        if address:
            _check_reachable(spec, address)
        elif not os.environ.get("RAY_ADDRESS"):  # a private instance on this machine: keep it on loopback
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            import ray  # noqa: F401
        except ImportError:
            raise CompileError("flyc-build --executor ray: the ray package is not installed in this Python; "
                                "pip install ray (flyship's ray extra) here and on the cluster") from None


_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _check_reachable(spec: str, address: str) -> None:
    """Fail fast, with what to do, when nothing listens at HOST:PORT (Ray itself retries for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise CompileError(f"flyc-build --executor {spec}: expected ray:HOST:PORT (the head's GCS address, "
                            f"e.g. ray:10.0.0.5:6379), got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise CompileError(f"flyc-build --executor {spec}: expected a Ray head listening at {address}, got "
                            f"{e.strerror or e}; start one with `ray start --head --port {port}` or fix the address"
                            ) from None
    if host in _LOOPBACK:
        # A cluster on this machine's loopback: keep Ray on loopback (by default it swaps 127.0.0.1 for the
        # machine's outward address). Read by ray when it is imported, so set before that.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def run(tasks: list[tuple[str, str, str]], opts: Any, toolchain: object, rocm_root: Optional[Path], scratch: Path,
        progress: Callable[[str], None], frontends: tuple[str, ...],
        early: Optional[_pools.EarlyPools] = None) -> list[TaskResult]:
    """Run ``tasks`` on the executor ``opts.executor`` names; one result per task. ``early``: the local pools
    :func:`early_pools` started before planning, taken where they fit."""
    kind, _, address = opts.executor.partition(":")
    if kind == "ray":
        return run_ray(tasks, opts, toolchain, rocm_root, scratch, progress, address or None, frontends)
    return run_tasks(tasks, opts, toolchain, rocm_root, scratch, progress, frontends, early)


def tracing_per_pool(opts: Any, targets: int) -> int:
    """Workers of each target's pool that may trace at once: ``-j`` shared among the targets, at least one."""
    return max(1, opts.jobs // max(1, targets))


def early_pools(opts: Any, targets: list[str], toolchain: object, rocm_root: Optional[Path],
                scratch: Path) -> contextlib.AbstractContextManager[Optional[_pools.EarlyPools]]:
    """Local pools started before the build reads its declarations (:mod:`flyship.compiler.pools`), so the
    workers' imports overlap the build's own; nothing for Ray (its workers start with the cluster)."""
    if opts.executor.partition(":")[0] != "local":
        return contextlib.nullcontext()
    configs = [worker_config(opts, t, toolchain, rocm_root, scratch, ()) for t in targets]
    return _pools.start_early(configs, tracing_per_pool(opts, len(targets)))


def worker_config(opts: Any, target: str, toolchain: object, rocm_root: Optional[Path], scratch: Path,
                   frontends: tuple[str, ...]) -> WorkerConfig:
    """What each worker of ``target`` is told (picklable: it crosses to the worker process)."""
    return WorkerConfig(spec_path=str(Path(opts.spec_path).resolve()), target=target,
                        rocm_root=str(rocm_root) if rocm_root else None, toolchain=toolchain,
                        code_object_version=opts.code_object_version, keep_ir=opts.keep_ir,
                        scratch_root=str(scratch), frontends=frontends, parent_pid=os.getpid(),
                        frontend_modules=tuple(_frontends.origin(f) for f in frontends))


def run_tasks(tasks: list[tuple[str, str, str]], opts: Any, toolchain: object, rocm_root: Optional[Path],
              scratch: Path, progress: Callable[[str], None], frontends: tuple[str, ...],
              early: Optional[_pools.EarlyPools] = None) -> list[TaskResult]:
    """Run the tasks in spawned worker processes, one pool per target (the early pool of a target where it fits);
    report each as it ends."""
    by_target: dict[str, list[tuple[str, str]]] = {}
    for o, s, t in tasks:
        by_target.setdefault(t, []).append((o, s))
    per_pool = tracing_per_pool(opts, len(by_target))
    ctx = multiprocessing.get_context("spawn")
    pools: list[_pools.Pool] = []
    futures: dict[cf.Future, tuple[str, str, str]] = {}
    results: list[TaskResult] = []
    broken: list[tuple[str, str, str]] = []
    failed = True
    try:
        for target, items in by_target.items():
            cfg = worker_config(opts, target, toolchain, rocm_root, scratch, frontends)
            tracing, pipelined = min(per_pool, len(items)), _pools.pipelines(len(items), per_pool, len(by_target))
            pool = (early.take(cfg, tracing, pipelined) if early is not None else None) \
                or _pools.start(cfg, tracing, pipelined)
            pools.append(pool)
            try:
                for o, s in items:
                    futures[pool.executor.submit(run_task, o, s)] = (o, s, target)
            except cf.process.BrokenProcessPool:  # a worker died importing the spec file: each task alone says so
                submitted = {(fo, fs) for fo, fs, ft in futures.values() if ft == target}
                broken.extend((o, s, target) for o, s in items if (o, s) not in submitted)
        done = 0
        retry: list[tuple[str, str, str, Optional[str]]] = []
        for fut in _as_completed(futures, progress):
            o, s, t = futures[fut]
            try:
                r = fut.result()
            except cf.process.BrokenProcessPool:
                # A worker died (an abort inside the DSL's native code takes its whole pool down); which
                # task did it is found below, by running each of that pool's unfinished tasks alone.
                broken.append((o, s, t))
                continue
            if r.variant is None and r.reused and not r.resource and not r.deterministic:
                # Over a limit, or refused by flyship's own check (a SpecError, a FrontendError other than the
                # DSL's own failure), is the same answer in any process: no retry, reported once.
                # Some DSL kernels keep process-global state and cannot be traced twice in one process: a
                # failure in a reused worker is retried once in a fresh one (below) before it counts, so
                # -j 1 and -j 2 give the same bundle.
                retry.append((o, s, t, r.error))
                continue
            done += 1
            results.append(r)
            status = f"{r.variant.seconds:5.1f}s" if r.variant else "FAILED"
            progress(f"[{done}/{len(tasks)}] {t:<8} {o}.{s}  {status}")
        failed = False
    finally:
        for p in pools:
            p.shutdown(failed, progress)
    for o, s, t, first in retry:
        r = _run_alone(o, s, worker_config(opts, t, toolchain, rocm_root, scratch, frontends), ctx)
        if r.variant is None:
            r = dataclasses.replace(r, error=r.error if r.error == first else
                                    f"{r.error} (in a fresh process; in a reused worker it failed first with: {first})")
        done += 1
        results.append(r)
        status = f"{r.variant.seconds:5.1f}s" if r.variant else "FAILED"
        progress(f"[{done}/{len(tasks)}] {t:<8} {o}.{s}  {status} (retried in a fresh process after failing in "
                 "a reused worker)")
    for o, s, t in broken:
        r = _run_alone(o, s, worker_config(opts, t, toolchain, rocm_root, scratch, frontends), ctx)
        done += 1
        results.append(r)
        status = f"{r.variant.seconds:5.1f}s" if r.variant else "FAILED"
        progress(f"[{done}/{len(tasks)}] {t:<8} {o}.{s}  {status} (rerun in its own process)")
    return results


# Seconds without a finished kernel after which the build says what it still waits for (again each time as long).
STALL_NOTICE_S = 120.0


def _as_completed(futures: dict[cf.Future, tuple[str, str, str]],
                  progress: Callable[[str], None]) -> Iterator[cf.Future]:
    """``cf.as_completed(futures)``, saying so each :data:`STALL_NOTICE_S` seconds that none finishes: a spec file
    whose import never ends in a worker, or a kernel whose trace never ends, shows as what it is, not as silence."""
    pending, quiet = set(futures), 0.0
    while pending:
        finished, pending = cf.wait(pending, timeout=STALL_NOTICE_S, return_when=cf.FIRST_COMPLETED)
        if finished:
            quiet = 0.0
            yield from finished
            continue
        quiet += STALL_NOTICE_S
        waiting = sorted(f"{o}.{s} ({t})" for o, s, t in (futures[f] for f in pending))
        progress(f"flyc-build: no kernel has finished for {quiet:g} s; {len(waiting)} to come: "
                 f"{', '.join(waiting[:8])}{', ...' if len(waiting) > 8 else ''}. A worker is importing the spec file "
                 "or tracing a kernel: one that never ends (a loop, a wait at import in the workers) keeps the build "
                 "here; Ctrl-C stops it")


_STDERR_TAIL = 4000  # characters of a dead worker's own stderr quoted in its error


def _init_alone(cfg: WorkerConfig, err_path: str) -> None:
    """A lone worker writes its stderr (fd 2, native code included) to ``err_path``, so a crash's own message
    (``LLVM ERROR: ...``) reaches the report instead of being lost with the process."""
    fd = os.open(err_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)
    hygiene.set_stderr_file(err_path)  # a step that moves fd 2 writes beside it (hygiene.step_stderr_file)
    init_worker(cfg)


def _run_alone(o: str, s: str, cfg: WorkerConfig, ctx) -> TaskResult:
    """One task in a process of its own, so a crash is pinned on the kernel that caused it; what the process
    wrote to stderr is passed on to ours and, when it died, quoted in the error."""
    with tempfile.NamedTemporaryFile(prefix="flyship-worker-", suffix=".stderr", dir=cfg.scratch_root,
                                     delete=False) as f:
        err_path = f.name
    try:
        pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_init_alone, initargs=(cfg, err_path))
        try:
            importing = True
            warm = pool.submit(warm_up)  # the worker starts now and imports the spec file before it returns
            process = next(iter(getattr(pool, "_processes", {}).values()), None)  # for its exit status
            try:
                warm.result()
                importing = False
                return pool.submit(run_task, o, s).result()
            except cf.process.BrokenProcessPool:
                # What the process printed, then what a step that had moved fd 2 printed before it died (FlyDSL's
                # binary step: LLVM's "LLVM ERROR: ..." before an abort).
                step = err_path + hygiene.STEP_SUFFIX
                tail = "\n".join(t for t in (_tail(err_path), _tail(step)) if t)[-_STDERR_TAIL:]
                err_path = _unlinked(err_path) or _unlinked(step)
                said = (f"; it printed:\n{tail}" if tail else "; it printed nothing on stderr")
                what = ("importing the spec file, before any kernel (the spec file or a module it imports ended "
                        "the process" if importing else
                        "compiling this kernel (a crash or abort in the DSL's native code")
                return TaskResult(o, s, cfg.target, None,
                                  f"the worker process died while {what}{_exit_status(process)}){said}")
        except BaseException:  # Ctrl-C, SIGTERM: the worker is stopped where it is
            _pools.kill(pool)
            raise
        finally:
            _pools.close(pool, f"{cfg.target} worker", lambda line: print(line, file=sys.stderr))
    finally:
        if err_path:  # a worker that lived: its stderr goes on to ours, as a pool worker's would
            tail = _tail(err_path)
            if tail:
                print(tail, file=sys.stderr)
            _unlinked(err_path)
            _unlinked(err_path + hygiene.STEP_SUFFIX)


def _exit_status(process: Any) -> str:
    """``; exit code 3`` or ``; killed by SIGSEGV`` for a dead worker process, or '' when it cannot be read."""
    try:
        process.join(1)
        code = process.exitcode
        # The pool's manager thread may have reaped it first (our join then reads nothing): its join records the
        # exit code on the same object a moment later.
        for _ in range(50):
            if code is not None:
                break
            time.sleep(0.02)
            code = process.exitcode
    except Exception:  # noqa: BLE001 - no process object (another Python's pool): say nothing of it
        return ""
    if code is None:
        return ""
    if code < 0:
        try:
            return f"; killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"; killed by signal {-code}"
    return f"; exit code {code}"


def _unlinked(path: str) -> str:
    with contextlib.suppress(OSError):
        os.unlink(path)
    return ""


def _tail(path: str) -> str:
    """The last ``_STDERR_TAIL`` characters of a worker's stderr file (read bounded)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _STDERR_TAIL))
            return f.read(_STDERR_TAIL).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def target_environment(target: str, build_id: str) -> dict[str, str]:
    """The environment a Ray worker process of ``target`` starts with (its runtime_env ``env_vars``)."""
    env = dict(_cache.dsl_environment())
    tid = _targets.parse_target(target)
    for fe in _frontends.registered():  # what each DSL of the target's vendor reads at import (FlyDSL: the arch)
        if tid.vendor in fe.vendors:
            env.update(fe.target_environment(tid))
    env["FLYSHIP_BUILD_ID"] = build_id
    return env


def run_ray(tasks: list[tuple[str, str, str]], opts: Any, toolchain: object, rocm_root: Optional[Path], scratch: Path,
            progress: Callable[[str], None], address: Optional[str], frontends: tuple[str, ...]) -> list[TaskResult]:
    """Run the tasks as Ray tasks on the cluster at ``address`` (None: ``RAY_ADDRESS`` or a local instance)."""
    import ray  # optional: pip install 'flyship[ray]' (check_executor said so before the build started)

    started_here = False
    try:
        if not ray.is_initialized():
            kw: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
            if address is None and not os.environ.get("RAY_ADDRESS"):
                kw.update(num_cpus=opts.jobs, include_dashboard=False)  # a private instance for this build
            if (address or "").rpartition(":")[0] in _LOOPBACK:  # a cluster on loopback: this node is there too
                kw["_node_ip_address"] = "127.0.0.1"
            ray.init(address=address, **kw)
            started_here = True
    except Exception as e:  # ConnectionError, RuntimeError, ValueError: each says what was wrong with the address
        raise CompileError(f"flyc-build --executor {opts.executor}: cannot reach a Ray cluster ({type(e).__name__}: "
                            f"{e}); start one with `ray start --head` or give its address as ray:HOST:PORT") from None
    try:
        build_id = uuid.uuid4().hex
        remote = ray.remote(_compile_on_worker)
        pending: dict[Any, tuple[str, str, str]] = {}
        for o, s, t in tasks:
            cfg = worker_config(opts, t, toolchain, rocm_root, scratch, frontends)
            ref = remote.options(num_cpus=1, max_retries=0,
                                 runtime_env={"env_vars": target_environment(t, build_id)}).remote(cfg, o, s)
            pending[ref] = (o, s, t)
        results: list[TaskResult] = []
        total = len(pending)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                o, s, t = pending.pop(ref)
                try:
                    r = ray.get(ref)
                except ray.exceptions.WorkerCrashedError:
                    r = TaskResult(o, s, t, None, "the Ray worker process died while compiling this kernel (a crash or "
                                                  "abort in the DSL's native code; its own message, if any, is above)")
                except ray.exceptions.RayError as e:
                    # a task that raised (outside run_task's own catch: a bug) carries the remote traceback in its text
                    tb = str(e) if isinstance(e, ray.exceptions.RayTaskError) else None
                    r = TaskResult(o, s, t, None, f"Ray task failed: {type(e).__name__}: {str(e).splitlines()[0]}",
                                   traceback=tb)
                results.append(r)
                status = f"{r.variant.seconds:5.1f}s" if r.variant else "FAILED"
                progress(f"[{len(results)}/{total}] {t:<8} {o}.{s}  {status} (ray)")
        return results
    finally:
        if started_here:
            ray.shutdown()


# --- inside a Ray worker process -----------------------------------------------------------------

_WORKER_CFG: Optional[WorkerConfig] = None
_WORKER_STACK = contextlib.ExitStack()
atexit.register(_WORKER_STACK.close)


def _compile_on_worker(cfg: WorkerConfig, op_name: str, spec_name: str) -> TaskResult:
    """One task in a Ray worker: the first task of a process sets it up for its target (as the local pool's
    initializer does), making its own scratch and ROCm-shaped folder when the submitting machine's paths do
    not exist here."""
    global _WORKER_CFG
    if _WORKER_CFG != cfg:
        local = _replace(cfg, parent_pid=0)  # the worker process is Ray's, not a child of flyc-build
        if not Path(cfg.scratch_root).is_dir():
            local = _replace(local, scratch_root=_WORKER_STACK.enter_context(
                tempfile.TemporaryDirectory(prefix="flyc-ray-")))
        if cfg.rocm_root and not Path(cfg.rocm_root).is_dir():
            local = _replace(local, rocm_root=str(_WORKER_STACK.enter_context(_tc.rocm_root(cfg.toolchain))))
        init_worker(local)
        _WORKER_CFG = cfg
    return run_task(op_name, spec_name)


def _replace(cfg: WorkerConfig, **kw: Any) -> WorkerConfig:
    return dataclasses.replace(cfg, **kw)
