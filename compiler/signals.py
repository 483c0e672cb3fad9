"""How ``flyc-build`` (the program, :func:`flyship.compiler.cli.run`) takes SIGTERM and Ctrl-C.

* SIGTERM unwinds as Ctrl-C does (every layer handles KeyboardInterrupt: the pools are stopped, the scratch folder
  removed) and the program then exits 143 (128 + SIGTERM), as a shell reports a process that SIGTERM ended; Ctrl-C
  exits 1 ("Aborted!", click's word). A KeyboardInterrupt that reaches the program's top is reported in one line.
* Neither lands in the middle of a native library's import. A Python signal handler runs between bytecodes, so one
  that raises while torch's or FlyDSL's native modules are being imported raises inside code those modules call
  back (pybind11 turns it into a C++ exception that nothing catches: ``terminate called after throwing an instance
  of 'pybind11::error_already_set'``, SIGABRT, seen in torch.distributed's import), leaves a half-initialized
  extension module whose static state the exit handlers then touch (SIGSEGV), or is swallowed by the library (the
  build ran on and wrote its bundle): 5 of 36 runs in issue 32's trial, 3 of 80 in round 4's
  (scripts/sigterm_trial.py). So while a module of :data:`DEFERRED` executes, SIGTERM and SIGINT are blocked
  (``pthread_sigmask``) for the importing thread (its system calls are not interrupted) and taken by a thread of
  ours (:func:`install`; the kernel hands a process-directed signal to a thread that does not block it), whose C
  handler asks the main thread to run the Python handler between two bytecodes of the import; that handler does not
  raise there, nor wait for the import's end (torch and FlyDSL: 2.5 s idle, 8-10 s on a loaded 2-core machine,
  longer than a job scheduler waits after SIGTERM): it undoes what the build holds (:func:`on_abort`: its processes
  stopped, its scratch and staging folders removed, its lock file unlinked) and ends the process with 143 (Ctrl-C:
  1) without unwinding through the library or tearing it down. Elsewhere a :func:`deferred` block (the removal of a
  folder) holds a first signal and raises it at the block's end.
* A second Ctrl-C or SIGTERM, while the first still unwinds, ends the process at once and quietly (one line on
  stderr, no traceback): the workers die with it (``PR_SET_PDEATHSIG``), and the next build removes what is left
  (:func:`flyship.compiler.outlock.sweep_leftovers`).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

# Top-level packages whose imports load native libraries a signal must not interrupt (FlyDSL's MLIR bindings,
# Triton's libtriton). Their submodules are covered as they execute inside the package's import, or on their own.
DEFERRED = ("torch", "flydsl", "triton")
_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_received: list[int] = []  # the signals that ended the build, in order (empty: none)
_depth = [0]  # how many deferred blocks the main thread is in
_held = [False]  # a first signal arrived while the main thread was in one: raised when the outermost one ends
_importing = [0]  # how many native imports the main thread is in (:class:`_DeferringLoader`)
_abort_actions: list[Callable[[], None]] = []  # what a stop inside a native import undoes (:func:`on_abort`)
_stop_first: list[Callable[[], object]] = []  # before those: stop the build's processes (:func:`install`)


@contextlib.contextmanager
def deferred(_import: bool = False) -> Iterator[None]:
    """SIGTERM and SIGINT held back while the block runs, then delivered: blocked for this thread, and, in the main
    thread (where Python runs its handlers), recorded instead of raised when another thread took one; the outermost
    block's end raises it (module docstring). Inside a native import (``_import``) a first signal ends the process
    instead (:func:`on_abort`)."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    _depth[0] += main
    _importing[0] += main and _import
    try:
        yield
    finally:
        _importing[0] -= main and _import
        _depth[0] -= main
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # one pending for this thread is handled from here on
        if main and _depth[0] == 0 and _held[0]:
            _held[0] = False
            raise KeyboardInterrupt


