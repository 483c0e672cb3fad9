"""Worker processes: each builds variants for one target, with that target's environment set first.

FlyDSL kernels often fix arch-dependent constants at import time, and kernel code that asks for the
arch falls back to gfx942 silently when no GPU answers, so each target gets its own spawned
processes with ``FLYDSL_GPU_ARCH`` set before the spec file (and FlyDSL) is imported.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import importlib
import importlib.util
import multiprocessing.util
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Optional

from flyship.bundle import targets as _targets
from flyship.compiler import frontends
from flyship.compiler.frontends import BuildContext, CompiledVariant, WorkerSetup
from flyship.compiler.frontends.base import DSLError, FrontendError, ResourceError
from flyship.compiler.hygiene import adopt_orphans, die_with_parent, end_process
from flyship.compiler.spec import SpecError, SpecFile, run_spec_file
from flyship.errors import CompileError, FlyshipError, headline, traceback_text


SPEC_IMPORT = "SpecImportError"  # the kind of the CompileError of a spec file that could not be imported


class TraceSlots:
    """At most ``count`` of a pool's workers trace at once: each slot is a lock file (``flock``), held while a DSL
    traces (:attr:`BuildContext.trace_slot`). Picklable (it is the folder's path), so it crosses to the workers.

    Not a ``multiprocessing`` semaphore: a worker that dies in the DSL's native code while it holds a semaphore
    never gives it back, and the other workers wait for it forever. CPython's ``ProcessPoolExecutor`` does not
    always notice such a death either (3.11: a worker spawned by ``submit`` after the manager thread took its
    list of worker sentinels is not watched until some result arrives), so the build hung with no result to
    come. The kernel releases a dead process's ``flock``, so the others go on, their results arrive, and the
    pool then sees the dead worker (its task is rerun alone and reported).
    """

    POLL_S = 0.02  # between rounds of trying every slot, while all are held

    def __init__(self, folder: Path | str, count: int) -> None:
        self.paths = tuple(str(Path(folder) / f"trace-slot-{k}.lock") for k in range(count))
        for path in self.paths:
            Path(path).touch()
        self._fd: Optional[int] = None

    def __getstate__(self) -> dict:
        return {"paths": self.paths, "_fd": None}

    def __enter__(self) -> "TraceSlots":
        while True:
            for path in self.paths:
                fd = os.open(path, os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._fd = fd
                return self
            time.sleep(self.POLL_S)

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file releases its flock


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs (picklable)."""

    spec_path: str
    target: str
    rocm_root: Optional[str]
    toolchain: object
    code_object_version: Optional[int]
    keep_ir: bool
    scratch_root: str
    frontends: tuple[str, ...] = ()
    parent_pid: int = 0
    frontend_modules: tuple[str, ...] = ()  # imported first: they register frontends defined outside the registry


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """One (op, spec, target) task's outcome: the variant, or the error as text (``<kind>: <message>``, and the
    traceback text of an unexpected exception, a bug, which would not cross the process boundary otherwise).

    ``reused`` says the worker had run other tasks before this one: a failure there may come from a DSL's
    process-global state left by an earlier trace, so the parent retries it once in a fresh process, unless
    it is ``deterministic`` (flyship's own check refused the declaration: the same answer in any process)."""

    op: str
    spec: str
    target: str
    variant: Optional[CompiledVariant]
    error: Optional[str]
    reused: bool = False
    resource: bool = False  # the error is a target resource limit (frontends.base.ResourceError)
    deterministic: bool = False  # flyship's own check refused it (SpecError, FrontendError but DSLError): no retry
    traceback: Optional[str] = None  # the error was not a flyship error but a bug: its traceback, for the report


_SPEC: Optional[SpecFile] = None
_CFG: Optional[WorkerConfig] = None
_TASKS_RUN = 0  # tasks this worker process has started (a reused worker has run one before)
_TRACE_SLOTS = None  # the pool's TraceSlots: how many of its workers may trace at once (executors.run_tasks)
_SPEC_ERROR: Optional[tuple[str, Optional[str]]] = None  # why the spec file did not load here: (text, traceback)


def _bug_traceback(e: BaseException) -> Optional[str]:
    """The traceback text of ``e`` when it is a bug (not a flyship error), else None (errors.py's policy)."""
    return None if isinstance(e, FlyshipError) else traceback_text(e)


def load_spec_file(path: str) -> SpecFile:
    """Execute a spec file (its folder first on ``sys.path`` so it can import its kernels).

    Raises:
        flyship.compiler.spec.SpecError: the file declares nothing usable.
        CompileError (kind :data:`SPEC_IMPORT`): the file raised while importing; the message carries its
            traceback tail.
    """
    p = Path(path).resolve()
    if not p.is_file():
        raise CompileError(f"spec file: expected a Python file, got {path!r} (no such file)", kind=SPEC_IMPORT)
    sys.path.insert(0, str(p.parent))
    name = f"flyship_spec_{abs(hash(str(p)))}"

    def run() -> None:
        spec = importlib.util.spec_from_file_location(name, p)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except KeyboardInterrupt:
            raise
        except Exception as e:
            if isinstance(e, SpecError):
                raise
            missing = (e.name or "").split(".")[0] if isinstance(e, ModuleNotFoundError) else ""
            fe = next((fe for fe in frontends.registered() if missing in fe.packages), None) if missing else None
            if fe is not None:
                raise CompileError(f"flyc-build {path}: expected a Python with {missing} (the spec file imports "
                                   f"it), got {sys.executable}, which has none; {fe.install_hint}",
                                   kind=SPEC_IMPORT) from None
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])
            raise CompileError(f"spec file {path} failed to import: {type(e).__name__}: {e}\n{tb}",
                               kind=SPEC_IMPORT) from None
        except BaseException as e:  # pytest.skip(), sys.exit(), GeneratorExit: not an error of the code, one line
            kind = f"{type(e).__module__}.{type(e).__qualname__}".removeprefix("builtins.")
            raise CompileError(
                f"spec file {path}: expected the import to declare ops, got {kind}({str(e)!r}) raised at import "
                "(a BaseException such as pytest.skip() or sys.exit() stops it); remove that call from the spec "
                "file, or guard it so flyc-build's import runs through", kind=SPEC_IMPORT) from None

    return run_spec_file(str(p), run)


def init_worker(cfg: WorkerConfig, trace_slots: object = None) -> None:
    """Process initializer: each frontend that builds for this target prepares the environment, then the
    spec file is imported. ``trace_slots``: the pool's :class:`TraceSlots`, one held while a DSL traces
    (:attr:`BuildContext.trace_slot`), or None for no limit."""
    global _SPEC, _CFG, _SPEC_ERROR, _TRACE_SLOTS
    _CFG = cfg
    _TRACE_SLOTS = trace_slots
    if cfg.parent_pid:  # a local pool's worker (a Ray worker is Ray's process, left as Ray runs it)
        die_with_parent(cfg.parent_pid)  # first: a worker never outlives the build (kill -9 included)
        adopt_orphans()  # nor does a process the spec file starts in it and detaches
        # What the worker's libraries and tools leave in the temp folder (FlyDSL's linker files when the worker is
        # killed mid-link, a spec file's own) goes into the build's scratch folder: removed when the build ends, and
        # by the next build when this one was killed (hygiene.scratch_dir).
        tmp = Path(cfg.scratch_root) / f"tmp.{os.getpid()}"
        tmp.mkdir(exist_ok=True)
        os.environ["TMPDIR"] = str(tmp)
        tempfile.tempdir = None
        # Once the pool is done with this worker, multiprocessing runs its finalizers, then joins the processes and
        # the threads (not daemons) the worker started: one the spec file started and never ends would keep the
        # worker, and the build, waiting. This finalizer (the last of priority >= 0) ends the worker before those.
        multiprocessing.util.Finalize(None, _end_worker, exitpriority=0)
    # Ctrl-C reaches the whole process group: the build process decides (it stops the pools), so a worker neither
    # dies mid-import with a traceback of its own nor leaves its task half done on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A process starts with its parent thread's signal mask: one spawned while the build deferred signals
    # (compiler/signals.py) must still take SIGTERM.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    atexit.register(_exit_now)
    setup = WorkerSetup(target=cfg.target, scratch_root=Path(cfg.scratch_root),
                        rocm_root=Path(cfg.rocm_root) if cfg.rocm_root else None)
    vendor = _targets.parse_target(cfg.target).vendor
    for module in cfg.frontend_modules:
        importlib.import_module(module)
    for name in cfg.frontends:
        fe = frontends.get(name)
        if vendor in fe.vendors:
            fe.prepare_worker(setup)
    try:
        _SPEC = load_spec_file(cfg.spec_path)
    except Exception as e:  # reported per task
        _SPEC = None
        _SPEC_ERROR = (headline(e), _bug_traceback(e))