@contextlib.contextmanager
def on_abort(action: Callable[[], None]) -> Iterator[None]:
    """While the block runs, ``action`` is part of what a signal inside a native import undoes before the process
    ends: the build cannot unwind from there (module docstring), and the import may take seconds (torch and FlyDSL:
    2.5 s idle, 8-10 s on a loaded 2-core machine), longer than a job scheduler waits after SIGTERM. Actions run
    newest first, each once; an action that raises is skipped."""
    _abort_actions.append(action)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            _abort_actions.remove(action)


def _abort(signum: int) -> None:
    """A first signal inside a native import: undo what the build holds (:func:`on_abort`), then end the process
    without unwinding through the half-imported library, nor tearing it down."""
    actions = [*_stop_first, *reversed(_abort_actions)]
    _abort_actions.clear()
    for action in actions:
        try:
            action()
        except Exception:  # noqa: BLE001 - one that fails must not keep the others from running
            pass
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        os.write(2, b"\nAborted!\n")  # click's word for a build Ctrl-C stopped, as the unwinding path says it
    os._exit(exit_status(1))


class _DeferringLoader(importlib.abc.Loader):
    """A module's own loader, its execution run with signals deferred."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        with deferred(_import=True):  # an extension module is loaded (dlopen, its init function) here
            return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with deferred(_import=True):
            self._inner.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, get_code...: the inner loader's
        return getattr(self._inner, name)


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """Finds modules of :data:`DEFERRED` packages through the other finders and wraps their loaders."""

    def __init__(self, packages: Sequence[str]) -> None:
        self._packages = tuple(packages)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if name.partition(".")[0] not in self._packages:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _DeferringLoader):
                    spec.loader = _DeferringLoader(spec.loader)
                return spec
        return None


_unwinding = [True]  # False once the build is over (:func:`finishing`): a signal then only sets the exit status


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM, or Ctrl-C: the first unwinds as Ctrl-C does; a second exits now (module docstring)."""
    _received.append(signum)
    if len(_received) == 1 and not _unwinding[0]:
        return  # the build is over and its exit is under way: only the status changes
    if len(_received) == 1 and _importing[0]:
        _abort(signum)
    if len(_received) == 1 and _depth[0]:
        _held[0] = True  # the main thread is inside a deferred block: raised when it ends (:func:`deferred`)
        return
    if len(_received) > 1:
        name = signal.Signals(signum).name
        try:
            os.write(2, f"\nflyc-build: {name} again while stopping: exiting now (the next build removes what this "
                        "one leaves)\n".encode())
        except OSError:
            pass
        os._exit(exit_status(1))
    raise KeyboardInterrupt


def _catch() -> None:
    """A thread that takes SIGTERM and SIGINT for the process while the main thread blocks them (module docstring)."""
    threading.Event().wait()


def install(packages: Sequence[str] = DEFERRED, stop_processes: Optional[Callable[[], object]] = None) -> None:
    """For the flyc-build program only (never a process that calls build() as a library): the SIGTERM and SIGINT
    handlers above, the deferral of native imports, and a thread to take the signals meanwhile (started before any
    native import: a thread starts with its creator's signal mask, so one torch starts inside its deferred import
    blocks them too). ``stop_processes``: what a stop inside a native import does first, before the build's own
    undoing (:func:`on_abort`), so that no process it started writes into what is being removed."""
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, _terminated)
    _stop_first[:] = [stop_processes] if stop_processes is not None else []
    if not any(t.name == "flyship-signals" for t in threading.enumerate()):
        threading.Thread(target=_catch, name="flyship-signals", daemon=True).start()
    if not any(isinstance(f, _DeferringFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferringFinder(packages))


def finishing() -> None:
    """The build is over (the command returned): from now on a first SIGTERM or Ctrl-C no longer raises (the exit
    handlers and the end-of-build sweep run to their end), it only makes the exit status 143; a second still exits
    at once."""
    _unwinding[0] = False


def exit_status(status: int) -> int:
    """The program's exit status: 143 (128 + SIGTERM) when SIGTERM ended the build, else ``status`` (Ctrl-C: 1, as
    click reports an abort)."""
    return 128 + signal.SIGTERM if _received and _received[0] == signal.SIGTERM else status


def interrupted() -> bool:
    return bool(_received)