def warm_up() -> None:
    """A task that does nothing: submitted to a pool to start a worker now (its initializer imports the spec file),
    before the build has tasks for it (:mod:`flyship.compiler.pools`)."""


def _end_worker() -> None:
    """The worker's end, as multiprocessing's last finalizer (before it joins the threads): every exit handler, the
    last of them :func:`_exit_now`; where this Python has no way to run them here, the ordinary exit."""
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is not None:
        run_exit_handlers()
        end_process(0)  # reached only if an exit handler unregistered _exit_now


def _exit_now() -> None:
    """The worker's last exit step: once every exit handler registered after it (the DSLs', the libraries') has
    run, end the process without tearing down its modules: a worker that imported torch and a DSL spent ~0.7 s
    of the build's wall time in interpreter teardown that nothing reads (the pool waits for it)."""
    end_process(0)


def run_task(op_name: str, spec_name: str) -> TaskResult:
    """Compile one (op, specialization) for this worker's target. Errors come back as text."""
    global _TASKS_RUN
    cfg = _CFG
    assert cfg is not None
    reused = _TASKS_RUN > 0
    _TASKS_RUN += 1
    if _SPEC is None:
        text, tb = _SPEC_ERROR or ("spec not loaded", None)
        return TaskResult(op_name, spec_name, cfg.target, None, text, traceback=tb)
    try:
        op = next((o for o in _SPEC.ops if o.name == op_name), None)
        decl = next((s for s in op.specs if s.name == spec_name), None) if op is not None else None
        if decl is None:
            raise CompileError(f"spec file {cfg.spec_path}: expected op {op_name} spec {spec_name} when imported for "
                               f"{cfg.target}, as when the build planned it, got none; the spec file declares other "
                               "ops or specs on each import for this target: make its declarations depend only on "
                               "the target (FLYDSL_GPU_ARCH), not on other state")
        spec = decl.for_target(cfg.target)
        op = op.for_target(cfg.target)  # each output's dtype on this target (Output(per_target=...))
        workdir = Path(tempfile.mkdtemp(prefix=f"{op_name}.{spec_name}.", dir=cfg.scratch_root))
        slot = _TRACE_SLOTS if _TRACE_SLOTS is not None else contextlib.nullcontext()
        ctx = BuildContext(workdir=workdir, toolchain=cfg.toolchain, code_object_version=cfg.code_object_version,
                           keep_ir=cfg.keep_ir, rocm_root=Path(cfg.rocm_root) if cfg.rocm_root else None,
                           trace_slot=lambda: slot)
        fe = frontends.get(op.frontend)
        with contextlib.nullcontext() if fe.pipelined else slot:  # else the slot is held throughout
            v = frontends.compile_variant(fe, op, spec, cfg.target, ctx)
        return TaskResult(op_name, spec_name, cfg.target, v, None, reused)
    except Exception as e:
        return TaskResult(op_name, spec_name, cfg.target, None, headline(e), reused,
                          resource=isinstance(e, ResourceError),
                          deterministic=isinstance(e, (SpecError, FrontendError)) and not isinstance(e, DSLError),
                          traceback=_bug_traceback(e))
